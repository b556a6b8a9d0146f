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

use super::{Totals, Window};
use crate::vocab::ids::ThreadId;

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

/// The totals' side of it: exits and CPU reports noted as the kernel sends them, and each
/// reading's tick.
impl Totals {
    /// Thread `tid` exited (its exit notice was taken at `at_ns`, boot-time clock): its time
    /// alive ends there.
    pub fn note_exit(&mut self, tid: ThreadId, at_ns: u64) {
        match self.owners.get(&tid) {
            Some(owners) => {
                for owner in owners {
                    if let Some(info) = self.threads.get_mut(&(*owner, tid)) {
                        info.life.exit_ns.get_or_insert(at_ns);
                    }
                }
            }
            None => {
                self.early_exits.entry(tid).or_insert(at_ns);
            }
        }
    }

    /// The kernel reported thread `tid`'s CPU time: `cpu_ns` at `at_ns` (boot-time clock),
    /// at a reading (the flush iterator's, for a thread that ran since the last one) or at its
    /// exit (its notice).
    pub fn note_cpu(&mut self, tid: ThreadId, cpu_ns: u64, at_ns: u64) {
        if self.owners.contains_key(&tid) {
            self.cpu.note(tid, cpu_ns, at_ns);
        } else {
            self.early_cpu.note(tid, cpu_ns, at_ns);
        }
    }

    /// A reading at `now_ns` (boot-time clock) of the live threads' time: their CPU time as
    /// the kernel last reported it (see the module's doc), and every live thread's time since
    /// the last reading added to `interval` (idle threads too: they are alive in it, and the
    /// shares of their process and role count them).
    pub fn tick(&mut self, now_ns: u64, mut interval: Option<&mut Window>) {
        let (from, epoch) = (self.last_tick_ns, self.epoch_ns);
        if let Some(w) = interval.as_deref_mut() {
            w.expect_threads(self.threads.len());
        }
        for (&(owner, tid), info) in &mut self.threads {
            let life = &mut info.life;
            let alive = life.alive_within(from, now_ns);
            let cpu = life.cpu_tick(self.cpu.get(tid), from, epoch);
            if let Some(w) = interval.as_deref_mut() {
                // (Not clipped to its time alive: the CPU is read by the kernel a little
                // before the tick, so a window's CPU may exceed it by that much, and the next
                // window's falls short by as much; the windows add up to the run's.)
                w.add_time(
                    owner,
                    tid,
                    (info.tgid, info.comm, info.fsbase),
                    &ThreadTime {
                        alive_ns: alive,
                        cpu_ns: cpu,
                    },
                );
            }
        }
        self.last_tick_ns = self.last_tick_ns.max(now_ns);
        self.early_exits.clear();
        self.early_cpu.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregation::ThreadAgg;
    use crate::aggregation::tests::{P10, T11, W, kernel_entry};
    use crate::vocab::{hist::SideStats, ids::ProcId};
    use profiler_common::{COMM_LEN, StatsKey};

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
        // A window ending at `at` in a run that began at 5 s, the thread's CPU first and
        // last reported as `first_ns` and `last_ns`.
        let tick = |life: &mut Life, first_ns, last_ns, at| {
            let seen = CpuSeen {
                first_ns,
                first_at: 0,
                last_ns,
                last_at: 0,
            };
            life.cpu_tick(Some(&seen), at, 5 * S)
        };
        // Born during the run (epoch 5 s) and in the first window: all it ran is the run's.
        let mut young = Life::new(10 * S, None);
        assert_eq!(young.cpu_tick(None, 5 * S, 5 * S), None, "no report yet");
        assert_eq!(young.cpu_total(), None);
        assert_eq!(tick(&mut young, 300, 300, 5 * S), Some(300));
        // The next window: from the CPU at the previous tick.
        assert_eq!(tick(&mut young, 300, 500, 11 * S), Some(200));
        assert_eq!(young.cpu_total(), Some(500));
        // An idle window (no new report): nothing ran.
        assert_eq!(tick(&mut young, 300, 500, 12 * S), Some(0));
        // Predates the run: counted from its first report.
        let mut old = Life::new(S, None);
        assert_eq!(tick(&mut old, 9_000, 9_400, 5 * S), Some(400));
        assert_eq!(tick(&mut old, 9_000, 9_700, 6 * S), Some(300));
        assert_eq!(old.cpu_total(), Some(700));
        // Born during the run but before the window it is first reported in: the window
        // counts it from that report, the run from its start.
        let mut late = Life::new(7 * S, None);
        assert_eq!(tick(&mut late, 800, 900, 8 * S), Some(100));
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
    }

    /// As a poll does it: the kernel's CPU reports (the iterator's, and exit notices'), the
    /// entries read, then the tick.
    #[test]
    fn threads_time_is_counted_from_their_start_or_the_runs_to_their_exit() {
        const S: u64 = 1_000_000_000;
        let mut tot = Totals::starting_at(100 * S);
        // Thread 11 started before the run (20 s), thread 12 during it (101 s).
        let young = StatsKey {
            tid: 12,
            tid_start: 101 * S,
            ..W
        };
        let t12 = ThreadId::new(12, 10100);
        // 11 has run 50 s before the run, 12 0.2 s since it started; reported before their
        // first entries are read.
        tot.note_cpu(T11, 50 * S, 102 * S);
        tot.note_cpu(t12, S / 5, 102 * S);
        tot.update(&[
            (W, kernel_entry(&[(5, 5)])),
            (young, kernel_entry(&[(7, 7)])),
        ]);
        let mut interval = Window::default();
        tot.tick(102 * S, Some(&mut interval));
        interval.settle(true);
        let iv = &interval.processes[&P10];
        assert_eq!(iv[&T11].time.alive_ns, 2 * S, "the run's start to now");
        assert_eq!(
            iv[&T11].time.cpu_ns,
            Some(0),
            "counted from its first report"
        );
        assert_eq!(iv[&t12].time.alive_ns, S);
        assert_eq!(iv[&t12].time.cpu_ns, Some(S / 5), "counted from its start");
        // 11 runs 1 s more without taking the lock (idle threads are alive in an interval
        // too); 12 is reported at 0.5 s, then exits at 103.5 s having run 1 s: its exit
        // notice carries what it ran after its last report.
        tot.note_cpu(T11, 51 * S, 104 * S);
        tot.note_cpu(t12, S / 2, 103 * S);
        tot.note_cpu(t12, S, 103 * S + S / 2);
        tot.note_exit(t12, 103 * S + S / 2);
        let mut next = Window::default();
        tot.tick(104 * S, Some(&mut next));
        next.settle(true);
        let nx = &next.processes[&P10];
        assert!(nx[&T11].is_idle());
        assert_eq!(
            nx[&T11].time,
            ThreadTime {
                alive_ns: 2 * S,
                cpu_ns: Some(S)
            }
        );
        assert_eq!(
            nx[&t12].time,
            ThreadTime {
                alive_ns: 3 * S / 2,
                cpu_ns: Some(S - S / 5)
            }
        );
        // The run: 11 alive 4 s, 1 s of CPU; 12 alive 2.5 s, 1 s of CPU.
        tot.retire(P10, t12, None);
        let w = tot.window();
        assert_eq!(
            w.processes[&P10][&T11].time,
            ThreadTime {
                alive_ns: 4 * S,
                cpu_ns: Some(S)
            }
        );
        assert_eq!(
            w.processes[&P10][&t12].time,
            ThreadTime {
                alive_ns: 5 * S / 2,
                cpu_ns: Some(S)
            }
        );
        // A gone thread's reports are forgotten with it, and one arriving late (an iterator
        // pass that saw it exiting) at the next tick.
        assert!(tot.cpu.get(t12).is_none());
        tot.note_cpu(t12, S + 1, 104 * S);
        // An exit (and CPU) noticed before the thread's first entry is read is not lost.
        let t13 = ThreadId::new(13, 10100);
        tot.note_cpu(t13, 7, 103 * S);
        tot.note_exit(t13, 103 * S);
        let late = StatsKey {
            tid: 13,
            tid_start: 101 * S,
            ..W
        };
        tot.update(&[(late, kernel_entry(&[(1, 1)]))]);
        tot.tick(105 * S, None);
        assert_eq!((tot.cpu.len(), tot.early_cpu.len()), (2, 0));
        let w = tot.window();
        assert_eq!(
            w.processes[&P10][&t13].time,
            ThreadTime {
                alive_ns: 2 * S,
                cpu_ns: Some(7)
            }
        );
    }

    #[test]
    fn idle_time_joins_a_process_that_took_a_lock_and_is_dropped_for_one_that_did_not() {
        let p20 = ProcId::new(20, 1);
        let [a, b, c] = ThreadId::made_up([11, 12, 21]);
        let who = (10, [0u8; COMM_LEN], 0);
        let second = ThreadTime {
            alive_ns: S,
            cpu_ns: Some(S / 10),
        };
        let mut w = Window::default();
        // First tick: nothing took a lock yet; every thread's second is kept apart.
        for (p, t) in [(P10, a), (P10, b), (p20, c)] {
            w.add_time(p, t, who, &second);
        }
        assert!(w.processes.is_empty());
        // Then thread a takes the lock, and a second tick.
        let active = ThreadAgg {
            read: SideStats {
                count: 1,
                ..SideStats::default()
            },
            ..ThreadAgg::new(10, [0; COMM_LEN], 0)
        };
        w.add_thread(P10, a, &active);
        for (p, t) in [(P10, a), (P10, b), (p20, c)] {
            w.add_time(p, t, who, &second);
        }
        let mut agent = w.clone();
        w.retain_active();
        let two = ThreadTime {
            alive_ns: 2 * S,
            cpu_ns: Some(S / 5),
        };
        assert_eq!(w.processes.len(), 1, "process 20 took no lock");
        assert_eq!(w.processes[&P10][&a].time, two);
        assert_eq!(w.processes[&P10][&b].time, two, "idle, both seconds");
        assert_eq!(w.processes[&P10][&a].read.count, 1);
        // The agent's view keeps every live thread's time.
        agent.settle(true);
        assert_eq!(agent.processes[&p20][&c].time, two);
        assert_eq!(agent.processes[&P10][&b].time, two);
    }
}
