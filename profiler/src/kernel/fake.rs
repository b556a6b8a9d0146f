//! A scripted kernel for unit tests: the maps, rings and /proc of a few made-up processes,
//! changed by the test between two readings (a thread takes a lock, exits, is reaped; a pid
//! is reused), so that a profile's lifecycle runs on synthetic readings and its results are
//! checked against exact counts. It keeps the real kernel's rules: entries are cumulative and
//! only userspace deletes them, a reading sees the entries changed since the previous one
//! (every entry when asked), notices come in the order they were sent, and /proc tells a
//! thread by its tid *and* start time.
//!
//! Its ids are above the kernel's largest `pid_max` (2^22), so that nothing in the registry
//! (which reads the real /proc) ever finds one of them alive.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use profiler_common::{
    BlockedKey, BlockedVal, COMM_LEN, ExitedThread, StatsKey, ThreadCpu, ThreadStats, V8Frames,
    bucket_index, exit_record,
};

use super::{
    Kernel,
    collector::{CollectorError, Counters, ProgramStats},
    load::LoadReport,
    selection::{How, Selected},
};
use crate::vocab::ids::{Presence, ProcId, ThreadId, ticks_of_ns};

/// The first tid given to a thread that is not a process's main thread.
const FIRST_TID: u32 = 6_000_000;

/// Each acquisition waits this long and holds the lock this long (ns).
pub const WAIT_NS: u64 = 100;
pub const HOLD_NS: u64 = 1_000;

/// A thread of the fake kernel: its process (pid and start) and itself (tid and start).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Task {
    pub tgid: u32,
    pub tid: u32,
    pub start_ns: u64,
    /// Its process's start (its main thread's).
    pub proc_start_ns: u64,
    comm: [u8; COMM_LEN],
}

impl Task {
    pub fn thread(&self) -> ThreadId {
        ThreadId::new(self.tid, ticks_of_ns(self.start_ns))
    }

    pub fn process(&self) -> ProcId {
        ProcId::new(self.tgid, ticks_of_ns(self.proc_start_ns))
    }

    /// The kernel's key of this thread's entry for `kind` on `owner`'s lock.
    pub fn key_on(&self, owner: &Task, kind: u32) -> StatsKey {
        StatsKey {
            owner: owner.tgid,
            tid: self.tid,
            kind,
            _pad: 0,
            owner_start: owner.proc_start_ns,
            tid_start: self.start_ns,
        }
    }
}

/// The kernel, its maps and rings, and /proc, as a test scripts them.
pub struct FakeKernel {
    attached_ns: u64,
    now_ns: u64,
    next_tid: u32,
    blockers: bool,
    stats: BTreeMap<StatsKey, ThreadStats>,
    dirty: BTreeSet<StatsKey>,
    notices: Vec<ExitedThread>,
    /// Notices sent while the next reading of the stats map runs (after it has begun).
    notices_in_reading: Vec<ExitedThread>,
    cpu: Vec<ThreadCpu>,
    blocked: BTreeMap<BlockedKey, BlockedVal>,
    /// /proc: (pid, tid) -> (start ticks, zombie).
    tasks: HashMap<(u32, u32), (u64, bool)>,
    /// The health counters (a test raises `exits_lost` when it drops a notice).
    pub counters: Counters,
    /// Every entry the profile deleted, in order: a thread retired twice shows twice.
    pub removed: Vec<StatsKey>,
    pub removed_blocked: Vec<BlockedKey>,
    /// Processes the profile took out of the kernel's selection (pid, start ticks).
    pub deselected: Vec<(u32, u64)>,
    /// V8 frame layouts set (and, None, unset) for the kernel side, in order.
    pub v8_frames: Vec<(u32, Option<V8Frames>)>,
    /// SharedFunctionInfos noted as named, by process.
    pub v8_named: Vec<(u32, u64)>,
    /// The kernel's selection (`SELECTED`), as the test's kernel made it.
    pub selection: Vec<Selected>,
    /// Readings of the stats map so far.
    pub readings: u32,
}

impl FakeKernel {
    /// A kernel whose programs were just attached; `blockers`: it charges waits to holders.
    pub fn new(blockers: bool) -> Self {
        // A clock far from zero, in whole seconds: every start time is its own tick.
        let now = 1_000_000_000_000;
        FakeKernel {
            attached_ns: now,
            now_ns: now,
            next_tid: FIRST_TID,
            blockers,
            stats: BTreeMap::new(),
            dirty: BTreeSet::new(),
            notices: Vec::new(),
            notices_in_reading: Vec::new(),
            cpu: Vec::new(),
            blocked: BTreeMap::new(),
            tasks: HashMap::new(),
            counters: Counters::default(),
            removed: Vec::new(),
            removed_blocked: Vec::new(),
            deselected: Vec::new(),
            v8_frames: Vec::new(),
            v8_named: Vec::new(),
            selection: Vec::new(),
            readings: 0,
        }
    }

    /// A second passes.
    fn tick(&mut self) -> u64 {
        self.now_ns += 1_000_000_000;
        self.now_ns
    }

    /// A new process `pid` named `name` (a pid freed before may be given again): its main
    /// thread.
    pub fn spawn_process(&mut self, pid: u32, name: &str) -> Task {
        assert!(pid > 1 << 22, "a made-up pid, never a real one");
        let start = self.tick();
        let mut comm = [0u8; COMM_LEN];
        comm[..name.len()].copy_from_slice(name.as_bytes());
        let t = Task {
            tgid: pid,
            tid: pid,
            start_ns: start,
            proc_start_ns: start,
            comm,
        };
        self.tasks.insert((pid, pid), (ticks_of_ns(start), false));
        t
    }

    /// The kernel selects `t`'s process (`how`, by selector number + 1 `selector`; by a
    /// rule unless neither says one).
    pub fn select(&mut self, t: &Task, how: How, selector: u8) {
        let p = t.process();
        self.selection.retain(|s| s.pid != p.pid);
        self.selection.push(Selected {
            pid: p.pid,
            ticks: p.start,
            by_rule: selector != 0 || how != How::Set,
            how,
            selector,
        });
    }

    /// A new thread of `of`'s process, named `name` (a runtime names its threads).
    pub fn spawn_thread(&mut self, of: &Task, name: &str) -> Task {
        let start = self.tick();
        let mut comm = [0u8; COMM_LEN];
        comm[..name.len()].copy_from_slice(name.as_bytes());
        let t = Task {
            tid: self.next_tid,
            start_ns: start,
            comm,
            ..*of
        };
        self.next_tid += 1;
        self.tasks
            .insert((t.tgid, t.tid), (ticks_of_ns(start), false));
        t
    }

    /// `n` acquisitions of `kind` by `t` on its own process's lock, flushed into the map.
    pub fn take(&mut self, t: &Task, kind: u32, n: u64) {
        self.take_on(t, t, kind, n);
    }

    /// `n` acquisitions of `kind` by `t` on the lock of `owner`'s process (another's, for a
    /// foreign taker), flushed into the map.
    pub fn take_on(&mut self, t: &Task, owner: &Task, kind: u32, n: u64) {
        let key = t.key_on(owner, kind);
        let e = self.stats.entry(key).or_insert(ThreadStats {
            tgid: t.tgid,
            comm: t.comm,
            ..ThreadStats::ZERO
        });
        let s = &mut e.stats;
        s.count += n;
        s.wait_sum += n * WAIT_NS;
        s.hold_sum += n * HOLD_NS;
        s.wait_max = WAIT_NS;
        s.hold_max = HOLD_NS;
        s.wait_hist[bucket_index(WAIT_NS)] += n as u32;
        s.hold_hist[bucket_index(HOLD_NS)] += n as u32;
        self.dirty.insert(key);
    }

    /// Sends an exit notice (an [`exit_record`] tag) for `t`.
    pub fn notice(&mut self, t: &Task, tag: u32) {
        let at_ns = self.tick();
        self.notices.push(ExitedThread {
            tag,
            tid: t.tid,
            tgid: t.tgid,
            _pad: 0,
            tid_start: t.start_ns,
            cpu_ns: 0,
            queued_ns: 0,
            at_ns,
            cgroup_id: 0,
            owner_start: 0,
            comm: [0; COMM_LEN],
        });
    }

    /// The iterator's next pass reports `t`'s CPU time, `cpu_ns`: a profiled thread's, or,
    /// with `bystander`, that of a thread of a profiled process that is not profiled itself.
    pub fn report_cpu(&mut self, t: &Task, cpu_ns: u64, bystander: bool) {
        let at_ns = self.now_ns;
        self.cpu.push(ThreadCpu {
            tid: t.tid,
            tgid: t.tgid,
            tid_start: t.start_ns,
            cpu_ns,
            queued_ns: 0,
            at_ns,
            owner_start: if bystander { t.proc_start_ns } else { 0 },
            comm: t.comm,
            flags: if bystander {
                profiler_common::thread_cpu::BYSTANDER
            } else {
                0
            },
            _pad: 0,
        });
    }

    /// A bystander `t` (see [`report_cpu`](Self::report_cpu)) exits, having run `cpu_ns`: its
    /// exit notice, and /proc no longer shows it.
    pub fn bystander_exit(&mut self, t: &Task, cpu_ns: u64) {
        let at_ns = self.tick();
        self.notices.push(ExitedThread {
            tag: exit_record::BYSTANDER,
            tid: t.tid,
            tgid: t.tgid,
            _pad: 0,
            tid_start: t.start_ns,
            cpu_ns,
            queued_ns: 0,
            at_ns,
            cgroup_id: 0,
            owner_start: t.proc_start_ns,
            comm: t.comm,
        });
        self.tasks.remove(&(t.tgid, t.tid));
    }

    /// `t`'s process execs an image named `comm` (its EXEC notice, with the new name).
    pub fn notice_exec(&mut self, t: &Task, comm: &str) {
        self.notice(t, exit_record::EXEC);
        let n = self.notices.last_mut().expect("just pushed");
        n.comm[..comm.len()].copy_from_slice(comm.as_bytes());
    }

    /// Does what `f` does to the kernel, its notices sent while the next reading runs: what
    /// that reading reads was flushed before they came (an exec's own writes before its
    /// notice).
    pub fn during_next_reading(&mut self, f: impl FnOnce(&mut Self)) {
        let before = self.notices.len();
        f(self);
        let sent = self.notices.split_off(before);
        self.notices_in_reading.extend(sent);
    }

    /// `t` exits as most threads do: freed (its notice sent once its last acquisitions are in
    /// the map) and gone from /proc.
    pub fn exit(&mut self, t: &Task) {
        self.notice(t, exit_record::FREED);
        self.vanish(t);
    }

    /// `t` has run its last instruction but is not reaped: a zombie in /proc.
    pub fn zombie(&mut self, t: &Task) {
        if let Some(e) = self.tasks.get_mut(&(t.tgid, t.tid)) {
            e.1 = true;
        }
    }

    /// `t` is gone from /proc (reaped).
    pub fn vanish(&mut self, t: &Task) {
        self.tasks.remove(&(t.tgid, t.tid));
    }

    /// The kernel charges `waits` waits (`wait_ns` in all) of `waiter` on `owner`'s lock to
    /// the holds of `holder` (cumulative, as the map keeps them).
    pub fn charge(&mut self, owner: &Task, waiter: &Task, holder: &Task, waits: u64, wait_ns: u64) {
        let key = BlockedKey {
            owner: owner.tgid,
            waiter_tid: waiter.tid,
            holder_tid: holder.tid,
            holder_tgid: holder.tgid,
            holder_kind: profiler_common::cause::MUNMAP,
            waiter_op: profiler_common::WRITE as u32,
            owner_start: owner.proc_start_ns,
            waiter_start: waiter.start_ns,
            holder_start: holder.start_ns,
        };
        let v = self.blocked.entry(key).or_default();
        v.waits += waits;
        v.wait_ns += wait_ns;
    }

    /// Entries in the stats map now.
    pub fn entries(&self) -> usize {
        self.stats.len()
    }

    /// Entries in the blockers' map now.
    pub fn blocked_entries(&self) -> usize {
        self.blocked.len()
    }
}

impl Kernel for FakeKernel {
    fn attached_ns(&self) -> u64 {
        self.attached_ns
    }

    fn blockers(&self) -> bool {
        self.blockers
    }

    fn stack_sample(&self) -> u32 {
        0
    }

    fn flush_pending(&mut self, _always: bool) -> Result<(), CollectorError> {
        // Acquisitions go straight into the map here.
        Ok(())
    }

    fn take_cpu_times(&mut self) -> Vec<ThreadCpu> {
        std::mem::take(&mut self.cpu)
    }

    fn exited_threads(&mut self) -> Vec<ExitedThread> {
        std::mem::take(&mut self.notices)
    }

    fn counters(&self) -> Result<Counters, CollectorError> {
        Ok(self.counters)
    }

    fn read_stats(
        &mut self,
        all: bool,
        mut f: impl FnMut(&[(StatsKey, ThreadStats)]),
    ) -> Result<(), CollectorError> {
        self.readings += 1;
        let dirty = std::mem::take(&mut self.dirty);
        let read: Vec<(StatsKey, ThreadStats)> = self
            .stats
            .iter()
            .filter(|(k, _)| all || dirty.contains(k))
            .map(|(k, v)| (*k, *v))
            .collect();
        // In small batches, as the real one hands them over.
        for chunk in read.chunks(2) {
            f(chunk);
        }
        self.notices.append(&mut self.notices_in_reading);
        Ok(())
    }

    fn lookup(&self, key: &StatsKey) -> Result<Option<ThreadStats>, CollectorError> {
        Ok(self.stats.get(key).copied())
    }

    fn remove(&mut self, key: &StatsKey) {
        self.stats.remove(key);
        self.dirty.remove(key);
        self.removed.push(*key);
    }

    fn read_blocked(&self) -> Result<Vec<(BlockedKey, BlockedVal)>, CollectorError> {
        Ok(self.blocked.iter().map(|(k, v)| (*k, *v)).collect())
    }

    fn remove_blocked(&mut self, key: &BlockedKey) {
        self.blocked.remove(key);
        self.removed_blocked.push(*key);
    }

    fn set_v8_frames(&mut self, pid: u32, frames: Option<V8Frames>) {
        self.v8_frames.push((pid, frames));
    }

    fn note_v8_named(&mut self, pid: u32, sfis: &[u64]) {
        self.v8_named.extend(sfis.iter().map(|&s| (pid, s)));
    }

    fn deselect(&mut self, pid: u32, ticks: u64) {
        self.deselected.push((pid, ticks));
        self.selection.retain(|s| (s.pid, s.ticks) != (pid, ticks));
    }

    fn selection(&self) -> Vec<Selected> {
        self.selection.clone()
    }

    fn program_stats(&self) -> Option<Vec<ProgramStats>> {
        None
    }

    fn load_report(&self) -> Option<&LoadReport> {
        None
    }

    fn presence(&self, pid: u32, t: ThreadId) -> Presence {
        match self.tasks.get(&(pid, t.tid)) {
            Some(&(start, zombie)) if start == t.start => {
                if zombie {
                    Presence::Zombie
                } else {
                    Presence::Alive
                }
            }
            _ => Presence::Gone,
        }
    }

    fn now_ns(&self) -> u64 {
        self.now_ns
    }
}
