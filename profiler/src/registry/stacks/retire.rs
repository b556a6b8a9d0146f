//! Forgetting what was kept for a process or a thread that has gone, once the records it made
//! before it went have been unwound: the stacks copier's backlog may still hold them when the
//! poll sees it exit (see `run::copier`). Where the backlog stands is counted in records, not
//! timed: a run loop far behind the kernel (an emulated host, a burst of every wait sampled)
//! still unwinds a process's last records with its unwinder, however long they waited.

use super::{HOLDER_KEY, ProcId, Reads, StackAttribution};

/// How long after a process or thread went the records it made are all copied out of the
/// kernel's ring: the stacks copier looks at the ring at least every 100 ms while records come.
pub(super) const RETIRE_AFTER: std::time::Duration = std::time::Duration::from_millis(150);

/// And at most, however far behind the unwinding is: a copier whose backlog stays full
/// (records waiting in the kernel's ring, where the copied count cannot see them) never sets
/// a mark, and a process's unwinder is not kept for ever.
pub(super) const RETIRE_AT_MOST: std::time::Duration = std::time::Duration::from_secs(120);

/// Where the sampled stacks' records stand, counted from the run's start in the order the
/// kernel wrote them: how many were copied out of the kernel's ring (None: not known to be
/// all it held, the copier's backlog being full), and how many were unwound.
#[derive(Clone, Copy, Debug, Default)]
pub struct Progress {
    pub copied: Option<u64>,
    pub unwound: u64,
}

/// A process or thread gone: since when, and once [`RETIRE_AFTER`] has passed, how many
/// records had been copied by then (its last records among them): it goes once as many
/// have been unwound.
#[derive(Clone, Copy, Debug)]
pub(super) struct Retiring<K> {
    pub(super) who: K,
    since: std::time::Instant,
    mark: Option<u64>,
}

impl<K> Retiring<K> {
    fn new(who: K) -> Self {
        Retiring {
            who,
            since: std::time::Instant::now(),
            mark: None,
        }
    }

    /// Whether its records have all been unwound by `at` (marking where they end once they
    /// are all copied).
    fn due(&mut self, at: Progress, now: std::time::Instant) -> bool {
        let age = now.saturating_duration_since(self.since);
        if self.mark.is_none() && age >= RETIRE_AFTER {
            self.mark = at.copied;
        }
        self.mark.is_some_and(|m| at.unwound >= m) || age >= RETIRE_AT_MOST
    }
}

/// Splits `items` into those due at `at` (returned) and those kept.
fn take_due<K>(
    items: &mut Vec<Retiring<K>>,
    at: Progress,
    now: std::time::Instant,
) -> Vec<Retiring<K>> {
    let (mut gone, mut kept) = (Vec::new(), Vec::new());
    for mut r in std::mem::take(items) {
        if r.due(at, now) {
            gone.push(r);
        } else {
            kept.push(r);
        }
    }
    *items = kept;
    gone
}

impl StackAttribution {
    /// A process that exited. Its records may still wait in the backlog (the run loop
    /// unwinds behind the kernel when it is busy): its unwinder stays, so that they are
    /// unwound and named as the others, until the backlog has been unwound past its exit
    /// ([`retire_due`](Self::retire_due)). What its unwinders read of it is returned now,
    /// for the run's summary (a process gone is read no more).
    pub fn forget_process(&mut self, p: ProcId) -> Reads {
        let read = self.reads(p);
        self.retiring.retain(|r| r.who != p);
        self.retiring.push(Retiring::new(p));
        read
    }

    /// A process that exec'd: what was learnt of its old image goes at once (its next
    /// records are of the new image, under the same [`ProcId`]).
    pub fn forget_image(&mut self, p: ProcId) -> Reads {
        let read = self.reads(p);
        self.retiring.retain(|r| r.who != p);
        self.forget_now(p);
        read
    }

    /// Forgets the processes and threads whose records (those copied [`RETIRE_AFTER`] after
    /// they went) have all been unwound by `at`, or gone [`RETIRE_AT_MOST`] ago in any case.
    pub fn retire_due(&mut self, at: Progress) {
        self.retire_due_at(at, std::time::Instant::now());
    }

    pub(super) fn retire_due_at(&mut self, at: Progress, now: std::time::Instant) {
        for t in take_due(&mut self.retiring_threads, at, now) {
            self.forget_thread_now(t.who);
        }
        for p in take_due(&mut self.retiring, at, now) {
            self.forget_now(p.who);
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
        let had_v8 = (self.unwinders.get(&p))
            .is_some_and(|u| u.as_ref().is_some_and(|u| u.v8.is_some()))
            | self.early_v8.remove(&p).unwrap_or(false);
        self.unwinders.retain(|&a, _| !gone(a));
        // Its layout goes from the kernel side, unless a later process has its pid.
        let later = self.unwinders.keys().any(|a| a.pid == p.pid)
            || (self.early_v8.iter()).any(|(a, given)| *given && a.pid == p.pid);
        if had_v8 && !later {
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
        self.retiring_threads.retain(|r| r.who != tid);
        self.retiring_threads.push(Retiring::new(tid));
    }

    pub(super) fn forget_thread_now(&mut self, tid: u32) {
        self.flush();
        let before = self.pending.len();
        self.pending.retain(|&(t, _), _| t & !HOLDER_KEY != tid);
        self.unmatched += (before - self.pending.len()) as u64;
    }
}
