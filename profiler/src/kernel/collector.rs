//! The kernel side as userspace reads it: the maps and rings of the loaded programs (see
//! `load` for loading), read into plain data for everything downstream.

use std::{io, time::Duration};

use aya::{
    Ebpf,
    maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf},
    programs::{Iter, ProgramError, RawTracePoint},
};
use profiler_common::{
    BlockedKey, BlockedVal, COMM_LEN, CgroupSelector, ExeSelector, ExitedThread,
    MAX_CGROUP_SELECTORS, MAX_EXE_SELECTORS, MAX_FILTER_COMMS, MAX_FILTER_PIDS, NewThread,
    SELECTED_BY_RULE, SelectorCounts, StatsKey, ThreadCpu, ThreadStats, counter, read_record,
};

use crate::kernel::{
    batch,
    btf::{KernelError, KernelInfo},
    load::{self, FLUSH_ITER, LoadReport},
    selectors::KernelSelectors,
};

#[derive(Debug, thiserror::Error)]
pub enum CollectorError {
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error(
        "permission denied loading eBPF programs: run as root (sudo) or grant CAP_BPF and CAP_PERFMON"
    )]
    Permission,
    #[error(
        "--bpf-stats needs CAP_SYS_ADMIN (or root); without it, set `sysctl kernel.bpf_stats_enabled=1` and leave --bpf-stats out"
    )]
    StatsPermission,
    #[error("too many --pid values: at most {MAX_FILTER_PIDS}")]
    TooManyPids,
    #[error("too many --comm values: at most {MAX_FILTER_COMMS}")]
    TooManyComms,
    #[error("--comm {0:?} is longer than the kernel's {max} bytes", max = COMM_LEN - 1)]
    CommTooLong(String),
    #[error("the kernel rejected the eBPF programs: {0}")]
    Load(String),
    /// A signal arrived while the programs were being loaded: not an error to report, the
    /// run ends with an empty summary.
    #[error("interrupted while attaching")]
    Cancelled,
    #[error("cannot attach to tracepoint {0}: {1}")]
    Attach(&'static str, String),
    #[error("cannot read eBPF map {0}: {1}")]
    Map(&'static str, String),
    #[error(
        "--blockers needs Linux {major}.{minor} or newer (bpf_loop); this kernel is {0}: leave --blockers out",
        major = super::minkernel::MIN_KERNEL_BLOCKERS.0,
        minor = super::minkernel::MIN_KERNEL_BLOCKERS.1
    )]
    BlockersKernel(String),
}

/// What to load.
#[derive(Clone, Debug, Default)]
pub struct CollectorConfig {
    pub pids: Vec<u32>,
    pub comms: Vec<String>,
    /// Capacity of the per-(owner, thread) stats map.
    pub max_threads: u32,
    /// Turn on the kernel's BPF run-time statistics for the run (costs two clock reads per
    /// program run), to report our own overhead.
    pub bpf_stats: bool,
    /// Capture the user stack of one in this many writes per thread (0: none).
    pub stack_sample: u32,
    /// Profile write acquisitions only.
    pub writes_only: bool,
    /// Attach "floor" programs instead of the profiler's (benchmark only): the physical cost
    /// of a BPF program on these tracepoints, measured on the same machine.
    pub floor: Floor,
    /// Select profiled processes at run time through the `SELECTED` map (the agent) instead
    /// of `pids`/`comms`.
    pub selection: bool,
    /// Follow the `pids`' descendants, selected in the kernel at fork (`--children`).
    pub children: bool,
    /// Charge each wait to the holds that made it wait (`BLOCKED`).
    pub blockers: bool,
}

/// Which floor programs to attach instead of the profiler's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Floor {
    /// The profiler itself.
    #[default]
    Off,
    /// Empty programs: the cost of running any program there.
    Empty,
    /// One clock read each: the least a program timing each acquisition does under the lock.
    Clock,
}

impl Floor {
    pub fn is_on(self) -> bool {
        self != Floor::Off
    }
}

/// Health counters summed over CPUs (see `profiler_common::counter`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub map_full: u64,
    pub nested: u64,
    pub no_state: u64,
    pub stacks_lost: u64,
    pub dirty_lost: u64,
    pub exits_lost: u64,
    pub ring_full: u64,
    pub flush_under_lock: u64,
    pub exit_flush: u64,
    pub fork_child: u64,
    pub not_acquired_map_full: u64,
    pub blockers_overrun: u64,
    pub blockers_busy: u64,
    pub blockers_map_full: u64,
}

/// Per-program cost from the kernel's BPF statistics (zero unless they are enabled).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProgramStats {
    pub name: &'static str,
    pub run_count: u64,
    pub run_time: Duration,
}

/// Does `sysctl kernel.bpf_stats_enabled` say the kernel collects BPF run-time statistics?
pub fn bpf_stats_enabled() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").is_ok_and(|s| s.trim() != "0")
}

pub struct Collector {
    ebpf: Ebpf,
    stats: BpfHashMap<MapData, StatsKey, ThreadStats>,
    blocked: BpfHashMap<MapData, BlockedKey, BlockedVal>,
    blockers: bool,
    counters: PerCpuArray<MapData, u64>,
    pub kernel: KernelInfo,
    /// From the start of loading to all programs attached.
    pub attach_time: Duration,
    /// When the programs were attached (boot-time clock, ns): the kernel counts from then.
    pub attached_ns: u64,
    /// Where that time went, step by step and program by program.
    pub load_report: LoadReport,
    /// Keeps the kernel's BPF statistics on while we run (`--bpf-stats`); closing it
    /// restores the previous state.
    _stats_fd: Option<std::os::fd::OwnedFd>,
    stack_sample: u32,
    batch_supported: bool,
    batch: batch::Buffers,
    epoch_map: Array<MapData, u32>,
    epoch: u32,
    /// Keys of entries changed in the current epoch.
    dirty: RingBuf<MapData>,
    /// Tids of exited threads that had entries.
    exited: RingBuf<MapData>,
    changed: Vec<(StatsKey, ThreadStats)>,
    /// Which floor programs were loaded instead of the profiler's, if any.
    floor: Floor,
    /// Profiled threads' CPU times, as the last iterator runs reported them (taken by
    /// [`Collector::take_cpu_times`]).
    cpu_times: Vec<ThreadCpu>,
    /// The iterator's output, reused.
    iter_out: Vec<u8>,
    /// Set by the kernel side when some thread has something for the iterator.
    activity: Array<MapData, u32>,
    /// Readings since the iterator last ran.
    idle_polls: u32,
    /// The agent's selection (pid -> start in clock ticks) and its generation.
    selected: BpfHashMap<MapData, u32, u64>,
    selection_gen: Array<MapData, u32>,
    generation: u32,
    /// The programs' diagnostics, read until after they are detached (the last field: dropped
    /// after `ebpf`).
    _ebpf_log: Option<super::ebpf_log::EbpfLog>,
}

/// A map of the loaded object, typed, borrowed (for maps written now and then).
fn map_of<'a, T>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<T, CollectorError>
where
    T: TryFrom<&'a mut aya::maps::Map, Error = aya::maps::MapError>,
{
    ebpf.map_mut(name)
        .ok_or_else(|| CollectorError::Load(format!("map {name} missing")))?
        .try_into()
        .map_err(|e: aya::maps::MapError| CollectorError::Map(name, error_chain(&e)))
}

/// A map of the loaded object, typed.
fn take<T>(ebpf: &mut Ebpf, name: &'static str) -> Result<T, CollectorError>
where
    T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>,
{
    ebpf.take_map(name)
        .ok_or_else(|| CollectorError::Load(format!("map {name} missing")))?
        .try_into()
        .map_err(|e: aya::maps::MapError| CollectorError::Map(name, error_chain(&e)))
}

/// The flush iterator runs at least once every this many readings.
const IDLE_POLLS: u32 = 10;

/// Above this many changed entries, one batched reading of the whole map is cheaper than a
/// lookup per changed entry.
const MAX_LOOKUPS: usize = 2048;

/// Is any error in the chain a permission error from the kernel?
pub(super) fn is_permission(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            // EPERM only: the verifier reports a rejected program as EACCES.
            if io.raw_os_error() == Some(libc::EPERM) {
                return true;
            }
        }
        cur = e.source();
    }
    false
}

pub(super) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(e) = cur {
        let part = e.to_string();
        // Many errors already print their source; do not say it twice.
        if !s.contains(&part) {
            s.push_str(": ");
            s.push_str(&part);
        }
        cur = e.source();
    }
    s.replace('\n', " ")
}

impl Collector {
    /// Loads and attaches; on return the programs are counting.
    pub fn start(cfg: &CollectorConfig) -> Result<Self, CollectorError> {
        Self::start_cancellable(cfg, &|| false)
    }

    /// As [`Collector::start`], asking `cancelled` between steps (a signal during start-up).
    pub fn start_cancellable(
        cfg: &CollectorConfig,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<Self, CollectorError> {
        if cfg.blockers
            && let Some(release) = super::minkernel::running_release()
            && !super::minkernel::has_bpf_loop(&release)
        {
            return Err(CollectorError::BlockersKernel(release));
        }
        let stats_fd = if cfg.bpf_stats {
            Some(
                aya::sys::enable_stats(aya::sys::Stats::RunTime).map_err(|e| {
                    if is_permission(&e) {
                        CollectorError::StatsPermission
                    } else {
                        CollectorError::Load(format!("cannot enable BPF statistics: {e}"))
                    }
                })?,
            )
        } else {
            None
        };
        let loaded = load::load(cfg, cancelled)?;
        let mut ebpf = loaded.ebpf;
        // Epoch 1 before the first reading: new entries (epoch 0) are always noted.
        let mut epoch_map: Array<MapData, u32> = take(&mut ebpf, "EPOCH")?;
        epoch_map
            .set(0, 1, 0)
            .map_err(|e| CollectorError::Map("EPOCH", error_chain(&e)))?;
        Ok(Collector {
            dirty: take(&mut ebpf, "DIRTY")?,
            exited: take(&mut ebpf, "EXITED")?,
            selected: take(&mut ebpf, "SELECTED")?,
            selection_gen: take(&mut ebpf, "SELECTION_GEN")?,
            stats: take(&mut ebpf, "STATS")?,
            blocked: take(&mut ebpf, "BLOCKED")?,
            counters: take(&mut ebpf, "COUNTERS")?,
            activity: take(&mut ebpf, "ACTIVITY")?,
            idle_polls: 0,
            ebpf,
            blockers: cfg.blockers && !cfg.floor.is_on(),
            kernel: loaded.kernel,
            attach_time: Duration::from_secs_f64(loaded.report.total_ms / 1e3),
            attached_ns: crate::vocab::ids::boot_ns(),
            load_report: loaded.report,
            _stats_fd: stats_fd,
            stack_sample: cfg.stack_sample,
            batch_supported: true,
            batch: batch::Buffers::default(),
            epoch_map,
            epoch: 1,
            changed: Vec::new(),
            floor: cfg.floor,
            cpu_times: Vec::new(),
            iter_out: Vec::new(),
            generation: 0,
            _ebpf_log: loaded.ebpf_log,
        })
    }

    /// Hands `f` the kernel entries that changed since the previous reading (`all`: every
    /// entry), a batch at a time. Idle threads cost nothing: the eBPF side notes each entry's
    /// first change per epoch on DIRTY, and only those are looked up; the whole map is read
    /// (batched) when asked (the caller asks too when `Counters::dirty_lost` grew) or when
    /// many changed.
    pub fn read_stats(
        &mut self,
        all: bool,
        mut f: impl FnMut(&[(StatsKey, ThreadStats)]),
    ) -> Result<(), CollectorError> {
        // Drain first, then start a new epoch: a change noted after the drain stays on the
        // ring for the next reading; a change noted before it is read below. The eBPF side
        // loads the epoch after a full barrier that follows its update, and we read entries
        // after a full barrier that follows the new epoch: a change is either seen below or
        // noted anew under the new epoch.
        let mut keys = Vec::new();
        while let Some(item) = self.dirty.next() {
            if let Some(key) = read_record::<StatsKey>(&item) {
                keys.push(key);
            }
        }
        self.epoch = self.epoch.wrapping_add(1).max(1);
        self.epoch_map
            .set(0, self.epoch, 0)
            .map_err(|e| CollectorError::Map("EPOCH", error_chain(&e)))?;
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        if all || keys.len() > MAX_LOOKUPS {
            return self.read_all(f);
        }
        keys.sort_unstable();
        keys.dedup();
        for chunk in keys.chunks(batch::CHUNK) {
            self.changed.clear();
            for key in chunk {
                if let Some(v) = self.lookup(key)? {
                    self.changed.push((*key, v));
                }
            }
            f(&self.changed);
        }
        Ok(())
    }

    /// One entry (None: deleted since, e.g. an exited thread's).
    pub fn lookup(&self, key: &StatsKey) -> Result<Option<ThreadStats>, CollectorError> {
        match self.stats.get(key, 0) {
            Ok(v) => Ok(Some(v)),
            Err(aya::maps::MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(CollectorError::Map("STATS", error_chain(&e))),
        }
    }

    /// Hands every live thread's accumulators over to the kernel map (the flush iterator:
    /// one pass over the machine's tasks, in the kernel), and collects the CPU times of the
    /// profiled threads that ran since the last pass (see [`Collector::take_cpu_times`]).
    /// The pass is skipped while no thread has anything for it (a pass over 10,000 idle
    /// threads costs about 10 ms), but made at least every [`IDLE_POLLS`] readings (CPU times
    /// of threads that ran without taking a lock) and whenever `always` (the end of a run).
    pub fn flush_pending(&mut self, always: bool) -> Result<(), CollectorError> {
        if self.floor.is_on() {
            return Ok(());
        }
        let active = self.activity.get(&0, 0).unwrap_or(1) != 0;
        self.idle_polls += 1;
        if !active && !always && self.idle_polls < IDLE_POLLS {
            return Ok(());
        }
        self.idle_polls = 0;
        // Cleared before the pass: what is noted during it is seen by the next reading.
        self.activity
            .set(0, 0, 0)
            .map_err(|e| CollectorError::Map("ACTIVITY", error_chain(&e)))?;
        let iter: &mut Iter = self
            .ebpf
            .program_mut(FLUSH_ITER)
            .ok_or_else(|| CollectorError::Load(format!("program {FLUSH_ITER} missing")))?
            .try_into()
            .map_err(|e: ProgramError| CollectorError::Load(error_chain(&e)))?;
        let link = iter
            .attach()
            .map_err(|e| CollectorError::Map("flush iterator", error_chain(&e)))?;
        let link = iter
            .take_link(link)
            .map_err(|e| CollectorError::Map("flush iterator", error_chain(&e)))?;
        let mut file = link
            .into_file()
            .map_err(|e| CollectorError::Map("flush iterator", error_chain(&e)))?;
        // Reading to the end runs the program over every task; it writes CPU time records.
        self.iter_out.clear();
        io::Read::read_to_end(&mut file, &mut self.iter_out)
            .map_err(|e| CollectorError::Map("flush iterator", e.to_string()))?;
        let records = self.iter_out.chunks_exact(size_of::<ThreadCpu>());
        self.cpu_times
            .extend(records.map(bytemuck::pod_read_unaligned::<ThreadCpu>));
        Ok(())
    }

    /// Profiled threads' CPU times reported since the last call, oldest first.
    pub fn take_cpu_times(&mut self) -> Vec<ThreadCpu> {
        std::mem::take(&mut self.cpu_times)
    }

    /// Hands every kernel entry to `f`, a batch at a time: with tens of thousands of threads,
    /// neither a copy of the whole map nor a syscall per entry.
    fn read_all(
        &mut self,
        mut f: impl FnMut(&[(StatsKey, ThreadStats)]),
    ) -> Result<(), CollectorError> {
        if self.batch_supported {
            match batch::read_all(&self.stats, &mut self.batch, &mut f) {
                Ok(()) => return Ok(()),
                // Before Linux 5.6, or a map type without batch support: entry by entry.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => self.batch_supported = false,
                Err(e) => return Err(CollectorError::Map("STATS", e.to_string())),
            }
        }
        let mut chunk = Vec::with_capacity(batch::CHUNK);
        for item in self.stats.iter() {
            match item {
                Ok(kv) => chunk.push(kv),
                // An entry deleted while we iterate: it is gone, skip it.
                Err(aya::maps::MapError::KeyNotFound) => continue,
                Err(e) => return Err(CollectorError::Map("STATS", error_chain(&e))),
            }
            if chunk.len() == batch::CHUNK {
                f(&chunk);
                chunk.clear();
            }
        }
        f(&chunk);
        Ok(())
    }

    /// Sets the selected processes (the agent, `--children`): those in `add` (pid, start
    /// ticks, selected by a rule rather than by pid) are profiled from now on, those in
    /// `remove` no more. Threads drop their cached verdicts.
    pub fn update_selection(
        &mut self,
        add: &[(u32, u64, bool)],
        remove: &[(u32, u64)],
    ) -> Result<(), CollectorError> {
        if add.is_empty() && remove.is_empty() {
            return Ok(());
        }
        for &(pid, ticks) in remove {
            self.deselect(pid, ticks);
        }
        for &(pid, ticks, by_rule) in add {
            let value = if by_rule {
                ticks | SELECTED_BY_RULE
            } else {
                ticks
            };
            self.selected
                .insert(pid, value, 0)
                .map_err(|e| CollectorError::Map("SELECTED", error_chain(&e)))?;
        }
        self.generation = self.generation.wrapping_add(1);
        self.selection_gen
            .set(0, self.generation, 0)
            .map_err(|e| CollectorError::Map("SELECTION_GEN", error_chain(&e)))
    }

    /// Drops process (`pid`, `ticks`) from the kernel's selection, if it is there under its
    /// own start time: the kernel may have selected a new process under the same pid since
    /// (at its exec, fork or rename), which stays.
    pub fn deselect(&mut self, pid: u32, ticks: u64) {
        if let Ok(v) = self.selected.get(&pid, 0)
            && v & !SELECTED_BY_RULE == ticks
        {
            let _ = self.selected.remove(&pid);
        }
    }

    /// The processes in the kernel's selection now (pid, start ticks): with `--children`, the
    /// targets and the descendants the kernel added at fork; for the agent, also those the
    /// kernel selected by its selectors at exec and fork.
    pub fn selected(&self) -> Vec<(u32, u64)> {
        self.selected
            .iter()
            .filter_map(Result::ok)
            .map(|(pid, v)| (pid, v & !SELECTED_BY_RULE))
            .collect()
    }

    /// Gives the kernel the agent's selectors, matched at every exec and fork from now on (a
    /// process they select is profiled from its first instruction). The counts go last, so
    /// that a half-written list is never matched.
    pub fn set_selectors(&mut self, s: &KernelSelectors) -> Result<(), CollectorError> {
        let map_err =
            |name| move |e: aya::maps::MapError| CollectorError::Map(name, error_chain(&e));
        let mut counts: Array<&mut MapData, SelectorCounts> = map_of(&mut self.ebpf, "SEL_COUNTS")?;
        counts
            .set(0, SelectorCounts::default(), 0)
            .map_err(map_err("SEL_COUNTS"))?;
        let mut exes: Array<&mut MapData, ExeSelector> = map_of(&mut self.ebpf, "SEL_EXES")?;
        for (i, e) in s.exes.iter().take(MAX_EXE_SELECTORS as usize).enumerate() {
            exes.set(i as u32, *e, 0).map_err(map_err("SEL_EXES"))?;
        }
        let mut cgroups: Array<&mut MapData, CgroupSelector> =
            map_of(&mut self.ebpf, "SEL_CGROUPS")?;
        for (i, c) in s
            .cgroups
            .iter()
            .take(MAX_CGROUP_SELECTORS as usize)
            .enumerate()
        {
            cgroups
                .set(i as u32, *c, 0)
                .map_err(map_err("SEL_CGROUPS"))?;
        }
        let mut comms: BpfHashMap<&mut MapData, [u64; 2], u8> =
            map_of(&mut self.ebpf, "SEL_COMMS")?;
        let old: Vec<[u64; 2]> = comms.keys().filter_map(Result::ok).collect();
        for k in old {
            let _ = comms.remove(&k);
        }
        for c in &s.comms {
            comms
                .insert(bytemuck::cast::<_, [u64; 2]>(*c), 1, 0)
                .map_err(map_err("SEL_COMMS"))?;
        }
        let mut counts: Array<&mut MapData, SelectorCounts> = map_of(&mut self.ebpf, "SEL_COUNTS")?;
        counts
            .set(
                0,
                SelectorCounts {
                    exes: s.exes.len().min(MAX_EXE_SELECTORS as usize) as u32,
                    cgroups: s.cgroups.len().min(MAX_CGROUP_SELECTORS as usize) as u32,
                    comms: s.comms.len() as u32,
                    _pad: 0,
                },
                0,
            )
            .map_err(map_err("SEL_COUNTS"))
    }

    /// One in how many writes has its stack sampled (0: none).
    pub fn stack_sample(&self) -> u32 {
        self.stack_sample
    }

    /// The ring buffer of sampled write stacks; taken once.
    pub fn take_stacks(&mut self) -> Result<RingBuf<MapData>, CollectorError> {
        take(&mut self.ebpf, "STACKS")
    }

    /// The ring buffer announcing threads seen for the first time; taken once.
    pub fn take_new_threads(&mut self) -> Result<RingBuf<MapData>, CollectorError> {
        take(&mut self.ebpf, "NEW_THREADS")
    }

    /// Decodes one `NEW_THREADS` record.
    pub fn parse_new_thread(bytes: &[u8]) -> Option<NewThread> {
        read_record(bytes)
    }

    /// Exit notices since the last call.
    pub fn exited_threads(&mut self) -> Vec<ExitedThread> {
        let mut out = Vec::new();
        while let Some(item) = self.exited.next() {
            if let Some(e) = read_record::<ExitedThread>(&item) {
                out.push(e);
            }
        }
        out
    }

    /// Are waits charged to their blockers?
    pub fn blockers(&self) -> bool {
        self.blockers
    }

    /// Every (waiter, holder) entry of the blockers map (small: one per pair of threads
    /// that made one another wait, deleted with the waiter or the lock).
    pub fn read_blocked(&self) -> Result<Vec<(BlockedKey, BlockedVal)>, CollectorError> {
        if !self.blockers {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        for item in self.blocked.iter() {
            match item {
                Ok(kv) => out.push(kv),
                // Deleted while we walked the map: fine.
                Err(aya::maps::MapError::KeyNotFound) => {}
                Err(e) => return Err(CollectorError::Map("BLOCKED", error_chain(&e))),
            }
        }
        Ok(out)
    }

    /// Deletes a blockers entry whose waiter or lock is gone, after its final reading.
    pub fn remove_blocked(&mut self, key: &BlockedKey) {
        let _ = self.blocked.remove(key);
    }

    /// Deletes an entry whose thread has exited, after its final reading was taken.
    pub fn remove(&mut self, key: &StatsKey) {
        // Already gone is fine.
        let _ = self.stats.remove(key);
    }

    fn read_counter(&self, idx: u32) -> Result<u64, CollectorError> {
        let v = self
            .counters
            .get(&idx, 0)
            .map_err(|e| CollectorError::Map("COUNTERS", error_chain(&e)))?;
        Ok(v.iter().sum())
    }

    pub fn counters(&self) -> Result<Counters, CollectorError> {
        let read = |idx: u32| self.read_counter(idx);
        Ok(Counters {
            map_full: read(counter::MAP_FULL)?,
            nested: read(counter::NESTED)?,
            no_state: read(counter::NO_STATE)?,
            stacks_lost: read(counter::STACKS_LOST)?,
            dirty_lost: read(counter::DIRTY_LOST)?,
            exits_lost: read(counter::EXITS_LOST)?,
            ring_full: read(counter::RING_FULL)?,
            flush_under_lock: read(counter::FLUSH_UNDER_LOCK)?,
            exit_flush: read(counter::EXIT_FLUSH)?,
            fork_child: read(counter::FORK_CHILD)?,
            not_acquired_map_full: read(counter::NOT_ACQUIRED_MAP_FULL)?,
            blockers_overrun: read(counter::BLOCKERS_OVERRUN)?,
            blockers_busy: read(counter::BLOCKERS_BUSY)?,
            blockers_map_full: read(counter::BLOCKERS_MAP_FULL)?,
        })
    }

    /// Is the kernel collecting BPF statistics (ours through `--bpf-stats`, or the sysctl)?
    /// The sysctl does not show statistics enabled through a BPF_ENABLE_STATS fd.
    pub fn bpf_stats_on(&self) -> bool {
        self._stats_fd.is_some() || bpf_stats_enabled()
    }

    /// Run counts and run time per program, from the kernel's BPF statistics.
    pub fn program_stats(&self) -> Vec<ProgramStats> {
        load::programs_for(&self.kernel, self.floor)
            .into_iter()
            .filter_map(|name| {
                let prog: &RawTracePoint = self.ebpf.program(name)?.try_into().ok()?;
                let info = prog.info().ok()?;
                Some(ProgramStats {
                    name,
                    run_count: info.run_count(),
                    run_time: info.run_time(),
                })
            })
            .collect()
    }
}
