//! How long each thread lived, and ran, in a window: the denominators of the lock's cost as a
//! share of a thread's time (`time_share` in the reports, `mmaplock_thread_seconds_total` and
//! `mmaplock_thread_cpu_seconds_total` in the agent).
//!
//! Wall time alive comes from the thread's start (the kernel's `start_boottime`, in every
//! key) and its exit (the kernel's time of its exit notice), clipped to the window.
//!
//! CPU time comes from the kernel too, never from /proc: the flush iterator reports a profiled
//! thread's `sum_exec_runtime` at each reading when it changed, and the exit notice carries it
//! at the thread's exit (so what a thread ran after its last reading is counted). A thread's
//! CPU in a window is its CPU at the window's end less its CPU at the window's start. The
//! start is known exactly for a thread born in the window (0: it had not run) and for one
//! reported at an earlier reading; a thread older than the window and first reported in it
//! (it took no profiled lock before) is counted from its first report.

use rustc_hash::FxHashMap as HashMap;

use crate::registry::ids::ThreadId;

/// A thread's time in a window, ns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadTime {
    /// Wall time alive within the window.
    pub alive_ns: u64,
    /// CPU time within the window; None when the kernel reported none of it.
    pub cpu_ns: Option<u64>,
}

impl ThreadTime {
    pub fn merge(&mut self, o: &ThreadTime) {
        self.alive_ns += o.alive_ns;
        self.cpu_ns = match (self.cpu_ns, o.cpu_ns) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
    }
}

/// Now, on the clock of the kernel's start times and readings (`CLOCK_BOOTTIME`, ns).
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// One thread's CPU time as the kernel reported it, the first and the last time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuSeen {
    /// CPU time (ns) and when it was read (ns since boot), the first time in this run.
    pub first_ns: u64,
    pub first_at: u64,
    /// The same, the last time.
    pub last_ns: u64,
    pub last_at: u64,
}

/// The kernel's CPU reports by thread.
#[derive(Debug, Default)]
pub struct CpuTimes {
    threads: HashMap<ThreadId, CpuSeen>,
}

impl CpuTimes {
    /// A report: `cpu_ns` of CPU time by `at` (ns since boot).
    pub fn note(&mut self, thread: ThreadId, cpu_ns: u64, at: u64) {
        let seen = self.threads.entry(thread).or_insert(CpuSeen {
            first_ns: cpu_ns,
            first_at: at,
            last_ns: cpu_ns,
            last_at: at,
        });
        // Reports can arrive out of order (an exit notice and an iterator pass at once).
        if at >= seen.last_at {
            seen.last_ns = cpu_ns.max(seen.last_ns);
            seen.last_at = at;
        }
        if at < seen.first_at {
            (seen.first_ns, seen.first_at) = (cpu_ns.min(seen.first_ns), at);
        }
    }

    pub fn get(&self, thread: ThreadId) -> Option<&CpuSeen> {
        self.threads.get(&thread)
    }

    pub fn take(&mut self, thread: ThreadId) -> Option<CpuSeen> {
        self.threads.remove(&thread)
    }

    pub fn insert(&mut self, thread: ThreadId, seen: CpuSeen) {
        self.threads.insert(thread, seen);
    }

    pub fn clear(&mut self) {
        self.threads.clear();
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.threads.len()
    }
}

/// What is known of a live thread's life (boot-time clock, ns), on one lock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Life {
    pub start_ns: u64,
    /// When its exit was noticed; None while it lives.
    pub exit_ns: Option<u64>,
    /// Its CPU time at the run's start (see the module's doc); None before any report.
    cpu_base: Option<u64>,
    /// Its CPU time at the last tick that had a report of it, and the latest reported.
    cpu_at_tick: Option<u64>,
    cpu_last: u64,
}

impl Life {
    /// A thread started at `start_ns` (and, if it already did, that exited at `exit_ns`).
    pub fn new(start_ns: u64, exit_ns: Option<u64>) -> Self {
        Life {
            start_ns,
            exit_ns,
            ..Default::default()
        }
    }

    /// Wall time alive within `[from, to]`.
    pub fn alive_within(&self, from: u64, to: u64) -> u64 {
        let end = self.exit_ns.map_or(to, |e| e.min(to));
        end.saturating_sub(from.max(self.start_ns))
    }

    /// A tick ending the window that began at `from` (the run began at `epoch`), with the
    /// kernel's reports of the thread's CPU time: the CPU it ran in the window, None when the
    /// kernel reported none.
    pub fn cpu_tick(&mut self, seen: Option<&CpuSeen>, from: u64, epoch: u64) -> Option<u64> {
        let seen = seen?;
        // What it had run when a window began: 0 if born since, else as last known.
        let at = |start: u64, known: Option<u64>| {
            if self.start_ns >= start {
                0
            } else {
                known.unwrap_or(seen.first_ns)
            }
        };
        let run_base = at(epoch, None);
        let window_base = at(from, self.cpu_at_tick);
        self.cpu_base.get_or_insert(run_base);
        self.cpu_last = self.cpu_last.max(seen.last_ns);
        self.cpu_at_tick = Some(self.cpu_last);
        Some(self.cpu_last.saturating_sub(window_base))
    }

    /// CPU time since the run's start, as last reported; None before any report.
    pub fn cpu_total(&self) -> Option<u64> {
        self.cpu_base.map(|b| self.cpu_last.saturating_sub(b))
    }

    /// Its time in the run `[epoch, now]`.
    pub fn in_run(&self, epoch_ns: u64, now_ns: u64) -> ThreadTime {
        ThreadTime {
            alive_ns: self.alive_within(epoch_ns, now_ns),
            cpu_ns: self.cpu_total(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn alive_is_the_life_clipped_to_the_window() {
        let mut l = Life::new(10 * S, None);
        assert_eq!(l.alive_within(0, 15 * S), 5 * S, "started in the window");
        assert_eq!(l.alive_within(12 * S, 15 * S), 3 * S, "started before it");
        assert_eq!(l.alive_within(0, 5 * S), 0, "not born yet");
        l.exit_ns = Some(13 * S);
        assert_eq!(l.alive_within(12 * S, 15 * S), S, "exited in it");
        assert_eq!(l.alive_within(14 * S, 15 * S), 0, "gone before it");
    }

    #[test]
    fn reports_keep_the_first_and_the_latest_whatever_their_order() {
        let t = ThreadId::new(7, 100);
        let mut c = CpuTimes::default();
        c.note(t, 2_000, 20);
        c.note(t, 4_000, 30);
        // An older report arriving late: it is the first, not the last.
        c.note(t, 1_000, 10);
        let s = *c.get(t).unwrap();
        assert_eq!((s.first_ns, s.last_ns), (1_000, 4_000));
        assert_eq!(c.take(t), Some(s));
        assert_eq!(c.len(), 0);
    }

    /// A thread's CPU in a window is its CPU at the window's end less at its start.
    #[test]
    fn cpu_counts_from_the_windows_start_or_the_first_report() {
        let seen = |first_ns, last_ns| CpuSeen {
            first_ns,
            first_at: 0,
            last_ns,
            last_at: 0,
        };
        // Born during the run (epoch 5 s) and in the first window: all it ran is the run's.
        let mut young = Life::new(10 * S, None);
        assert_eq!(young.cpu_tick(None, 5 * S, 5 * S), None, "no report yet");
        assert_eq!(young.cpu_total(), None);
        assert_eq!(
            young.cpu_tick(Some(&seen(300, 300)), 5 * S, 5 * S),
            Some(300)
        );
        // The next window: from the CPU at the previous tick.
        assert_eq!(
            young.cpu_tick(Some(&seen(300, 500)), 11 * S, 5 * S),
            Some(200)
        );
        assert_eq!(young.cpu_total(), Some(500));
        // An idle window (no new report): nothing ran.
        assert_eq!(
            young.cpu_tick(Some(&seen(300, 500)), 12 * S, 5 * S),
            Some(0)
        );
        // Predates the run: counted from its first report.
        let mut old = Life::new(S, None);
        assert_eq!(
            old.cpu_tick(Some(&seen(9_000, 9_400)), 5 * S, 5 * S),
            Some(400)
        );
        assert_eq!(
            old.cpu_tick(Some(&seen(9_000, 9_700)), 6 * S, 5 * S),
            Some(300)
        );
        assert_eq!(old.cpu_total(), Some(700));
        // Born during the run but before the window it is first reported in: the window
        // counts it from that report, the run from its start.
        let mut late = Life::new(7 * S, None);
        assert_eq!(
            late.cpu_tick(Some(&seen(800, 900)), 8 * S, 5 * S),
            Some(100)
        );
        assert_eq!(late.cpu_total(), Some(900));
        assert_eq!(
            old.in_run(5 * S, 7 * S),
            ThreadTime {
                alive_ns: 2 * S,
                cpu_ns: Some(700)
            }
        );
    }

    #[test]
    fn merging_times_adds_what_is_known() {
        let mut a = ThreadTime {
            alive_ns: 5,
            cpu_ns: None,
        };
        a.merge(&ThreadTime {
            alive_ns: 7,
            cpu_ns: Some(3),
        });
        assert_eq!((a.alive_ns, a.cpu_ns), (12, Some(3)));
        a.merge(&ThreadTime {
            alive_ns: 1,
            cpu_ns: Some(2),
        });
        assert_eq!(a.cpu_ns, Some(5));
        let (n1, n2) = (now_ns(), now_ns());
        assert!(n1 > 0 && n2 >= n1);
    }
}
