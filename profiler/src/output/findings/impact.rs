//! The cost as the service feels it: would removing a finding's wait give back throughput,
//! or only change when work runs (latency)? A thread that stops waiting for the lock can only
//! do more work if a CPU is free for it. So the answer is read from the process's own CPU
//! use: its threads' CPU time against the CPUs it may use (its affinity, its cgroup's
//! quota), and the time its runnable threads spent waiting for a CPU (the scheduler's
//! run-queue delay, `sched_info.run_delay`). Where its CPUs were saturated, the wait cost
//! nothing it could have used: the waiting threads' CPUs ran its other threads meanwhile,
//! and a thread freed from the lock would have queued for a CPU instead (docs/findings.md,
//! "Throughput or latency").

use serde::{Deserialize, Serialize};

use crate::output::{
    report::{ProcessReport, Report},
    text::{fmt_ns, fmt_share},
};

/// Whether removing a wait gives back throughput or only latency.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ImpactKind {
    /// The process's CPUs had room: the time its threads waited could have been work.
    Throughput,
    /// Its CPUs were saturated: removing the wait reorders work, it adds none.
    Latency,
}

/// What removing a finding's wait would give back, and what that rests on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Impact {
    pub kind: ImpactKind,
    /// At most this much more work per second (0.05: +5%): the wait that CPUs could have
    /// turned into work, over the CPU time the process used.
    pub throughput_gain: f64,
    /// The process's threads' CPU time in the run, ns.
    pub cpu_ns: u64,
    /// Their run-queue delay (runnable, waiting for a CPU), ns; absent where the kernel
    /// keeps none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued_ns: Option<u64>,
    /// The CPUs the process may use (its affinity, or its cgroup's quota if lower), when
    /// known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    /// Its CPU time over what those CPUs could give in the run, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_use: Option<f64>,
}

/// Its runnable threads waited for a CPU this share of their runnable time, or more: they
/// outnumbered the CPUs they could use most of the time.
pub const SATURATED_QUEUED: f64 = 0.25;
/// Or it used this share of the CPUs it may use, or more.
pub const SATURATED_USE: f64 = 0.9;

/// The process's CPU figures over the run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CpuFigures {
    pub cpu_ns: u64,
    pub queued_ns: Option<u64>,
    pub cpus: Option<f64>,
    pub duration_ns: Option<u64>,
}

impl CpuFigures {
    /// A process's, from its report; None without its CPU time.
    pub fn of(s: &Report, p: &ProcessReport) -> Option<CpuFigures> {
        let share = p.time_share.as_ref()?;
        let cpu_ns = share.cpu_ns.filter(|&c| c > 0)?;
        Some(CpuFigures {
            cpu_ns,
            queued_ns: share.queued_ns,
            cpus: p.cpus.as_ref().map(|c| c.usable()),
            duration_ns: s.duration_s.map(|d| (d * 1e9) as u64),
        })
    }

    /// The share of its runnable time its threads spent waiting for a CPU.
    pub fn queued_share(&self) -> Option<f64> {
        let q = self.queued_ns? as f64;
        Some(q / (q + self.cpu_ns as f64))
    }

    /// Its CPU time over what the CPUs it may use could give in the run.
    pub fn cpu_use(&self) -> Option<f64> {
        let cap = self.cpus? * self.duration_ns? as f64;
        (cap > 0.0).then(|| self.cpu_ns as f64 / cap)
    }

    /// CPU time its CPUs left unused in the run, ns, when known.
    fn idle_ns(&self) -> Option<f64> {
        Some((self.cpus? * self.duration_ns? as f64 - self.cpu_ns as f64).max(0.0))
    }

    pub fn saturated(&self) -> Option<bool> {
        let queued = self.queued_share().map(|q| q >= SATURATED_QUEUED);
        let used = self.cpu_use().map(|u| u >= SATURATED_USE);
        match (queued, used) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(false) || b.unwrap_or(false)),
        }
    }

    /// What removing `wait_ns` of the process's threads' wait would give back, and
    /// `held_ns`, the time the writes behind it held the lock, when measured (the CPU
    /// removing them would save). None when neither the run-queue delay nor the CPUs it may
    /// use are known.
    ///
    /// On CPUs with room, the waiting threads' work goes on instead of waiting: the process
    /// does its work in its CPU time plus that wait, so removing the wait gives back at most
    /// `wait / cpu` more work per second (all of it when the wait is on every request's
    /// path, less where other waits, I/O, sit beside it), and no more than its CPUs' room.
    /// On saturated CPUs the waiting threads' CPUs ran its other threads meanwhile, and a
    /// thread freed from the lock would queue for a CPU instead: what is given back is the
    /// CPU the writes themselves took (their holds), no more.
    pub fn impact(&self, wait_ns: f64, held_ns: Option<u64>) -> Option<Impact> {
        let saturated = self.saturated()?;
        let cpu = self.cpu_ns as f64;
        let gain = if saturated {
            held_ns.unwrap_or(0) as f64 / cpu
        } else {
            let mut g = wait_ns / cpu;
            if let Some(idle) = self.idle_ns() {
                g = g.min(idle / cpu);
            }
            g
        };
        Some(Impact {
            kind: if saturated {
                ImpactKind::Latency
            } else {
                ImpactKind::Throughput
            },
            throughput_gain: (gain * 1e4).round() / 1e4,
            cpu_ns: self.cpu_ns,
            queued_ns: self.queued_ns,
            cpus: self.cpus,
            cpu_use: self.cpu_use().map(|u| (u * 1e4).round() / 1e4),
        })
    }
}

impl Impact {
    /// What the CPU figures say, in one sentence.
    pub fn basis(&self) -> String {
        let mut parts = vec![format!("its threads ran {} on CPU", fmt_ns(self.cpu_ns))];
        if let Some(q) = self.queued_ns {
            let share = q as f64 / (q as f64 + self.cpu_ns as f64);
            parts.push(format!(
                "waited {} for a CPU ({} of their runnable time)",
                fmt_ns(q),
                fmt_share(share)
            ));
        }
        if let (Some(c), Some(u)) = (self.cpus, self.cpu_use) {
            parts.push(format!(
                "used {} of the {} CPU{} it may use",
                fmt_share(u),
                fmt_cpus(c),
                if c == 1.0 { "" } else { "s" }
            ));
        }
        parts.join(", ")
    }

    /// The cost line's second half: `latency only: ...` or `throughput: up to +4.1% ...`.
    pub fn text(&self) -> String {
        match self.kind {
            ImpactKind::Latency => format!(
                "latency only: its CPUs were saturated ({}): the waiting threads' CPUs ran its other threads meanwhile, so removing this wait reorders work and gives back no throughput beyond the CPU these writes took{}",
                self.basis(),
                if self.throughput_gain > 0.0 {
                    format!(
                        " (at most +{}: the time they held the lock over its CPU time)",
                        fmt_share(self.throughput_gain)
                    )
                } else {
                    String::new()
                }
            ),
            ImpactKind::Throughput => format!(
                "throughput: its CPUs had room ({}): removing this wait gives back up to +{} throughput",
                self.basis(),
                fmt_share(self.throughput_gain)
            ),
        }
    }
}

fn fmt_cpus(c: f64) -> String {
    if c.fract() == 0.0 {
        format!("{c:.0}")
    } else {
        format!("{c:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn figures(cpu: u64, queued: u64, cpus: f64) -> CpuFigures {
        CpuFigures {
            cpu_ns: cpu,
            queued_ns: Some(queued),
            cpus: Some(cpus),
            duration_ns: Some(10 * S),
        }
    }

    /// One CPU, run 9.8 s of 10, its threads queued as long again: the wait is latency, and
    /// what removing its writes gives back is the CPU they took.
    #[test]
    fn a_saturated_process_gets_latency_back() {
        let f = figures(9_800_000_000, 9 * S, 1.0);
        assert_eq!(f.saturated(), Some(true));
        let i = f.impact(2.0 * S as f64, Some(98_000_000)).unwrap();
        assert_eq!(i.kind, ImpactKind::Latency);
        assert_eq!(i.throughput_gain, 0.01);
        assert!(
            i.text()
                .starts_with("latency only: its CPUs were saturated")
        );
        assert!(
            i.text().contains("used 98.0% of the 1 CPU it may use"),
            "{}",
            i.text()
        );
        // Holds not measured (contention mode): nothing to give back is known.
        assert_eq!(f.impact(2.0 * S as f64, None).unwrap().throughput_gain, 0.0);
    }

    /// Two CPUs, 3 s used of 20, no queueing: 0.6 s of wait beside 3 s of work is a fifth
    /// more work per second, at most, within the CPUs' room.
    #[test]
    fn a_process_with_idle_cpus_gets_throughput_back() {
        let f = figures(3 * S, S / 100, 2.0);
        assert_eq!(f.saturated(), Some(false));
        let i = f.impact(0.6 * S as f64, None).unwrap();
        assert_eq!(i.kind, ImpactKind::Throughput);
        assert_eq!(i.throughput_gain, 0.2);
        // No more than the CPUs' room: 18.5 of 20 s used, 1.5 s left of 18.5.
        let busy = figures(18_500_000_000, S / 100, 2.0);
        assert_eq!(busy.saturated(), Some(true), "used 92.5%");
        let room = CpuFigures {
            cpu_ns: 16 * S,
            ..busy
        };
        assert_eq!(
            room.impact(8.0 * S as f64, None).unwrap().throughput_gain,
            0.25
        );
        // Queueing alone says saturated, whatever the CPUs (a quota, other processes).
        let q = figures(3 * S, 2 * S, 2.0);
        assert_eq!(q.saturated(), Some(true));
        // Nothing known: no verdict.
        let none = CpuFigures {
            queued_ns: None,
            cpus: None,
            ..f
        };
        assert_eq!(none.impact(1.0, None), None);
    }
}
