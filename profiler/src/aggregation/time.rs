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
    /// Time runnable but waiting for a CPU within the window (the scheduler's
    /// `sched_info.run_delay`); None when the kernel reported none of it, or keeps none
    /// (a kernel without CONFIG_SCHED_INFO).
    pub queued_ns: Option<u64>,
}

fn add(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a + b),
        (a, b) => a.or(b),
    }
}

impl ThreadTime {
    pub fn merge(&mut self, o: &ThreadTime) {
        self.alive_ns += o.alive_ns;
        self.cpu_ns = add(self.cpu_ns, o.cpu_ns);
        self.queued_ns = add(self.queued_ns, o.queued_ns);
    }
}

/// One thread's CPU time as the kernel reported it, the first and the last time, with its
/// time waiting for a CPU (run-queue delay) read at the same moments.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuSeen {
    /// CPU time (ns) and when it was read (ns since boot), the first time in this run.
    pub first_ns: u64,
    pub first_at: u64,
    /// The same, the last time.
    pub last_ns: u64,
    pub last_at: u64,
    /// Run-queue delay (ns) at the first and the last report; None where the kernel keeps
    /// none.
    pub first_queued: Option<u64>,
    pub last_queued: Option<u64>,
}

/// The kernel's CPU reports by thread.
#[derive(Debug, Default)]
pub struct CpuTimes {
    threads: HashMap<ThreadId, CpuSeen>,
}

impl CpuTimes {
    /// A report: `cpu_ns` of CPU time and `queued_ns` of run-queue delay by `at` (ns since
    /// boot).
    pub fn note(&mut self, thread: ThreadId, cpu_ns: u64, queued_ns: Option<u64>, at: u64) {
        let seen = self.threads.entry(thread).or_insert(CpuSeen {
            first_ns: cpu_ns,
            first_at: at,
            last_ns: cpu_ns,
            last_at: at,
            first_queued: queued_ns,
            last_queued: queued_ns,
        });
        // Reports can arrive out of order (an exit notice and an iterator pass at once).
        if at >= seen.last_at {
            seen.last_ns = cpu_ns.max(seen.last_ns);
            seen.last_queued = queued_ns.max(seen.last_queued);
            seen.last_at = at;
        }
        if at < seen.first_at {
            (seen.first_ns, seen.first_at) = (cpu_ns.min(seen.first_ns), at);
            seen.first_queued = match (queued_ns, seen.first_queued) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
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
    /// Its CPU time as counted (see the module's doc).
    cpu: Counter,
    /// Its run-queue delay, counted the same way.
    queued: Counter,
}

/// A counter the kernel reports of a thread (CPU time, run-queue delay), counted from the
/// run's and each window's start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Counter {
    /// Its value at the run's start; None before any report.
    base: Option<u64>,
    /// Its value at the last tick that had a report of it, and the latest reported.
    at_tick: Option<u64>,
    last: u64,
}

impl Counter {
    /// A tick: the counter's increase in the window (`first` and `last` reported this run;
    /// `born_in_run`/`born_in_window`: the thread started since the run's/window's start,
    /// when the counter was 0).
    fn tick(&mut self, first: u64, last: u64, born_in_run: bool, born_in_window: bool) -> u64 {
        let run_base = if born_in_run { 0 } else { first };
        let window_base = if born_in_window {
            0
        } else {
            self.at_tick.unwrap_or(first)
        };
        self.base.get_or_insert(run_base);
        self.last = self.last.max(last);
        self.at_tick = Some(self.last);
        self.last.saturating_sub(window_base)
    }

    fn total(&self) -> Option<u64> {
        self.base.map(|b| self.last.saturating_sub(b))
    }
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

    /// Its whole life, start to exit, once it exited.
    pub fn lived_ns(&self) -> Option<u64> {
        self.exit_ns.map(|e| e.saturating_sub(self.start_ns))
    }

    /// Wall time alive within `[from, to]`.
    pub fn alive_within(&self, from: u64, to: u64) -> u64 {
        let end = self.exit_ns.map_or(to, |e| e.min(to));
        end.saturating_sub(from.max(self.start_ns))
    }

    /// A tick ending the window that began at `from` (the run began at `epoch`), with the
    /// kernel's reports of the thread's CPU time: the CPU it ran in the window, None when the
    /// kernel reported none.
    #[cfg(test)]
    pub fn cpu_tick(&mut self, seen: Option<&CpuSeen>, from: u64, epoch: u64) -> Option<u64> {
        self.tick(seen, from, epoch).0
    }

    /// The CPU time it ran in the window and its run-queue delay in it (None where the
    /// kernel reported none, or keeps none), as [`cpu_tick`](Self::cpu_tick) says.
    pub fn tick(
        &mut self,
        seen: Option<&CpuSeen>,
        from: u64,
        epoch: u64,
    ) -> (Option<u64>, Option<u64>) {
        let Some(seen) = seen else {
            return (None, None);
        };
        // What it had counted when a window began: 0 if born since, else as last known.
        let (in_run, in_window) = (self.start_ns >= epoch, self.start_ns >= from);
        let cpu = self
            .cpu
            .tick(seen.first_ns, seen.last_ns, in_run, in_window);
        let queued = match (seen.first_queued, seen.last_queued) {
            (Some(first), Some(last)) => Some(self.queued.tick(first, last, in_run, in_window)),
            _ => None,
        };
        (Some(cpu), queued)
    }

    /// CPU time since the run's start, as last reported; None before any report.
    pub fn cpu_total(&self) -> Option<u64> {
        self.cpu.total()
    }

    /// Its time in the run `[epoch, now]`.
    pub fn in_run(&self, epoch_ns: u64, now_ns: u64) -> ThreadTime {
        ThreadTime {
            alive_ns: self.alive_within(epoch_ns, now_ns),
            cpu_ns: self.cpu_total(),
            queued_ns: self.queued.total(),
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
    pub fn note_cpu(&mut self, tid: ThreadId, cpu_ns: u64, queued_ns: Option<u64>, at_ns: u64) {
        if self.owners.contains_key(&tid) {
            self.cpu.note(tid, cpu_ns, queued_ns, at_ns);
        } else {
            self.early_cpu.note(tid, cpu_ns, queued_ns, at_ns);
        }
    }

    /// A reading at `now_ns` (boot-time clock) of the live threads' time: their CPU time as
    /// the kernel last reported it (see the module's doc), and every live thread's time since
    /// the last reading added to `interval` (idle threads too: they are alive in it, and the
    /// shares of their process and role count them).
    pub fn tick(&mut self, now_ns: u64, mut interval: Option<&mut Window>) {
        let (from, epoch) = (self.last_tick_ns, self.epoch_ns);
        if let Some(w) = interval.as_deref_mut() {
            w.expect_threads(self.threads.len() + self.bystanders.count());
        }
        self.tick_bystanders(now_ns, interval.as_deref_mut());
        for (&(owner, tid), info) in &mut self.threads {
            let life = &mut info.life;
            let alive = life.alive_within(from, now_ns);
            let (cpu, queued) = life.tick(self.cpu.get(tid), from, epoch);
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
                        queued_ns: queued,
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
#[path = "time_tests.rs"]
mod tests;
