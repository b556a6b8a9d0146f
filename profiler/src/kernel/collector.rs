//! The kernel side as userspace reads it: the maps and rings of the loaded programs (see
//! `load` for loading), read into plain data for everything downstream.

use std::{io, time::Duration};

use aya::{
    Ebpf,
    maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf},
};
use profiler_common::{
    BlockedKey, BlockedVal, COMM_LEN, MAX_FILTER_COMMS, MAX_FILTER_PIDS, NewThread, StatsKey,
    ThreadCpu, ThreadStats,
};

use crate::vocab::Mode;

use crate::kernel::{
    batch,
    btf::{KernelError, KernelInfo},
    load::{self, LoadReport},
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
    /// With stack sampling: also a process's write (contention mode: wait) whenever the
    /// process had no sample for this many milliseconds (0: one in `stack_sample` only).
    pub sample_floor_ms: u32,
    /// With a floor: a process's first floor sample is due a floor's time after its first
    /// wait, not at it (`Settings::floor_after_first`).
    pub floor_after_first: bool,
    /// With stack sampling: at most about this many stacks a second per process, past which
    /// its rate is lowered in the kernel (`Settings::max_stack_rate`; 0: no bound).
    pub max_stack_rate: u32,
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
    /// Every acquisition (full) or only contended waits (contention).
    pub mode: Mode,
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
    /// One clock read stored in the thread's task storage: the least a program timing each
    /// acquisition per thread does.
    Storage,
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
    pub spilled: u64,
    pub holder_stacks_lost: u64,
    pub exit_flush: u64,
    pub fork_child: u64,
    pub not_acquired_map_full: u64,
    pub blockers_overrun: u64,
    pub blockers_busy: u64,
    pub blockers_map_full: u64,
    /// Lock events whose first program the kernel skipped and the second copy handled.
    pub rescued: u64,
    /// Runs of the programs the kernel skipped, not made up for (see `skipped`).
    pub skipped: u64,
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

/// The loaded and attached programs, and their maps and rings: the real [`Kernel`](super::Kernel)
/// (its readings are in `readings.rs`, its selection in `selection.rs`).
pub struct Collector {
    pub(super) ebpf: Ebpf,
    pub(super) stats: BpfHashMap<MapData, StatsKey, ThreadStats>,
    pub(super) blocked: BpfHashMap<MapData, BlockedKey, BlockedVal>,
    pub(super) blockers: bool,
    pub(super) counters: PerCpuArray<MapData, u64>,
    pub kernel: KernelInfo,
    /// From the start of loading to all programs attached.
    pub attach_time: Duration,
    /// When the programs were attached (boot-time clock, ns): the kernel counts from then.
    pub attached_ns: u64,
    /// Where that time went, step by step and program by program.
    pub load_report: LoadReport,
    /// Keeps the kernel's BPF statistics on while we run (`--bpf-stats`); closing it
    /// restores the previous state.
    pub(super) _stats_fd: Option<std::os::fd::OwnedFd>,
    pub(super) stack_sample: u32,
    pub(super) batch_supported: bool,
    pub(super) batch: batch::Buffers<StatsKey, ThreadStats>,
    pub(super) epoch_map: Array<MapData, u32>,
    pub(super) epoch: u32,
    /// Keys of entries changed in the current epoch.
    pub(super) dirty: RingBuf<MapData>,
    /// Tids of exited threads that had entries.
    pub(super) exited: RingBuf<MapData>,
    pub(super) changed: Vec<(StatsKey, ThreadStats)>,
    /// Which floor programs were loaded instead of the profiler's, if any.
    pub(super) floor: Floor,
    /// What the programs measure.
    pub mode: Mode,
    /// The task iterator run before readings (None for the floors).
    pub(super) iterator: Option<&'static str>,
    /// Profiled threads' CPU times, as the last iterator runs reported them (taken by
    /// [`Kernel::take_cpu_times`](super::Kernel::take_cpu_times)).
    pub(super) cpu_times: Vec<ThreadCpu>,
    /// The iterator's output, reused.
    pub(super) iter_out: Vec<u8>,
    /// Set by the kernel side when some thread has something for the iterator.
    pub(super) activity: Array<MapData, u32>,
    /// Asks contention mode's iterator to note every profiled process's lock (a pass over
    /// every process: at the start, when the selection adds processes, every few readings).
    pub(super) note_locks: Array<MapData, u32>,
    /// Readings since the iterator last ran.
    pub(super) idle_polls: u32,
    /// The agent's selection (pid -> start in clock ticks) and its generation.
    pub(super) selected: BpfHashMap<MapData, u32, u64>,
    pub(super) selection_gen: Array<MapData, u32>,
    pub(super) generation: u32,
    /// The programs' diagnostics, read until after they are detached (the last field: dropped
    /// after `ebpf`).
    pub(super) _ebpf_log: Option<super::ebpf_log::EbpfLog>,
}

/// A map of the loaded object, typed, borrowed (for maps written now and then).
pub(super) fn map_of<'a, T>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<T, CollectorError>
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
pub(super) const IDLE_POLLS: u32 = 10;

/// Above this many changed entries, one batched reading of the whole map is cheaper than a
/// lookup per changed entry.
pub(super) const MAX_LOOKUPS: usize = 2048;

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
        let mut activity: Array<MapData, u32> = take(&mut ebpf, "ACTIVITY")?;
        let mut note_locks: Array<MapData, u32> = take(&mut ebpf, "NOTE_LOCKS")?;
        if cfg.mode == Mode::Contention {
            // The first reading runs contention mode's iterator, which notes the profiled
            // processes' locks (for other tasks' waits on them) before any of theirs waited.
            for (map, name) in [(&mut activity, "ACTIVITY"), (&mut note_locks, "NOTE_LOCKS")] {
                map.set(0, 1, 0)
                    .map_err(|e| CollectorError::Map(name, error_chain(&e)))?;
            }
        }
        Ok(Collector {
            dirty: take(&mut ebpf, "DIRTY")?,
            exited: take(&mut ebpf, "EXITED")?,
            selected: take(&mut ebpf, "SELECTED")?,
            selection_gen: take(&mut ebpf, "SELECTION_GEN")?,
            stats: take(&mut ebpf, "STATS")?,
            blocked: take(&mut ebpf, "BLOCKED")?,
            counters: take(&mut ebpf, "COUNTERS")?,
            activity,
            note_locks,
            idle_polls: 0,
            ebpf,
            // Contention mode names the writer each wait waited behind, always.
            blockers: (cfg.blockers || cfg.mode == Mode::Contention) && !cfg.floor.is_on(),
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
            mode: cfg.mode,
            iterator: super::programs::iterator(cfg),
            cpu_times: Vec::new(),
            iter_out: Vec::new(),
            generation: 0,
            _ebpf_log: loaded.ebpf_log,
        })
    }

    /// The ring buffer of sampled write stacks; taken once.
    pub fn take_stacks(&mut self) -> Result<RingBuf<MapData>, CollectorError> {
        take(&mut self.ebpf, "STACKS")
    }

    /// The flag by which the stacks' copier asks the kernel side to wake it at the next
    /// record (see `run::copier`); taken once.
    pub fn take_stacks_wake(&mut self) -> Result<Array<MapData, u32>, CollectorError> {
        take(&mut self.ebpf, "STACKS_WAKE")
    }

    /// The ring buffer announcing threads seen for the first time; taken once.
    pub fn take_new_threads(&mut self) -> Result<RingBuf<MapData>, CollectorError> {
        take(&mut self.ebpf, "NEW_THREADS")
    }

    /// Decodes one `NEW_THREADS` record.
    pub fn parse_new_thread(bytes: &[u8]) -> Option<NewThread> {
        read_record(bytes)
    }
}

/// Decodes a plain-data ring buffer record (see `profiler_common::read_record`).
pub(super) use profiler_common::read_record;
