//! The run's totals: each live thread's kernel entries mirrored one for one, which double as
//! the previous reading each new one is diffed against, and the exited threads' totals.
//!
//! One record per live thread holds its entries (a few kinds each), so that ten thousand
//! threads cost one small table and one small allocation each: a table keyed by the kernel's
//! (thread, kind) key was 65,536 buckets of 144 bytes for 10,000 threads of three kinds.

use std::collections::BTreeMap;

use profiler_common::{COMM_LEN, StatsKey, ThreadStats};
use rustc_hash::FxHashMap as HashMap;

use super::{
    Causes, ThreadAgg, ThreadDelta, Window,
    bystanders::Bystanders,
    ids_of,
    time::{CpuTimes, Life},
};
use crate::{
    registry::{cpus::CpuAllowance, roles::Decided},
    vocab::{
        hist::SideStats,
        ids::{ProcId, ThreadId},
    },
};

/// Who a live thread is, and its kernel entries' totals.
pub(super) struct ThreadInfo {
    /// The kernel's start times (ns) of the owner and the thread, to rebuild its keys.
    owner_start_ns: u64,
    tid_start_ns: u64,
    pub(super) tgid: u32,
    pub(super) comm: [u8; COMM_LEN],
    pub(super) fsbase: u64,
    /// Its entries' cumulative totals by kind (a write cause, read or downgrade).
    kinds: Causes,
    pub(super) life: Life,
}

/// The run's totals: live threads with their kernel entries (a reading of tens of thousands
/// of entries costs one hash lookup each), and exited threads.
pub struct Totals {
    pub(super) threads: HashMap<(ProcId, ThreadId), ThreadInfo>,
    /// The owners (processes whose locks) each live thread took.
    pub(super) owners: HashMap<ThreadId, smallvec::SmallVec<[ProcId; 1]>>,
    /// Threads whose kernel entries were deleted after they exited.
    pub(super) retired: Vec<(ProcId, ThreadId, ThreadAgg)>,
    /// Names, cgroups and executables of processes that are gone.
    names: BTreeMap<ProcId, String>,
    cgroups: BTreeMap<ProcId, String>,
    exes: BTreeMap<ProcId, String>,
    cpus: BTreeMap<ProcId, CpuAllowance>,
    /// Keep exited threads' totals (and gone processes' names) for the summary; a
    /// long-running agent does not.
    pub keep_retired: bool,
    /// The run's start and its last reading (boot-time clock, ns): threads' time is counted
    /// between them.
    pub(super) epoch_ns: u64,
    pub(super) last_tick_ns: u64,
    /// Exits noticed of threads not known yet (their last acquisitions are in the reading to
    /// come); forgotten at the next tick.
    pub(super) early_exits: HashMap<ThreadId, u64>,
    /// The kernel's reports of live threads' CPU time, and those of threads not known yet
    /// (their first entries are in the reading to come; forgotten at the next tick).
    pub(super) cpu: CpuTimes,
    pub(super) early_cpu: CpuTimes,
    /// The threads of profiled processes that are not profiled themselves: their time is
    /// their process's (`bystanders.rs`).
    pub(super) bystanders: Bystanders,
    /// The names threads took at an exec, for threads not known yet (the kernel named
    /// their entries as it first saw them, inside the exec, under the old image's name).
    renamed: HashMap<ThreadId, [u8; COMM_LEN]>,
}

/// Renames kept for threads not seen yet, at most (an exec's thread is nearly always seen
/// in the same reading).
const MAX_RENAMES: usize = 4096;

impl Default for Totals {
    /// Totals of a run starting now.
    fn default() -> Self {
        Totals::starting_at(crate::vocab::ids::boot_ns())
    }
}

impl Totals {
    /// Totals of a run that started at `epoch_ns` (boot-time clock: when the kernel began
    /// counting), the start of its threads' time.
    pub fn starting_at(epoch_ns: u64) -> Self {
        Totals {
            threads: HashMap::default(),
            owners: HashMap::default(),
            retired: Vec::new(),
            names: BTreeMap::new(),
            cgroups: BTreeMap::new(),
            exes: BTreeMap::new(),
            cpus: BTreeMap::new(),
            keep_retired: true,
            epoch_ns,
            last_tick_ns: epoch_ns,
            early_exits: HashMap::default(),
            cpu: CpuTimes::default(),
            early_cpu: CpuTimes::default(),
            bystanders: Bystanders::default(),
            renamed: HashMap::default(),
        }
    }

    /// Thread `tid` exec'd under the name `comm`: its entries, whenever the kernel named
    /// them (before the exec's rename, or as its parent before it), are its under that name.
    pub fn rename(&mut self, tid: ThreadId, comm: [u8; COMM_LEN]) {
        let mut known = false;
        for owner in self.owners.get(&tid).into_iter().flatten() {
            if let Some(info) = self.threads.get_mut(&(*owner, tid)) {
                info.comm = comm;
                known = true;
            }
        }
        if !known {
            if self.renamed.len() >= MAX_RENAMES {
                self.renamed.clear();
            }
            self.renamed.insert(tid, comm);
        }
    }

    /// Folds a kernel reading into the totals; returns what changed since the previous one.
    pub fn update(&mut self, snapshot: &[(StatsKey, ThreadStats)]) -> Vec<ThreadDelta> {
        let zero = SideStats::default();
        let mut out = Vec::new();
        for (key, cur) in snapshot {
            let (owner, tid) = ids_of(key);
            let fresh = cur.stats.count == 0 && cur.stats.failed == 0;
            let known = self.threads.contains_key(&(owner, tid));
            if fresh && !known {
                continue;
            }
            // A bystander of this process until now: its life so far goes on.
            let was_bystander = if known {
                None
            } else {
                self.take_bystander(owner, tid)
            };
            let info = self.threads.entry((owner, tid)).or_insert_with(|| {
                let thread_owners = self.owners.entry(tid).or_default();
                // A thread new to the totals: its CPU reports of this reading come with it.
                if thread_owners.is_empty()
                    && let Some(seen) = self.early_cpu.take(tid)
                {
                    self.cpu.insert(tid, seen);
                }
                thread_owners.push(owner);
                ThreadInfo {
                    owner_start_ns: key.owner_start,
                    tid_start_ns: key.tid_start,
                    tgid: cur.tgid,
                    comm: self.renamed.remove(&tid).unwrap_or(cur.comm),
                    fsbase: cur.fsbase,
                    kinds: Causes::default(),
                    life: was_bystander.map_or_else(
                        || Life::new(key.tid_start, self.early_exits.get(&tid).copied()),
                        |mut life| {
                            if let Some(&e) = self.early_exits.get(&tid) {
                                life.exit_ns.get_or_insert(e);
                            }
                            life
                        },
                    ),
                }
            });
            let prev = info.kinds.get(key.kind).unwrap_or(&zero);
            if prev.unchanged(&cur.stats) {
                continue;
            }
            let stats = SideStats::delta(&cur.stats, prev);
            info.kinds.entry(key.kind).merge(&stats);
            out.push(ThreadDelta {
                key: *key,
                tgid: cur.tgid,
                comm: info.comm,
                fsbase: cur.fsbase,
                stats,
            });
        }
        out
    }

    fn keys(
        owner: ProcId,
        tid: ThreadId,
        info: &ThreadInfo,
    ) -> impl Iterator<Item = StatsKey> + '_ {
        info.kinds.iter().map(move |(kind, _)| StatsKey {
            owner: owner.pid,
            tid: tid.tid,
            kind,
            _pad: 0,
            owner_start: info.owner_start_ns,
            tid_start: info.tid_start_ns,
        })
    }

    fn thread_agg(&self, info: &ThreadInfo) -> ThreadAgg {
        let mut t = ThreadAgg::new(info.tgid, info.comm, info.fsbase);
        for (kind, s) in info.kinds.iter() {
            t.kind_mut(kind).merge(s);
        }
        t.time = info.life.in_run(self.epoch_ns, self.last_tick_ns);
        t
    }

    /// What the kernel said of a live thread: (tgid, comm, fsbase).
    pub fn identity(&self, owner: ProcId, tid: ThreadId) -> Option<(u32, [u8; COMM_LEN], u64)> {
        self.threads
            .get(&(owner, tid))
            .map(|i| (i.tgid, i.comm, i.fsbase))
    }

    /// The kernel keys of a live thread's entries on `owner`'s lock.
    pub fn keys_of(&self, owner: ProcId, tid: ThreadId) -> Vec<StatsKey> {
        self.threads
            .get(&(owner, tid))
            .map(|info| Self::keys(owner, tid, info).collect())
            .unwrap_or_default()
    }

    /// Thread `tid` is gone and its kernel entries (every kind) were read one last time and
    /// deleted: keep its totals apart, with its `role`, so that nothing about it needs to stay
    /// cached.
    pub fn retire(&mut self, owner: ProcId, tid: ThreadId, role: Option<Decided>) {
        if let Some(o) = self.owners.get_mut(&tid) {
            o.retain(|x| *x != owner);
            if o.is_empty() {
                self.owners.remove(&tid);
                self.cpu.take(tid);
            }
        }
        if let Some(info) = self.threads.remove(&(owner, tid)) {
            let mut t = self.thread_agg(&info);
            t.role = role;
            t.lived_ns = info.life.lived_ns();
            if self.keep_retired {
                self.retired.push((owner, tid, t));
            }
        }
    }

    /// How long live thread `tid` (on `owner`'s lock) lived, once its exit was noticed.
    pub fn lived_ns(&self, owner: ProcId, tid: ThreadId) -> Option<u64> {
        self.threads.get(&(owner, tid))?.life.lived_ns()
    }

    /// The processes whose locks live thread `tid` took.
    pub fn owners_of(&self, tid: ThreadId) -> Vec<ProcId> {
        self.owners
            .get(&tid)
            .map(|o| o.to_vec())
            .unwrap_or_default()
    }

    /// Live (owner, thread, tgid) triples, to check which threads still exist.
    pub fn live_threads(&self) -> impl Iterator<Item = (ProcId, ThreadId, u32)> + '_ {
        self.threads
            .iter()
            .map(|(&(owner, tid), i)| (owner, tid, i.tgid))
    }

    /// Keeps the name of a process that is gone, for the reports still to come.
    pub fn name_process(&mut self, owner: ProcId, name: String) {
        if self.keep_retired {
            self.names.insert(owner, name);
        }
    }

    /// A gone process's cgroup, kept for the summary (like its name).
    pub fn cgroup_process(&mut self, owner: ProcId, cgroup: String) {
        if self.keep_retired {
            self.cgroups.insert(owner, cgroup);
        }
    }

    /// A gone process's executable, kept for the summary (like its name).
    pub fn exe_process(&mut self, owner: ProcId, exe: String) {
        if self.keep_retired {
            self.exes.insert(owner, exe);
        }
    }

    /// A gone process's CPU allowance, kept for the summary (like its name).
    pub fn cpus_process(&mut self, owner: ProcId, cpus: CpuAllowance) {
        if self.keep_retired {
            self.cpus.insert(owner, cpus);
        }
    }

    /// Kernel entries of live threads.
    pub fn live_entries(&self) -> usize {
        self.threads.values().map(|i| i.kinds.len()).sum()
    }

    /// Does any live thread of `owner` itself (not a foreign taker) have entries on its lock?
    pub fn has_own_live_threads(&self, owner: ProcId) -> bool {
        self.threads
            .iter()
            .any(|((o, _), info)| *o == owner && info.tgid == owner.pid)
    }

    /// The live threads with entries on `owner`'s lock.
    pub fn threads_on(&self, owner: ProcId) -> Vec<ThreadId> {
        self.threads
            .keys()
            .filter(|(o, _)| *o == owner)
            .map(|(_, t)| *t)
            .collect()
    }

    /// Everything since the start.
    pub fn window(&self) -> Window {
        let mut w = Window::default();
        for (&(owner, tid), info) in &self.threads {
            let t = self.thread_agg(info);
            w.add_thread(owner, tid, &t);
        }
        for (owner, tid, t) in &self.retired {
            w.add_thread(*owner, *tid, t);
        }
        self.bystanders_into(&mut w);
        w.names = self.names.clone();
        w.cgroups = self.cgroups.clone();
        w.exes = self.exes.clone();
        w.cpus = self.cpus.clone();
        w
    }
}
