//! The lock's cost as a share of threads' time (`time_share`): the wait of a thread, a
//! process's threads or a role's threads for the lock (write and read), over their wall time
//! alive in the window and over their CPU time in it. Sums over threads: wait summed over
//! them divided by time summed over them.

use serde::{Deserialize, Serialize};

use crate::{aggregation::ThreadTime, registry::roles::Role};

/// `time_share` of a thread, a process or a role (docs/report-format.md, "Time share").
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TimeShare {
    /// Wait for this lock, write and read, ns.
    pub wait_ns: u64,
    /// Wall time alive in the window, ns.
    pub alive_ns: u64,
    /// `wait_ns / alive_ns`: the share of their lives spent waiting for the lock.
    pub wall: f64,
    /// CPU time in the window, ns, of the threads whose CPU time was read.
    pub cpu_ns: Option<u64>,
    /// The wait of those threads over their CPU time (above 1 when they waited longer than
    /// they ran: a waiting thread is off CPU).
    pub cpu: Option<f64>,
    /// Time runnable but waiting for a CPU in the window, ns (the scheduler's run-queue
    /// delay), of the threads whose CPU time was read; absent where the kernel keeps none.
    pub queued_ns: Option<u64>,
    /// Threads counted (processes and roles).
    pub threads: Option<u64>,
}

/// `time_share_by_role[]`: a role's threads of a process.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RoleShare {
    pub role: Role,
    #[serde(flatten)]
    pub share: TimeShare,
}

fn ratio(a: u64, b: u64) -> f64 {
    (a as f64 / b as f64 * 1e6).round() / 1e6
}

/// Adds threads' waits and times up.
#[derive(Clone, Copy, Debug, Default)]
pub struct ShareSum {
    wait: u64,
    alive: u64,
    /// The wait and CPU time of the threads whose CPU time is known.
    cpu_wait: u64,
    cpu: Option<u64>,
    queued: Option<u64>,
    threads: u64,
}

impl ShareSum {
    pub fn add(&mut self, wait_ns: u64, time: &ThreadTime) {
        self.wait += wait_ns;
        self.alive += time.alive_ns;
        self.threads += 1;
        if let Some(c) = time.cpu_ns {
            self.cpu_wait += wait_ns;
            self.cpu = Some(self.cpu.unwrap_or(0) + c);
        }
        if let Some(q) = time.queued_ns {
            self.queued = Some(self.queued.unwrap_or(0) + q);
        }
    }

    /// None when no time is known (a window without it, or threads not alive in it).
    fn share(&self, threads: Option<u64>) -> Option<TimeShare> {
        (self.alive > 0).then(|| TimeShare {
            wait_ns: self.wait,
            alive_ns: self.alive,
            wall: ratio(self.wait, self.alive),
            cpu_ns: self.cpu,
            cpu: self.cpu.filter(|&c| c > 0).map(|c| ratio(self.cpu_wait, c)),
            queued_ns: self.queued,
            threads,
        })
    }

    /// A thread's share.
    pub fn of_thread(wait_ns: u64, time: &ThreadTime) -> Option<TimeShare> {
        let mut s = ShareSum::default();
        s.add(wait_ns, time);
        s.share(None)
    }

    /// A group's share, with its thread count.
    pub fn total(&self) -> Option<TimeShare> {
        self.share(Some(self.threads))
    }

    /// Adds a share a report gave for a window (summing a run's interval lines): its wait
    /// over its CPU time gives back the wait of the threads whose CPU time was known (to
    /// the ratio's 6 decimals); its thread count is the most any window had.
    pub fn add_reported(&mut self, s: &TimeShare) {
        self.wait = self.wait.saturating_add(s.wait_ns);
        self.alive = self.alive.saturating_add(s.alive_ns);
        if let Some(c) = s.cpu_ns {
            let w = s.cpu.map_or(0.0, |r| (r * c as f64).round());
            self.cpu_wait = self.cpu_wait.saturating_add(w as u64);
            self.cpu = Some(self.cpu.unwrap_or(0).saturating_add(c));
        }
        if let Some(q) = s.queued_ns {
            self.queued = Some(self.queued.unwrap_or(0).saturating_add(q));
        }
        self.threads = self.threads.max(s.threads.unwrap_or(1));
    }

    /// The share of one thread's windows added up.
    pub fn thread(&self) -> Option<TimeShare> {
        self.share(None)
    }
}

/// Shares by role, in the order of [`Role`]; None when no time is known.
pub fn by_role(sums: &std::collections::BTreeMap<Role, ShareSum>) -> Option<Vec<RoleShare>> {
    let v: Vec<RoleShare> = sums
        .iter()
        .filter_map(|(&role, s)| {
            Some(RoleShare {
                role,
                share: s.total()?,
            })
        })
        .collect();
    (!v.is_empty()).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(alive_ns: u64, cpu_ns: Option<u64>) -> ThreadTime {
        ThreadTime {
            alive_ns,
            cpu_ns,
            queued_ns: None,
        }
    }

    #[test]
    fn group_shares_are_summed_waits_over_summed_times() {
        let mut s = ShareSum::default();
        s.add(100, &t(1000, Some(400)));
        s.add(300, &t(3000, None));
        let share = s.total().unwrap();
        assert_eq!((share.wait_ns, share.alive_ns), (400, 4000));
        assert_eq!(share.wall, 0.1);
        // CPU: only the thread whose CPU time is known, its own wait over it.
        assert_eq!((share.cpu_ns, share.cpu), (Some(400), Some(0.25)));
        assert_eq!(share.threads, Some(2));
        let one = ShareSum::of_thread(50, &t(200, None)).unwrap();
        assert_eq!((one.wall, one.cpu, one.threads), (0.25, None, None));
        assert!(
            ShareSum::of_thread(5, &t(0, Some(3))).is_none(),
            "no time, no share"
        );
        // Windows of a report added up give the share of their sum.
        let mut sum = ShareSum::default();
        sum.add_reported(&share);
        let other = ShareSum::of_thread(100, &t(1000, Some(100))).unwrap();
        sum.add_reported(&other);
        let both = sum.total().unwrap();
        assert_eq!((both.wait_ns, both.alive_ns, both.wall), (500, 5000, 0.1));
        assert_eq!((both.cpu_ns, both.cpu), (Some(500), Some(0.4)));
        assert_eq!(both.threads, Some(2), "the most of a window");
        let json = serde_json::to_value(&share).unwrap();
        assert_eq!(json["wall"], 0.1);
        assert_eq!(json["cpu_ns"], 400);
    }
}
