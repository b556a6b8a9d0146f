//! What a report says besides the activity: what the profile lost (`lost`), what the profiler
//! did that loses nothing but is worth knowing (`uncounted`), and its own in-kernel cost
//! (`overhead`).

use std::{borrow::Cow, time::Duration};

use serde::{Deserialize, Serialize};

use crate::kernel::collector::ProgramStats;

/// What the profile does not contain, by reason (docs/report-format.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lost {
    /// Acquisitions lost for any reason but `map_full`: the sum of the reasons below it.
    pub events: u64,
    /// Acquisitions whose statistics could not be stored because the map was full
    /// (`--max-threads`).
    pub map_full: u64,
    /// Sampled stacks dropped because the ring buffer was full (raise --stack-sample).
    #[serde(default)]
    pub stacks: u64,
    /// A third mm lock pending or held by one thread at once (two are tracked).
    #[serde(default)]
    pub nested: u64,
    /// Per-thread state could not be allocated.
    #[serde(default)]
    pub no_state: u64,
    /// A thread's pending ring was full while another context flushed it.
    #[serde(default)]
    pub ring_full: u64,
    /// Pending acquisitions of a freed thread whose state could not be reached.
    #[serde(default)]
    pub exit_flush: u64,
    /// Threads that had begun exiting when the run ended and were not yet freed, so their
    /// last pending acquisitions (at most 32 each) could not be flushed.
    #[serde(default)]
    pub exit_pending: u64,
    /// Runs of the profiler's programs that the kernel skipped (another thread was inside
    /// the same program on that CPU, where tracepoint programs can be preempted, Linux 7.x)
    /// and that no second copy made up for: lock events, or threads' exit and exec notices.
    /// Not in `events`: they may be other processes' (the kernel does not say whose).
    #[serde(default)]
    pub skipped: u64,
    /// Interval reports not written because their reader fell behind (the writer's queue was
    /// full) or their write failed: on an interval line, those dropped just before it; on the
    /// summary, all of them. Not in `events`: the reports' counts are all in the summary.
    #[serde(default)]
    pub output: u64,
    /// Contention mode: holders' stacks of sampled waits that could not be taken (the
    /// holder's saved registers not found, the ring full, or its wait's outcome never
    /// read). Not in `events`: the counts are whole.
    #[serde(default)]
    pub holder_stacks: u64,
}

/// `add`, for structs of counters: field by field, saturating (they may come from files).
/// Every field is named in a pattern, so one added to the struct must be added here too.
macro_rules! add_counters {
    ($t:ident { $($f:ident),* $(,)? }) => {
        impl $t {
            /// Adds another window's counts.
            pub fn add(&mut self, o: &$t) {
                let $t { $($f),* } = *o;
                $(self.$f = self.$f.saturating_add($f);)*
            }
        }
    };
}

add_counters!(Lost {
    events,
    map_full,
    stacks,
    nested,
    no_state,
    ring_full,
    exit_flush,
    exit_pending,
    skipped,
    output,
    holder_stacks,
});

impl Lost {
    pub fn with_total(mut self) -> Self {
        self.events =
            self.nested + self.no_state + self.ring_full + self.exit_flush + self.exit_pending;
        self
    }
}

/// What the profiler did that is worth knowing but loses nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Uncounted {
    /// A child's new mm locked inside fork's dup_mmap: not charged to the parent (the lock
    /// is the child's, uncontended, and held within the parent's fork hold).
    pub fork_child: u64,
    /// Threads' pending rings that filled up (trylocks only, no blocking acquire between)
    /// and were flushed at a release, with the lock held: kept exact at a cost.
    pub flushed_under_lock: u64,
    /// Completed acquisitions that found their thread's pending ring full while the flush
    /// iterator held it, and were added to the thread's counts directly, with the lock held:
    /// kept exact at a cost.
    pub spilled: u64,
    /// Blockers only (not acquisitions): holds that had left their lock's log of the last
    /// 16 when the wait they made was charged; that part of the wait is not attributed.
    pub blockers_overrun: u64,
    /// Blockers only: contended waits not charged because the thread's previous one was
    /// still pending (it held a lock in between), or the blockers map was full.
    pub blockers_dropped: u64,
    /// Downgrades and failed trylocks (not acquisitions, so not in `lost`) whose statistics
    /// could not be stored because the map was full (`--max-threads`).
    pub not_acquisitions_map_full: u64,
}

add_counters!(Uncounted {
    fork_child,
    flushed_under_lock,
    spilled,
    blockers_overrun,
    blockers_dropped,
    not_acquisitions_map_full,
});

/// One eBPF program's share of [`Overhead`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProgramOverhead {
    pub name: Cow<'static, str>,
    pub events: u64,
    pub ns_per_event: f64,
}

/// The profiler's own in-kernel cost over a window, from the kernel's BPF statistics.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Overhead {
    /// Mean BPF run time per tracepoint hit, over all programs.
    pub bpf_ns_per_event: f64,
    /// Tracepoint hits handled (every mmap_lock operation on the machine, filtered or not).
    pub events: u64,
    /// BPF run time as a share of one CPU over the window, in percent.
    pub bpf_cpu_pct: f64,
    pub programs: Vec<ProgramOverhead>,
    /// The summary's only: where attach time went (each step, and each program's
    /// verification with the instructions the verifier processed).
    pub load: Option<crate::kernel::load::LoadReport>,
}

fn round(v: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (v * f).round() / f
}

impl Overhead {
    /// From two cumulative readings of the programs' statistics, `wall` apart.
    pub fn between(cur: &[ProgramStats], prev: &[ProgramStats], wall: Duration) -> Overhead {
        let mut programs = Vec::new();
        let (mut events, mut ns) = (0u64, 0u128);
        for c in cur {
            let p = prev.iter().find(|p| p.name == c.name);
            let n = c.run_count - p.map_or(0, |p| p.run_count);
            let t = c
                .run_time
                .saturating_sub(p.map_or(Duration::ZERO, |p| p.run_time));
            events += n;
            ns += t.as_nanos();
            programs.push(ProgramOverhead {
                name: c.name.into(),
                events: n,
                ns_per_event: if n == 0 {
                    0.0
                } else {
                    round(t.as_nanos() as f64 / n as f64, 1)
                },
            });
        }
        Overhead {
            bpf_ns_per_event: if events == 0 {
                0.0
            } else {
                round(ns as f64 / events as f64, 1)
            },
            events,
            bpf_cpu_pct: if wall.is_zero() {
                0.0
            } else {
                round(ns as f64 / wall.as_nanos() as f64 * 100.0, 3)
            },
            programs,
            load: None,
        }
    }
}

#[cfg(test)]
mod overhead_tests {
    use super::*;

    #[test]
    fn overhead_is_the_difference_of_two_readings() {
        let p = |name, run_count, ns| ProgramStats {
            name,
            run_count,
            run_time: Duration::from_nanos(ns),
        };
        let prev = [p("a", 100, 10_000), p("b", 50, 5_000)];
        let cur = [p("a", 1100, 60_000), p("b", 1050, 105_000)];
        let o = Overhead::between(&cur, &prev, Duration::from_millis(1));
        assert_eq!(o.events, 2000);
        assert_eq!(o.bpf_ns_per_event, 75.0);
        // 150 us of BPF in 1 ms of wall time.
        assert_eq!(o.bpf_cpu_pct, 15.0);
        assert_eq!(o.programs[0].ns_per_event, 50.0);
        assert_eq!(o.programs[1].ns_per_event, 100.0);
        let none = Overhead::between(&cur, &cur, Duration::ZERO);
        assert_eq!(
            (none.events, none.bpf_ns_per_event, none.bpf_cpu_pct),
            (0, 0.0, 0.0)
        );
    }
}
