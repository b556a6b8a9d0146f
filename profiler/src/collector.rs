//! Loads the eBPF programs with this run's settings as globals, attaches them to the
//! mmap_lock tracepoints, and reads the kernel's aggregates back.

use std::{
    io,
    time::{Duration, Instant},
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf},
    programs::{ProgramError, RawTracePoint},
};
use profiler_common::{
    COMM_LEN, Filter, MAX_FILTER_COMMS, MAX_FILTER_PIDS, NewThread, Settings, StatsKey,
    ThreadStats, counter,
};

use crate::kernel::{KernelError, KernelInfo};

/// The compiled eBPF object, built by `build.rs` from `profiler-ebpf`.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/mmaplock"));

/// The tracepoints, each with the program attached to it (see [`Collector::programs`]).
pub const TRACEPOINTS: [&str; 3] = [
    "mmap_lock_start_locking",
    "mmap_lock_acquire_returned",
    "mmap_lock_released",
];

#[derive(Debug, thiserror::Error)]
pub enum CollectorError {
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error(
        "permission denied loading eBPF programs: run as root (sudo) or grant CAP_BPF and CAP_PERFMON"
    )]
    Permission,
    #[error("too many --pid values: at most {MAX_FILTER_PIDS}")]
    TooManyPids,
    #[error("too many --comm values: at most {MAX_FILTER_COMMS}")]
    TooManyComms,
    #[error("--comm {0:?} is longer than the kernel's {max} bytes", max = COMM_LEN - 1)]
    CommTooLong(String),
    #[error("the kernel rejected the eBPF programs: {0}")]
    Load(String),
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
}

/// Health counters summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub map_full: u64,
    pub unpaired: u64,
    pub no_state: u64,
    pub stacks_lost: u64,
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
    counters: PerCpuArray<MapData, u64>,
    pub kernel: KernelInfo,
    /// From the start of loading to all programs attached.
    pub attach_time: Duration,
    /// Keeps the kernel's BPF statistics on while we run (`--bpf-stats`); closing it
    /// restores the previous state.
    _stats_fd: Option<std::os::fd::OwnedFd>,
    stack_sample: u32,
}

/// The program for each of [`TRACEPOINTS`] on this kernel.
fn programs_for(kernel: &KernelInfo) -> [&'static str; 3] {
    [
        kernel.tracepoints.start_program(),
        kernel.tracepoints.acquire_program(),
        "mmap_lock_released",
    ]
}

fn filter_for(cfg: &CollectorConfig) -> Result<Filter, CollectorError> {
    let mut f = Filter::ALL;
    if cfg.pids.len() > MAX_FILTER_PIDS {
        return Err(CollectorError::TooManyPids);
    }
    if cfg.comms.len() > MAX_FILTER_COMMS {
        return Err(CollectorError::TooManyComms);
    }
    for (slot, pid) in f.pids.iter_mut().zip(&cfg.pids) {
        *slot = *pid;
    }
    for (slot, comm) in f.comms.iter_mut().zip(&cfg.comms) {
        let b = comm.as_bytes();
        if b.len() >= COMM_LEN {
            return Err(CollectorError::CommTooLong(comm.clone()));
        }
        slot[..b.len()].copy_from_slice(b);
    }
    f.n_pids = cfg.pids.len() as u32;
    f.n_comms = cfg.comms.len() as u32;
    Ok(f)
}

/// Is any error in the chain a permission error from the kernel?
fn is_permission(e: &(dyn std::error::Error + 'static)) -> bool {
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

fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
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
        let t0 = Instant::now();
        let stats_fd = if cfg.bpf_stats {
            Some(
                aya::sys::enable_stats(aya::sys::Stats::RunTime).map_err(|e| {
                    if is_permission(&e) {
                        CollectorError::Permission
                    } else {
                        CollectorError::Load(format!("cannot enable BPF statistics: {e}"))
                    }
                })?,
            )
        } else {
            None
        };
        let kernel = KernelInfo::detect()?;
        log::debug!("kernel BTF read in {:?}", t0.elapsed());
        let filter = filter_for(cfg)?;
        let mut ebpf = EbpfLoader::new()
            .override_global("KERNEL", &kernel.layout, true)
            .override_global("FILTER", &filter, true)
            .override_global(
                "SETTINGS",
                &Settings {
                    stack_sample: cfg.stack_sample,
                    _pad: 0,
                },
                true,
            )
            .map_max_entries("STATS", cfg.max_threads.max(1))
            // THREAD_STATE is task local storage, which aya creates but has no typed API for;
            // only the eBPF side uses it.
            .allow_unsupported_maps()
            .load(EBPF_OBJECT)
            .map_err(|e| {
                if is_permission(&e) {
                    CollectorError::Permission
                } else {
                    CollectorError::Load(error_chain(&e))
                }
            })?;
        log::debug!("object loaded (maps created) at {:?}", t0.elapsed());
        for (tp, name) in TRACEPOINTS.into_iter().zip(programs_for(&kernel)) {
            let prog: &mut RawTracePoint = ebpf
                .program_mut(name)
                .ok_or_else(|| CollectorError::Load(format!("program {name} missing")))?
                .try_into()
                .map_err(|e: ProgramError| CollectorError::Load(error_chain(&e)))?;
            prog.load().map_err(|e| {
                if is_permission(&e) {
                    CollectorError::Permission
                } else {
                    CollectorError::Load(error_chain(&e))
                }
            })?;
            log::debug!("{name} verified at {:?}", t0.elapsed());
            prog.attach(tp).map_err(|e| {
                if is_permission(&e) {
                    CollectorError::Permission
                } else if error_chain(&e).contains("No such file") {
                    CollectorError::Kernel(KernelError::NoTracepoints)
                } else {
                    CollectorError::Attach(tp, error_chain(&e))
                }
            })?;
        }
        let stats = ebpf
            .take_map("STATS")
            .ok_or_else(|| CollectorError::Load("map STATS missing".into()))?
            .try_into()
            .map_err(|e| CollectorError::Map("STATS", error_chain(&e)))?;
        let counters = ebpf
            .take_map("COUNTERS")
            .ok_or_else(|| CollectorError::Load("map COUNTERS missing".into()))?
            .try_into()
            .map_err(|e| CollectorError::Map("COUNTERS", error_chain(&e)))?;
        Ok(Collector {
            ebpf,
            stats,
            counters,
            kernel,
            attach_time: t0.elapsed(),
            _stats_fd: stats_fd,
            stack_sample: cfg.stack_sample,
        })
    }

    /// The kernel's cumulative aggregates, one entry per (owner, thread).
    pub fn snapshot(&self) -> Result<Vec<(StatsKey, ThreadStats)>, CollectorError> {
        let mut out = Vec::new();
        for item in self.stats.iter() {
            match item {
                Ok(kv) => out.push(kv),
                // An entry deleted while we iterate: it is gone, skip it.
                Err(aya::maps::MapError::KeyNotFound) => continue,
                Err(e) => return Err(CollectorError::Map("STATS", error_chain(&e))),
            }
        }
        Ok(out)
    }

    /// One in how many writes has its stack sampled (0: none).
    pub fn stack_sample(&self) -> u32 {
        self.stack_sample
    }

    /// The ring buffer of sampled write stacks; taken once.
    pub fn take_stacks(&mut self) -> Result<RingBuf<MapData>, CollectorError> {
        let map = self
            .ebpf
            .take_map("STACKS")
            .ok_or_else(|| CollectorError::Map("STACKS", "already taken".into()))?;
        RingBuf::try_from(map).map_err(|e| CollectorError::Map("STACKS", error_chain(&e)))
    }

    /// The ring buffer announcing threads seen for the first time; taken once.
    pub fn take_new_threads(&mut self) -> Result<RingBuf<MapData>, CollectorError> {
        let map = self
            .ebpf
            .take_map("NEW_THREADS")
            .ok_or_else(|| CollectorError::Map("NEW_THREADS", "already taken".into()))?;
        RingBuf::try_from(map).map_err(|e| CollectorError::Map("NEW_THREADS", error_chain(&e)))
    }

    /// Decodes one `NEW_THREADS` record.
    pub fn parse_new_thread(bytes: &[u8]) -> Option<NewThread> {
        if bytes.len() < std::mem::size_of::<NewThread>() {
            return None;
        }
        // SAFETY: NewThread is plain old data and the record is at least that long; the ring
        // buffer gives no alignment guarantee beyond 8, so read unaligned.
        Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<NewThread>()) })
    }

    /// Deletes an entry whose thread has exited, after its final reading was taken.
    pub fn remove(&mut self, key: &StatsKey) {
        // Already gone is fine.
        let _ = self.stats.remove(key);
    }

    pub fn counters(&self) -> Result<Counters, CollectorError> {
        let read = |idx: u32| -> Result<u64, CollectorError> {
            let v = self
                .counters
                .get(&idx, 0)
                .map_err(|e| CollectorError::Map("COUNTERS", error_chain(&e)))?;
            Ok(v.iter().sum())
        };
        Ok(Counters {
            map_full: read(counter::MAP_FULL)?,
            unpaired: read(counter::UNPAIRED)?,
            no_state: read(counter::NO_STATE)?,
            stacks_lost: read(counter::STACKS_LOST)?,
        })
    }

    /// Is the kernel collecting BPF statistics (ours through `--bpf-stats`, or the sysctl)?
    /// The sysctl does not show statistics enabled through a BPF_ENABLE_STATS fd.
    pub fn bpf_stats_on(&self) -> bool {
        self._stats_fd.is_some() || bpf_stats_enabled()
    }

    /// Run counts and run time per program, from the kernel's BPF statistics.
    pub fn program_stats(&self) -> Vec<ProgramStats> {
        programs_for(&self.kernel)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_packs_pids_and_comms() {
        let f = filter_for(&CollectorConfig {
            pids: vec![7, 9],
            comms: vec!["node".into()],
            max_threads: 1,
            bpf_stats: false,
            stack_sample: 0,
        })
        .unwrap();
        assert_eq!((f.n_pids, f.n_comms), (2, 1));
        assert_eq!(&f.pids[..3], &[7, 9, 0]);
        assert_eq!(&f.comms[0][..5], b"node\0");
    }

    #[test]
    fn filter_rejects_what_the_kernel_cannot_hold() {
        let long = CollectorConfig {
            comms: vec!["a-very-long-command-name".into()],
            ..Default::default()
        };
        assert!(matches!(
            filter_for(&long),
            Err(CollectorError::CommTooLong(_))
        ));
        let many = CollectorConfig {
            pids: (1..=(MAX_FILTER_PIDS as u32 + 1)).collect(),
            ..Default::default()
        };
        assert!(matches!(
            filter_for(&many),
            Err(CollectorError::TooManyPids)
        ));
    }
}
