//! Loading and attaching the eBPF programs, with this run's settings as load-time globals,
//! timed step by step (attach time is part of what the profiler costs: `-v` prints the
//! steps, the report's `overhead.load` carries them, and the bench reports them).

use std::time::Instant;

use aya::{
    Ebpf, EbpfLoader,
    programs::{Program, ProgramError, RawTracePoint},
};
use aya_obj::btf::{Btf, BtfType, Func, FuncLinkage};
use profiler_common::{COMM_LEN, Filter, LOCK_SLOTS, MAX_FILTER_COMMS, MAX_FILTER_PIDS, Settings};

use crate::vocab::Mode;

use super::programs::{iterator, lifecycle_programs, lock_programs};

pub use super::stopwatch::LoadReport;
use super::{
    btf::{KernelError, KernelInfo},
    collector::{CollectorConfig, CollectorError, error_chain, is_permission},
    ebpf_log::{self, EbpfLog},
    stopwatch::{Stopwatch, ms},
};

/// The compiled eBPF object, built by `build.rs` from `profiler-ebpf`.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/mmaplock"));

/// Kernel map entries budgeted per thread: one for its reads, and one per write cause it
/// uses (typically mmap, munmap, mprotect; a few more for some).
pub const ENTRIES_PER_THREAD: u32 = 4;

/// The eBPF object to load: the embedded one, or, for developing the eBPF side without
/// rebuilding the profiler, the file named by `MMAPLOCK_PROF_BPF_OBJECT`.
fn object() -> Result<std::borrow::Cow<'static, [u8]>, CollectorError> {
    match std::env::var_os("MMAPLOCK_PROF_BPF_OBJECT") {
        None => Ok(EBPF_OBJECT.into()),
        Some(path) => std::fs::read(&path).map(Into::into).map_err(|e| {
            CollectorError::Load(format!("MMAPLOCK_PROF_BPF_OBJECT {}: {e}", path.display()))
        }),
    }
}

/// The `FILTER` global for a configuration.
pub fn filter_for(cfg: &CollectorConfig) -> Result<Filter, CollectorError> {
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
    if let Some(long) = cfg.comms.iter().find(|c| c.len() >= COMM_LEN) {
        return Err(CollectorError::CommTooLong(long.clone()));
    }
    f.n_pids = cfg.pids.len() as u32;
    // Names select processes (at exec, at rename, and those running now): the selection
    // decides, the `pids` with them being put in it.
    f.use_selection = (cfg.selection || cfg.children || !cfg.comms.is_empty()) as u32;
    f.follow_children = cfg.children as u32;
    f.ns_per_tick = (1_000_000_000 / crate::vocab::ids::clock_ticks()) as u32;
    Ok(f)
}

/// A stand-in for the kernel's BTF that holds a few functions, each under the id the kernel
/// gave it. Loading an iterator (or a program on a kernel function) is the only thing aya
/// needs the kernel's BTF for, and all it looks up there is that id; we found it already while reading the
/// offsets, so parsing the whole BTF a second time (~20 ms, a fifth of our attach budget)
/// would buy nothing.
fn btf_with_funcs(funcs: &[(&str, u32)]) -> Btf {
    let mut funcs: Vec<(&str, u32)> = funcs.iter().copied().filter(|f| f.1 != 0).collect();
    funcs.sort_by_key(|f| f.1);
    let mut btf = Btf::new();
    // Ids count from 1 (0 is void); fillers of another kind are skipped by the lookup.
    let mut next = 1;
    for (name, id) in funcs {
        let name_off = btf.add_string(name);
        while next < id {
            next = btf.add_type(BtfType::Unknown) + 1;
        }
        next = btf.add_type(BtfType::Func(Func::new(name_off, 0, FuncLinkage::Global))) + 1;
    }
    btf
}

fn load_error(e: &(dyn std::error::Error + 'static)) -> CollectorError {
    log::debug!("load error: {}", error_chain(e));
    if is_permission(e) {
        CollectorError::Permission
    } else {
        CollectorError::Load(error_chain(e))
    }
}

fn program<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T, CollectorError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or_else(|| CollectorError::Load(format!("program {name} missing")))?
        .try_into()
        .map_err(|e: ProgramError| CollectorError::Load(error_chain(&e)))
}

/// Everything loaded and attached: on return the programs are counting.
pub struct Loaded {
    pub ebpf: Ebpf,
    pub kernel: KernelInfo,
    pub report: LoadReport,
    /// Reads the programs' diagnostics when they log (drop it after `ebpf`).
    pub ebpf_log: Option<EbpfLog>,
}

/// Reads the kernel's facts, creates the maps, verifies and attaches the programs.
/// `cancelled` is asked between steps: a signal during start-up ends the run before it has
/// attached anything more (what was attached goes when `Ebpf` is dropped).
pub fn load(cfg: &CollectorConfig, cancelled: &dyn Fn() -> bool) -> Result<Loaded, CollectorError> {
    // Held back from this thread and those it starts until the programs are in: see
    // `SignalsHeld`. The run's own handler sees them then (the caller's `cancelled` decides
    // whether one ends the start-up early).
    let _held = SignalsHeld::new();
    let mut watch = Stopwatch::new();
    // aya's loader parses the kernel's whole BTF when it is made (which we do not need, see
    // `btf_with_func`, but cannot skip): make it on another thread while we read our offsets.
    let loader = std::thread::spawn(EbpfLoader::new);
    let kernel = KernelInfo::detect()?;
    if cfg.mode == Mode::Contention && !cfg.floor.is_on() && !kernel.contention_tracepoints {
        return Err(CollectorError::Kernel(KernelError::NoContentionTracepoints));
    }
    if kernel.layout.regs_syscall == 0 {
        log::warn!(
            "this kernel's saved registers (pt_regs) are neither x86_64's nor arm64's: write causes are `other`, no stacks are sampled, thread roles come from names"
        );
    }
    watch.step("kernel BTF (offsets, tracepoint layout)");
    let mut loader = loader
        .join()
        .map_err(|_| CollectorError::Load("the loader's thread panicked".into()))?;
    watch.step("aya's loader (parses the kernel's BTF, in parallel)");
    let filter = filter_for(cfg)?;
    let settings = Settings {
        stack_sample: cfg.stack_sample,
        writes_only: cfg.writes_only as u32,
        blockers: cfg.blockers as u32,
        self_tgid: std::process::id(),
        strong_order: cfg!(target_arch = "x86_64") as u32,
        start_routine_off: super::pthread::start_routine_offset().unwrap_or(0),
        // Tests only: the spill path of a full ring, taken at random (counter::SPILLED).
        spill_test: std::env::var_os("MMAPLOCK_PROF_SPILL_TEST").is_some() as u32,
        sample_floor_ms: if cfg.stack_sample == 0 {
            0
        } else {
            cfg.sample_floor_ms
        },
        floor_after_first: cfg.floor_after_first as u32,
        max_stack_rate: if cfg.stack_sample == 0 {
            0
        } else {
            cfg.max_stack_rate
        },
    };
    // The programs' diagnostics: 0 (none, the log calls removed by the verifier) unless the
    // logger takes them (`--log-level`, `RUST_LOG`).
    let log_level = ebpf_log::level();
    let mut ebpf = loader
        // No CO-RE relocations to do (offsets come from `kernel`).
        .btf(None)
        .override_global("KERNEL", &kernel.layout, true)
        .override_global("FILTER", &filter, true)
        .override_global("SETTINGS", &settings, true)
        // (Optional: an object of MMAPLOCK_PROF_BPF_OBJECT's may have no aya-log, then no
        // log calls.)
        .override_global(ebpf_log::LEVEL_GLOBAL, &log_level, false)
        .map_max_entries(ebpf_log::RING, ebpf_log::ring_bytes(log_level))
        // The sampled stacks' ring (16 KiB a sample): room for 512 at high rates (every
        // write, --stacks), 32 at the default rate (userspace is woken at 8), a page when
        // off. Its pages count twice in our RSS once written, so it is no bigger than the
        // rate needs.
        .map_max_entries("STACKS", stacks_ring_bytes(cfg.stack_sample))
        .map_max_entries(
            "STATS",
            cfg.max_threads.max(1).saturating_mul(ENTRIES_PER_THREAD),
        )
        // Blockers' per-lock accumulators are 2 MiB of preallocated, zeroed memory: one
        // element when they are off.
        .map_max_entries("LOCKS", if cfg.blockers { LOCK_SLOTS } else { 1 })
        // Contention mode's threads that waited (preallocated: no allocation under a
        // contended lock); a page's worth in full mode, which does not use it.
        .map_max_entries("WAITERS", waiters_capacity(cfg))
        // The task storage maps, which aya creates but has no typed API for; only the eBPF
        // side uses them.
        .allow_unsupported_maps()
        .load(&object()?)
        .map_err(|e| load_error(&e))?;
    // Before the programs attach: what they say from the start is read.
    let ebpf_log = EbpfLog::start(&mut ebpf, log_level);
    watch.step("maps created, object loaded");
    if cancelled() {
        return Err(CollectorError::Cancelled);
    }
    let iter = iterator(cfg);
    if iter.is_some() && kernel.iter_task_btf_id == 0 {
        return Err(CollectorError::Kernel(KernelError::MissingMember(
            "bpf_iter_task (the task iterator, Linux 5.8+)".into(),
        )));
    }
    let attach: Vec<(&str, &str)> = lifecycle_programs(cfg, kernel.preemptible_tracepoints)
        .into_iter()
        .chain(lock_programs(&kernel, cfg.floor, cfg.mode))
        .collect();
    // Everything is verified before anything is attached, several programs at a time.
    let iter_btf = iter.map(|_| btf_with_funcs(&[("bpf_iter_task", kernel.iter_task_btf_id)]));
    let names: Vec<&str> = iter
        .into_iter()
        .chain(attach.iter().map(|(_, name)| *name))
        .collect();
    for (name, insns, ms) in verify(&mut ebpf, &names, iter_btf.as_ref(), cancelled)? {
        watch.program(&name, insns, ms);
    }
    watch.step("programs verified, in parallel");
    for (tp, name) in attach {
        if cancelled() {
            return Err(CollectorError::Cancelled);
        }
        let prog: &mut RawTracePoint = program(&mut ebpf, name)?;
        prog.attach(tp).map_err(|e| {
            if is_permission(&e) {
                CollectorError::Permission
            } else if error_chain(&e).contains("No such file") {
                CollectorError::Kernel(if tp.starts_with("contention_") {
                    KernelError::NoContentionTracepoints
                } else {
                    KernelError::NoTracepoints
                })
            } else {
                CollectorError::Attach(tp, error_chain(&e))
            }
        })?;
    }
    watch.step("programs attached");
    Ok(Loaded {
        ebpf,
        kernel,
        report: watch.finish(),
        ebpf_log,
    })
}

/// SIGINT, SIGTERM and SIGHUP blocked on the calling thread (and so on the threads it
/// starts) while it lives. The verifier gives up with `EAGAIN` on a thread with a signal
/// pending, and aya's feature probes, which load small programs, then take a feature for
/// missing: a Ctrl-C during start-up failed the run with "error relocating ... referenced
/// by symbol `KERNEL`" (global data taken for unsupported), 1 run in 6 of the hardening
/// test. Blocked, a signal waits in the process's pending set and is delivered (to the
/// early handler, `signals.rs`) when the mask is restored.
struct SignalsHeld {
    old: libc::sigset_t,
}

impl SignalsHeld {
    fn new() -> Self {
        // SAFETY: sigset_t is plain data initialised by sigemptyset; pthread_sigmask only
        // changes the calling thread's mask and writes the old one into ours.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                libc::sigaddset(&mut set, sig);
            }
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
            SignalsHeld { old }
        }
    }

    /// Whether a signal that ends the run (SIGINT, SIGTERM) arrived meanwhile.
    #[cfg(test)]
    fn pending(&self) -> bool {
        // SAFETY: as above; sigpending fills a set of ours.
        unsafe {
            let mut now: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut now);
            libc::sigpending(&mut now);
            // (SIGHUP asks for a reload, never an end: it waits for the mask.)
            [libc::SIGINT, libc::SIGTERM]
                .into_iter()
                .any(|sig| libc::sigismember(&now, sig) == 1)
        }
    }
}

impl Drop for SignalsHeld {
    fn drop(&mut self) {
        // SAFETY: restores the calling thread's own mask from before.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.old, std::ptr::null_mut()) };
    }
}

/// Verifies (loads) the programs `names`, several at a time: the kernel verifies a program
/// on the thread that loads it, and verification is most of our attach time. Returns each
/// program's instructions verified and milliseconds, in `names`' order; the first failure in
/// that order is the error. A signal is looked at before and after (they take some tens of
/// milliseconds together).
fn verify(
    ebpf: &mut Ebpf,
    names: &[&str],
    iter_btf: Option<&Btf>,
    cancelled: &dyn Fn() -> bool,
) -> Result<Vec<(String, Option<u32>, f64)>, CollectorError> {
    type Outcome = (usize, Result<Option<u32>, CollectorError>, f64);
    let mut jobs: Vec<(usize, &mut Program)> = ebpf
        .programs_mut()
        .filter_map(|(n, p)| Some((names.iter().position(|x| *x == n)?, p)))
        .collect();
    if let Some(missing) = names
        .iter()
        .enumerate()
        .find(|(i, _)| !jobs.iter().any(|(j, _)| j == i))
    {
        return Err(CollectorError::Load(format!(
            "program {} missing",
            missing.1
        )));
    }
    // The largest first (they come last in `names`: the lock tracepoints), so that the
    // threads finish together.
    jobs.sort_by_key(|(i, _)| *i);
    if cancelled() {
        return Err(CollectorError::Cancelled);
    }
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(jobs.len())
        .max(1);
    let queue = std::sync::Mutex::new(jobs);
    let done = std::sync::Mutex::new(Vec::<Outcome>::new());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    let job = queue.lock().map(|mut q| q.pop()).ok().flatten();
                    let Some((i, prog)) = job else { break };
                    let t0 = Instant::now();
                    let loaded = match (&mut *prog, iter_btf) {
                        (Program::Iter(p), Some(btf)) => p.load("task", btf),
                        (Program::RawTracePoint(p), _) => p.load(),
                        _ => Err(ProgramError::NotLoaded),
                    };
                    let outcome = loaded
                        .map(|()| {
                            prog.info()
                                .ok()
                                .and_then(|i| i.verified_instruction_count())
                        })
                        .map_err(|e| load_error(&e));
                    if let Ok(mut d) = done.lock() {
                        d.push((i, outcome, ms(t0.elapsed())));
                    }
                }
            });
        }
    });
    if cancelled() {
        return Err(CollectorError::Cancelled);
    }
    let mut done = done.into_inner().unwrap_or_default();
    done.sort_by_key(|(i, ..)| *i);
    done.into_iter()
        .map(|(i, outcome, ms)| Ok((names[i].to_string(), outcome?, ms)))
        .collect()
}

/// Room for contention mode's threads that waited (`WAITERS`): as many as the statistics map
/// has threads, within a bound (the map is preallocated, about 150 bytes an entry).
fn waiters_capacity(cfg: &CollectorConfig) -> u32 {
    match cfg.mode {
        Mode::Full => 1,
        Mode::Contention => cfg.max_threads.clamp(1024, 1 << 18),
    }
}

/// Bytes of the STACKS ring buffer for a sampling rate (a power of two, at least a page).
pub fn stacks_ring_bytes(stack_sample: u32) -> u32 {
    match stack_sample {
        0 => 4096,
        1..=8 => 8 << 20,
        _ => 512 << 10,
    }
}

#[cfg(test)]
#[path = "load_tests.rs"]
mod tests;
