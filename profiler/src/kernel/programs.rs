//! Which programs a run attaches, by mode: the lock's tracepoints (the mmap_lock ones in full
//! mode, the contention ones in contention mode, or a floor's), the programs following threads
//! and processes, and the task iterator run before each reading; in the order they attach.

use super::{
    btf::KernelInfo,
    collector::{CollectorConfig, Floor},
};
use crate::vocab::Mode;

/// The mmap_lock tracepoints, full mode's (see [`lock_programs`]).
pub const TRACEPOINTS: [&str; 3] = [
    "mmap_lock_start_locking",
    "mmap_lock_acquire_returned",
    "mmap_lock_released",
];

/// Full mode's program handing every thread's accumulators over when its iterator is read.
pub const FLUSH_ITER: &str = "flush_threads";

/// Contention mode's iterator: notes the profiled processes' locks, reports CPU times.
pub const CONTENTION_ITER: &str = "contention_threads";

/// The programs on the lock's tracepoints for this run, as (tracepoint, program), in the
/// order they are attached: a release before the acquisitions it ends, an acquire before the
/// waits it ends (an acquire seen before start_locking is attached counts as a trylock), and a
/// contention's end before its begin, so that no wait is left without its end while the
/// programs attach one by one. These are the programs whose cost the report gives.
pub fn lock_programs(
    kernel: &KernelInfo,
    floor: Floor,
    mode: Mode,
) -> Vec<(&'static str, &'static str)> {
    let full = match floor {
        Floor::Empty => [
            "floor_start_locking",
            "floor_acquire_returned",
            "floor_released",
        ],
        Floor::Clock => [
            "clock_start_locking",
            "clock_acquire_returned",
            "clock_released",
        ],
        Floor::Storage => [
            "storage_start_locking",
            "storage_acquire_returned",
            "storage_released",
        ],
        Floor::Off if mode == Mode::Contention => {
            return with_second_copies(
                kernel,
                vec![
                    ("contention_end", "contention_end"),
                    ("contention_begin", "contention_begin"),
                ],
            );
        }
        Floor::Off => [
            kernel.tracepoints.start_program(),
            kernel.tracepoints.acquire_program(),
            "mmap_lock_released",
        ],
    };
    let firsts = TRACEPOINTS.into_iter().zip(full).rev().collect();
    if floor.is_on() {
        firsts
    } else {
        with_second_copies(kernel, firsts)
    }
}

/// Where the kernel may skip a program (`kernel::skipped`), each lock program's second copy
/// (`profiler-ebpf/src/timing.rs`, `contention`) right after it: a tracepoint calls its
/// programs in the order they were attached, and the second looks at what the first did.
fn with_second_copies(
    kernel: &KernelInfo,
    firsts: Vec<(&'static str, &'static str)>,
) -> Vec<(&'static str, &'static str)> {
    if !kernel.preemptible_tracepoints {
        return firsts;
    }
    let second = |program: &str| match program {
        "mmap_lock_start_locking" => "mmap_lock_start_locking_second",
        "mmap_lock_start_locking_memcg" => "mmap_lock_start_locking_memcg_second",
        "mmap_lock_acquire_returned" => "mmap_lock_acquire_returned_second",
        "mmap_lock_acquire_returned_memcg" => "mmap_lock_acquire_returned_memcg_second",
        "mmap_lock_released" => "mmap_lock_released_second",
        "contention_end" => "contention_end_second",
        "contention_begin" => "contention_begin_second",
        other => unreachable!("{other} has no second copy"),
    };
    firsts
        .into_iter()
        .flat_map(|(tp, p)| [(tp, p), (tp, second(p))])
        .collect()
}

/// The task iterator run before each reading (none for the floors).
pub fn iterator(cfg: &CollectorConfig) -> Option<&'static str> {
    match (cfg.floor.is_on(), cfg.mode) {
        (true, _) => None,
        (false, Mode::Full) => Some(FLUSH_ITER),
        (false, Mode::Contention) => Some(CONTENTION_ITER),
    }
}

/// The programs following threads and processes, as (tracepoint, program): exits (announced
/// so that userspace knows whom to wait for at the end), execs (a profiled process's new
/// name and image; the agent's selection at exec), forks (to follow a target's descendants,
/// `--children`, and the agent's selection), renames (selection by command name), and in
/// contention mode the task's free (its state goes). Where tracepoint programs can be
/// preempted (`preemptible`), the exits (and contention mode's frees) have second copies: a
/// thread whose exit was skipped would lose what it accumulated since its last copy.
pub fn lifecycle_programs(
    cfg: &CollectorConfig,
    preemptible: bool,
) -> Vec<(&'static str, &'static str)> {
    if cfg.floor.is_on() {
        return Vec::new();
    }
    let mut v = match cfg.mode {
        Mode::Full if preemptible => vec![
            ("sched_process_exit", "sched_process_exit"),
            ("sched_process_exit", "sched_process_exit_second"),
        ],
        Mode::Full => vec![("sched_process_exit", "sched_process_exit")],
        Mode::Contention if preemptible => vec![
            ("sched_process_exit", "contention_exit"),
            ("sched_process_exit", "contention_exit_second"),
            ("sched_process_free", "contention_free"),
            ("sched_process_free", "contention_free_second"),
        ],
        Mode::Contention => vec![
            ("sched_process_exit", "contention_exit"),
            ("sched_process_free", "contention_free"),
        ],
    };
    v.push(("sched_process_exec", "sched_process_exec"));
    if cfg.children || cfg.selection {
        v.push(("sched_process_fork", "sched_process_fork"));
    }
    if cfg.selection || !cfg.comms.is_empty() {
        v.push(("task_rename", "task_rename"));
    }
    v
}
