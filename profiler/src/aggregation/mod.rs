//! Turns the kernel's cumulative per-(process, thread, kind) counters into per-interval deltas,
//! and keeps the run's totals.
//!
//! The totals of live threads mirror the kernel's entries exactly, so they double as "the
//! previous reading" that each new reading is diffed against: no second copy of the kernel
//! map is kept. Histograms are sparse (a thread typically fills a handful of its 40 log2
//! buckets), which keeps memory small with tens of thousands of threads.
//!
//! The kernel keeps exact log2 bucket counts, sums and all-time maxima; percentiles are
//! computed from the buckets through an hdrhistogram at report time (their resolution is the
//! log2 bucket: each bucket is recorded at its midpoint, clamped to the observed maximum).

use std::collections::BTreeMap;

use profiler_common::{COMM_LEN, StatsKey, cause};

use crate::{
    registry::roles::{Decided, Role},
    vocab::ids::{ProcId, ThreadId, ticks_of_ns},
};

mod attribution;
pub mod blocked;
pub mod bystanders;
pub mod time;
mod totals;

#[cfg(test)]
use crate::vocab::hist::bucket_lower_ns;
pub use crate::vocab::hist::{
    DurationHist, MAX_BUCKET_COUNT, SideStats, bucket_of_upper, bucket_upper_ns,
};
pub use attribution::Attribution;
pub use bystanders::BystanderSeen;
pub use time::ThreadTime;
pub use totals::Totals;

/// What one thread did to one process's lock, for one kind, since the previous reading.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadDelta {
    pub key: StatsKey,
    /// Process of the acting thread.
    pub tgid: u32,
    pub comm: [u8; COMM_LEN],
    pub fsbase: u64,
    pub stats: SideStats,
}

/// Acquisitions by kind (a write cause of `profiler_common::cause`, or read or downgrade),
/// ascending: a thread uses a few, so a small sorted vector grown one at a time (a map node
/// would be ten times the size).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Causes(Vec<(u32, SideStats)>);

impl Causes {
    pub fn get(&self, cause: u32) -> Option<&SideStats> {
        self.0.iter().find(|c| c.0 == cause).map(|c| &c.1)
    }

    pub fn entry(&mut self, cause: u32) -> &mut SideStats {
        let pos = match self.0.binary_search_by_key(&cause, |c| c.0) {
            Ok(p) => p,
            Err(p) => {
                self.0.reserve_exact(1);
                self.0.insert(p, (cause, SideStats::default()));
                p
            }
        };
        &mut self.0[pos].1
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = (u32, &SideStats)> {
        self.0.iter().map(|(c, s)| (*c, s))
    }
}

/// One thread's activity on one process's lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadAgg {
    pub tgid: u32,
    pub comm: [u8; COMM_LEN],
    pub fsbase: u64,
    /// Real read acquisitions.
    pub read: SideStats,
    pub writes: Causes,
    /// Write locks downgraded to read (not acquisitions; hold = the read hold after).
    pub downgrade: SideStats,
    /// Decided when the thread was retired (its caches are gone by the report).
    pub role: Option<Decided>,
    /// Its time alive and on CPU in the window (the denominators of its time share).
    pub time: ThreadTime,
    /// It exited: how long it lived, from its start to its exit (not clipped to the window:
    /// a report groups the short-lived ones).
    pub lived_ns: Option<u64>,
}

impl ThreadAgg {
    pub(super) fn new(tgid: u32, comm: [u8; COMM_LEN], fsbase: u64) -> Self {
        ThreadAgg {
            tgid,
            comm,
            fsbase,
            read: SideStats::default(),
            writes: Causes::default(),
            downgrade: SideStats::default(),
            role: None,
            time: ThreadTime::default(),
            lived_ns: None,
        }
    }

    /// Took no lock in the window (listed only for its time).
    pub fn is_idle(&self) -> bool {
        self.read.is_empty() && self.downgrade.is_empty() && self.writes.0.is_empty()
    }

    /// The stats of a kernel entry's `kind` (a spill entry's count under its kind).
    fn kind_mut(&mut self, kind: u32) -> &mut SideStats {
        match cause::base(kind) {
            cause::READ => &mut self.read,
            cause::DOWNGRADE => &mut self.downgrade,
            k => self.writes.entry(k),
        }
    }

    /// All writes, whatever their cause.
    pub fn write(&self) -> SideStats {
        let mut w = SideStats::default();
        for (_, s) in self.writes.iter() {
            w.merge(s);
        }
        w
    }

    pub fn merge(&mut self, o: &ThreadAgg) {
        self.read.merge(&o.read);
        self.downgrade.merge(&o.downgrade);
        for (k, s) in o.writes.iter() {
            self.writes.entry(k).merge(s);
        }
        if self.role.is_none() {
            self.role.clone_from(&o.role);
        }
        self.time.merge(&o.time);
        self.lived_ns = self.lived_ns.or(o.lived_ns);
    }
}

/// A thread's entry made for its time alone: a bystander's carries its role.
fn idle_agg(tgid: u32, comm: [u8; COMM_LEN], fsbase: u64, role: Option<Role>) -> ThreadAgg {
    let mut t = ThreadAgg::new(tgid, comm, fsbase);
    t.role = role.map(Into::into);
    t
}

/// The process and thread of a kernel key.
pub fn ids_of(key: &StatsKey) -> (ProcId, ThreadId) {
    (
        ProcId::new(key.owner, ticks_of_ns(key.owner_start)),
        ThreadId::new(key.tid, ticks_of_ns(key.tid_start)),
    )
}

/// Activity per process (owner of the lock), then per thread.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Window {
    pub processes: BTreeMap<ProcId, BTreeMap<ThreadId, ThreadAgg>>,
    /// Names of processes that are gone (live ones are looked up when reporting).
    pub names: BTreeMap<ProcId, String>,
    /// Cgroups and executables of processes that are gone, likewise.
    pub cgroups: BTreeMap<ProcId, String>,
    pub exes: BTreeMap<ProcId, String>,
    /// And the CPUs they could use.
    pub cpus: BTreeMap<ProcId, crate::registry::cpus::CpuAllowance>,
    /// Waits charged to the holds that made them wait; None when blockers are off.
    pub blocked: Option<blocked::Blocked>,
    /// The time of live threads whose process took no lock in the window so far, kept apart
    /// until [`settle`](Self::settle) says whether it is wanted: ten thousand idle threads
    /// made a thread entry each, every second, for a report that lists none of them. A plain
    /// list, reserved whole at each reading (a thread is listed once per reading; settling
    /// merges them): a table grown by doubling held twice as much, and its old halves too.
    idle: Vec<IdleThread>,
}

/// A live thread's time in a window, while its process took no lock in it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct IdleThread {
    owner: ProcId,
    tid: ThreadId,
    tgid: u32,
    comm: [u8; COMM_LEN],
    fsbase: u64,
    time: ThreadTime,
    /// A bystander's role (its ids and name tell it); None for a profiled thread, whose role
    /// the registry knows.
    role: Option<Role>,
}

impl Window {
    /// Room for the time of `n` more threads (a reading's live threads), in one allocation.
    pub fn expect_threads(&mut self, n: usize) {
        self.idle.reserve_exact(n);
    }

    /// Adds a live thread's time in the window (see [`Totals::tick`]).
    pub fn add_time(
        &mut self,
        owner: ProcId,
        tid: ThreadId,
        identity: (u32, [u8; COMM_LEN], u64),
        time: &ThreadTime,
    ) {
        self.add_idle(owner, tid, identity, time, None);
    }

    /// Adds a bystander's time in the window (see `bystanders`), with its role.
    pub fn add_bystander_time(
        &mut self,
        owner: ProcId,
        tid: ThreadId,
        (tgid, comm, role): (u32, [u8; COMM_LEN], Role),
        time: &ThreadTime,
    ) {
        self.add_idle(owner, tid, (tgid, comm, 0), time, Some(role));
    }

    fn add_idle(
        &mut self,
        owner: ProcId,
        tid: ThreadId,
        (tgid, comm, fsbase): (u32, [u8; COMM_LEN], u64),
        time: &ThreadTime,
        role: Option<Role>,
    ) {
        match self.processes.get_mut(&owner) {
            Some(threads) => threads
                .entry(tid)
                .or_insert_with(|| idle_agg(tgid, comm, fsbase, role))
                .time
                .merge(time),
            None => self.idle.push(IdleThread {
                owner,
                tid,
                tgid,
                comm,
                fsbase,
                time: *time,
                role,
            }),
        }
    }

    /// Puts the time kept apart where it belongs: with the threads of the processes that
    /// took a lock in the window, and, when `all`, for every other process too (the agent's
    /// metrics count every live thread's time; a report lists only processes that took a
    /// lock). A process known only by its bystanders (threads that never took a profiled
    /// lock) is not added: it is in no report, nor in the agent's metrics.
    pub fn settle(&mut self, all: bool) {
        let mut idle = std::mem::take(&mut self.idle);
        // Profiled threads first: they make the processes bystanders may join.
        idle.sort_by_key(|t| t.role.is_some());
        for t in idle {
            let (owner, tid) = (t.owner, t.tid);
            let threads = match self.processes.get_mut(&owner) {
                Some(threads) => threads,
                None if all && t.role.is_none() => self.processes.entry(owner).or_default(),
                None => continue,
            };
            threads
                .entry(tid)
                .or_insert_with(|| idle_agg(t.tgid, t.comm, t.fsbase, t.role))
                .time
                .merge(&t.time);
        }
    }

    /// Keeps the processes that took a lock in the window (or were charged a wait), with
    /// their threads' time: the ones a report lists.
    pub fn retain_active(&mut self) {
        self.settle(false);
        let blocked = self.blocked.as_ref();
        self.processes.retain(|p, threads| {
            threads.values().any(|t| !t.is_idle())
                || blocked.is_some_and(|b| b.owners.get(p).is_some_and(|o| !o.is_empty()))
        });
    }

    pub fn add(&mut self, d: &ThreadDelta) {
        let (owner, tid) = ids_of(&d.key);
        self.processes
            .entry(owner)
            .or_default()
            .entry(tid)
            .or_insert_with(|| ThreadAgg::new(d.tgid, d.comm, d.fsbase))
            .kind_mut(d.key.kind)
            .merge(&d.stats);
    }

    /// Adds a whole thread's activity.
    pub fn add_thread(&mut self, owner: ProcId, tid: ThreadId, t: &ThreadAgg) {
        self.processes
            .entry(owner)
            .or_default()
            .entry(tid)
            .and_modify(|x| x.merge(t))
            .or_insert_with(|| t.clone());
    }
}

#[cfg(test)]
mod tests;
