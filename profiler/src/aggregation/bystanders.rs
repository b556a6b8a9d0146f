//! Bystanders: the threads of a profiled process that are not profiled themselves (they took
//! none of its profiled locks in full mode; in contention mode, never waited). They hold no
//! entry in the kernel's maps, but their time alive and on CPU is the process's all the
//! same: a 32-thread process whose 8 threads took the lock spends the time of 32, and its
//! lock's cost is a share of that (`time_share`). The kernel side reports their CPU time at
//! each pass of its iterator and their exit, with their process's start and their name (their
//! role is told by their ids and name: their start routine is not read, which would take the
//! process's lock).
//!
//! A bystander that later takes a profiled lock becomes a profiled thread with the life
//! counted so far (`Totals::update`); one that exits is retired at the next tick, with its
//! role, among the run's exited threads.

use std::collections::HashSet;

use profiler_common::COMM_LEN;
use rustc_hash::FxHashMap as HashMap;

use super::{
    ThreadAgg, Totals, Window,
    time::{CpuTimes, Life},
};
use crate::{
    registry::roles::Role,
    vocab::ids::{ProcId, ThreadId},
};

/// What the kernel side said of a bystander: at an iterator pass (alive) or at its exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BystanderSeen {
    pub thread: ThreadId,
    /// Its start, ns since boot (the clock of the kernel's times).
    pub start_ns: u64,
    pub owner: ProcId,
    pub tgid: u32,
    pub comm: [u8; COMM_LEN],
    /// As its ids and name tell (`other` when they do not).
    pub role: Role,
    pub cpu_ns: u64,
    /// Its run-queue delay so far (None where the kernel keeps none).
    pub queued_ns: Option<u64>,
    /// When the kernel read it (ns since boot).
    pub at_ns: u64,
    /// Seen at its exit: its life ends at `at_ns`.
    pub exited: bool,
}

/// One bystander's life so far.
#[derive(Clone, Debug)]
struct Bystander {
    owner: ProcId,
    tgid: u32,
    comm: [u8; COMM_LEN],
    role: Role,
    life: Life,
}

/// The live bystanders and their CPU reports.
#[derive(Debug, Default)]
pub struct Bystanders {
    live: HashMap<ThreadId, Bystander>,
    cpu: CpuTimes,
    /// Retired at the last tick and the one before: the exit's second copy may send its
    /// notice again, which must not bring the thread back.
    retired: [HashSet<ThreadId>; 2],
}

impl Bystanders {
    pub fn count(&self) -> usize {
        self.live.len()
    }
}

impl Totals {
    /// The kernel side reported a bystander. One that is profiled on its own process's lock
    /// after all (the report crossed its first entries) is counted as such.
    pub fn note_bystander(&mut self, b: &BystanderSeen) {
        if self.threads.contains_key(&(b.owner, b.thread)) {
            self.note_cpu(b.thread, b.cpu_ns, b.queued_ns, b.at_ns);
            if b.exited {
                self.note_exit(b.thread, b.at_ns);
            }
            return;
        }
        let by = &mut self.bystanders;
        if by.retired.iter().any(|r| r.contains(&b.thread)) {
            return;
        }
        let e = by.live.entry(b.thread).or_insert_with(|| Bystander {
            owner: b.owner,
            tgid: b.tgid,
            comm: b.comm,
            role: b.role,
            life: Life::new(b.start_ns, None),
        });
        // Its latest name and role (a thread names itself after it starts).
        e.comm = b.comm;
        e.role = b.role;
        if b.exited {
            e.life.exit_ns.get_or_insert(b.at_ns);
        }
        by.cpu.note(b.thread, b.cpu_ns, b.queued_ns, b.at_ns);
    }

    /// A thread new to the totals on `owner`'s lock: its life so far if it was a bystander of
    /// that process (its CPU reports move with it).
    pub(super) fn take_bystander(&mut self, owner: ProcId, tid: ThreadId) -> Option<Life> {
        let by = &mut self.bystanders;
        if by.live.get(&tid).is_none_or(|b| b.owner != owner) {
            return None;
        }
        let b = by.live.remove(&tid)?;
        if let Some(seen) = by.cpu.take(tid) {
            self.cpu.insert(tid, seen);
        }
        Some(b.life)
    }

    /// A reading's tick for the bystanders: their time since the last one added to
    /// `interval` (each with its role), and those that exited retired.
    pub(super) fn tick_bystanders(&mut self, now_ns: u64, mut interval: Option<&mut Window>) {
        let (from, epoch) = (self.last_tick_ns, self.epoch_ns);
        let by = &mut self.bystanders;
        let mut gone = Vec::new();
        for (&tid, b) in &mut by.live {
            let alive = b.life.alive_within(from, now_ns);
            let (cpu, queued) = b.life.tick(by.cpu.get(tid), from, epoch);
            if let Some(w) = interval.as_deref_mut() {
                w.add_bystander_time(
                    b.owner,
                    tid,
                    (b.tgid, b.comm, b.role),
                    &super::ThreadTime {
                        alive_ns: alive,
                        cpu_ns: cpu,
                        queued_ns: queued,
                    },
                );
            }
            if b.life.exit_ns.is_some_and(|e| e <= now_ns) {
                gone.push(tid);
            }
        }
        by.retired.rotate_left(1);
        by.retired[1].clear();
        for tid in gone {
            let Some(b) = by.live.remove(&tid) else {
                continue;
            };
            by.cpu.take(tid);
            by.retired[1].insert(tid);
            if self.keep_retired {
                let mut t = bystander_agg(&b, b.life.in_run(epoch, now_ns));
                t.lived_ns = b.life.lived_ns();
                self.retired.push((b.owner, tid, t));
            }
        }
    }

    /// The live bystanders, for the run's window (their time since the run began).
    pub(super) fn bystanders_into(&self, w: &mut Window) {
        for (&tid, b) in &self.bystanders.live {
            let t = bystander_agg(b, b.life.in_run(self.epoch_ns, self.last_tick_ns));
            w.add_thread(b.owner, tid, &t);
        }
    }

    /// `owner` is gone: its bystanders still listed (their exit notices lost) end now.
    pub fn end_bystanders_of(&mut self, owner: ProcId, now_ns: u64) {
        for b in self.bystanders.live.values_mut() {
            if b.owner == owner {
                b.life.exit_ns.get_or_insert(now_ns);
            }
        }
    }

    /// Live bystanders.
    #[cfg(test)]
    pub fn bystanders(&self) -> usize {
        self.bystanders.count()
    }
}

/// A bystander as a thread of its process's window: no acquisition, its time and its role.
fn bystander_agg(b: &Bystander, time: super::ThreadTime) -> ThreadAgg {
    let mut t = ThreadAgg::new(b.tgid, b.comm, 0);
    t.role = Some(b.role.into());
    t.time = time;
    t
}

#[cfg(test)]
#[path = "bystanders_tests.rs"]
mod tests;
