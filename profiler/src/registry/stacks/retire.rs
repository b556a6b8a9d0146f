//! Forgetting what was kept for a process or a thread that has gone, once the records it made
//! before it went have been unwound: the stacks copier's backlog may still hold them when the
//! poll sees it exit (see `run::copier`).

use super::{HOLDER_KEY, ProcId, Reads, StackAttribution};

/// How long a process gone keeps its unwinder at least: the stacks copier looks at the ring
/// every 25 ms, so records made before the exit are in the backlog by then.
pub(super) const RETIRE_AFTER: std::time::Duration = std::time::Duration::from_millis(100);

/// And at most, however far behind the unwinding is.
pub(super) const RETIRE_AT_MOST: std::time::Duration = std::time::Duration::from_secs(10);

impl StackAttribution {
    /// A process that exited. Its records may still wait in the backlog (the run loop
    /// unwinds behind the kernel when it is busy): its unwinder stays, so that they are
    /// unwound and named as the others, until the backlog has been unwound past its exit
    /// ([`retire_due`](Self::retire_due)). What its unwinders read of it is returned now,
    /// for the run's summary (a process gone is read no more).
    pub fn forget_process(&mut self, p: ProcId) -> Reads {
        let read = self.reads(p);
        self.retiring.retain(|(q, _)| *q != p);
        self.retiring.push((p, std::time::Instant::now()));
        read
    }

    /// A process that exec'd: what was learnt of its old image goes at once (its next
    /// records are of the new image, under the same [`ProcId`]).
    pub fn forget_image(&mut self, p: ProcId) -> Reads {
        let read = self.reads(p);
        self.retiring.retain(|(q, _)| *q != p);
        self.forget_now(p);
        read
    }

    /// Forgets the processes and threads gone [`RETIRE_AFTER`] ago once the backlog is unwound
    /// (`caught_up`), or [`RETIRE_AT_MOST`] ago in any case (a run loop that never catches up
    /// keeps no unwinder for ever).
    pub fn retire_due(&mut self, caught_up: bool) {
        self.retire_due_at(caught_up, std::time::Instant::now());
    }

    pub(super) fn retire_due_at(&mut self, caught_up: bool, now: std::time::Instant) {
        let due = |since: std::time::Instant| {
            let age = now.saturating_duration_since(since);
            (caught_up && age >= RETIRE_AFTER) || age >= RETIRE_AT_MOST
        };
        let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.retiring)
            .into_iter()
            .partition(|&(_, since)| due(since));
        self.retiring = kept;
        let (threads, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.retiring_threads)
            .into_iter()
            .partition(|&(_, since)| due(since));
        self.retiring_threads = kept;
        for (tid, _) in threads {
            self.forget_thread_now(tid);
        }
        for (p, _) in gone {
            self.forget_now(p);
        }
    }

    /// Its stacks are symbolized now, then its unwinder (the memory of this module) is
    /// dropped, with its samples still waiting for an outcome (counted as `unmatched`). The
    /// unwinder of a foreign taker with the same pid, whose start time is not known, goes
    /// too.
    pub(super) fn forget_now(&mut self, p: ProcId) {
        self.flush();
        let gone = |a: ProcId| a == p || a == ProcId::new(p.pid, 0);
        self.symbolize_where(gone);
        let had_v8 =
            (self.unwinders.get(&p)).is_some_and(|u| u.as_ref().is_some_and(|u| u.v8.is_some()));
        self.unwinders.retain(|&a, _| !gone(a));
        // Its layout goes from the kernel side, unless a later process has its pid.
        if had_v8 && !self.unwinders.keys().any(|a| a.pid == p.pid) {
            self.v8_frames.push((p.pid, None));
        }
        let before = self.pending.len();
        self.pending.retain(|_, s| !gone(s.actor));
        self.unmatched += (before - self.pending.len()) as u64;
    }

    /// A thread that exited. The outcomes of its last samples may still wait in the
    /// backlog (the poll that saw it exit ran while the copier had not yet copied them): its
    /// samples are kept until the backlog is unwound past its exit, as a process's unwinder
    /// is ([`retire_due`](Self::retire_due)), then those still waiting for an outcome are
    /// dropped (counted as `unmatched`), so that a reused tid cannot be given them.
    pub fn forget_thread(&mut self, tid: u32) {
        self.retiring_threads.retain(|(t, _)| *t != tid);
        self.retiring_threads.push((tid, std::time::Instant::now()));
    }

    pub(super) fn forget_thread_now(&mut self, tid: u32) {
        self.flush();
        let before = self.pending.len();
        self.pending.retain(|&(t, _), _| t & !HOLDER_KEY != tid);
        self.unmatched += (before - self.pending.len()) as u64;
    }
}
