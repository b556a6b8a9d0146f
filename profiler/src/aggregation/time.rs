//! How long each thread lived, and ran, in a window: the denominators of the lock's cost as a
//! share of a thread's time (`time_share` in the reports, `mmaplock_thread_seconds_total` in
//! the agent).
//!
//! Wall time alive comes from the thread's start (the kernel's `start_boottime`, in every
//! key) and its exit (noted when its exit notice is taken), clipped to the window. CPU time
//! comes from cumulative readings of the thread's run time (`sum_exec_runtime`) taken at
//! readings of the kernel maps: the run's CPU is the last reading less the first, or less 0
//! for a thread that started during the run. A thread that predates the run has its CPU
//! counted from its first reading (nothing earlier is known of it).

/// A thread's time in a window, ns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadTime {
    /// Wall time alive within the window.
    pub alive_ns: u64,
    /// CPU time within the window; None when no reading of it was taken.
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

/// What is known of a live thread's life (boot-time clock, ns).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Life {
    pub start_ns: u64,
    /// When its exit was noticed; None while it lives.
    pub exit_ns: Option<u64>,
    /// Its cumulative CPU time at the start of the run (0 when it started during the run) and
    /// at its last reading.
    cpu_base: Option<u64>,
    cpu_last: u64,
    /// It took a lock since the last reading of its CPU time.
    pub active: bool,
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

    /// Takes a reading of the thread's cumulative CPU time (`epoch_ns`: the run's start);
    /// returns the CPU time run since the previous reading (or since the run's start).
    pub fn cpu_reading(&mut self, cumulative_ns: u64, epoch_ns: u64) -> u64 {
        let prev = match self.cpu_base {
            Some(_) => self.cpu_last,
            None => {
                // Started during the run: all its CPU time is the run's.
                let base = if self.start_ns >= epoch_ns {
                    0
                } else {
                    cumulative_ns
                };
                self.cpu_base = Some(base);
                base
            }
        };
        self.cpu_last = self.cpu_last.max(cumulative_ns);
        cumulative_ns.saturating_sub(prev)
    }

    /// CPU time since the run's start, as last read; None before any reading.
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
    fn cpu_counts_from_the_runs_start_or_the_first_reading() {
        // Started during the run (epoch 5 s): everything it ran is the run's.
        let mut young = Life::new(10 * S, None);
        assert_eq!(young.cpu_total(), None);
        assert_eq!(young.cpu_reading(300, 5 * S), 300);
        assert_eq!(young.cpu_reading(500, 5 * S), 200);
        assert_eq!(young.cpu_total(), Some(500));
        // Predates the run: counted from its first reading.
        let mut old = Life::new(S, None);
        assert_eq!(old.cpu_reading(9_000, 5 * S), 0);
        assert_eq!(old.cpu_reading(9_700, 5 * S), 700);
        // A reading never goes backwards.
        assert_eq!(old.cpu_reading(9_600, 5 * S), 0);
        assert_eq!(old.cpu_total(), Some(700));
        let t = old.in_run(5 * S, 7 * S);
        assert_eq!(
            t,
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
}
