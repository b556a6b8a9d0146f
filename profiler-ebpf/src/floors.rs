//! The benchmark's reference programs on the same tracepoints: the floor (`--floor`, empty
//! programs: what any program there costs), the clock floor (`--floor-clock`, one clock read
//! each: the least any program that times acquisitions pays under the lock) and the storage
//! floor (`--floor-storage`, one clock read stored in the thread's task storage: the least a
//! program that times each acquisition per thread, as the profiler does, pays).

use aya_ebpf::{helpers::bpf_ktime_get_ns, macros::raw_tracepoint, programs::RawTracePointContext};

use crate::{kread::Task, state::TaskStorage};

/// The storage floor's per-thread value: the last clock read.
#[unsafe(link_section = ".maps")]
#[unsafe(export_name = "FLOOR_STATE")]
static FLOOR_STATE: TaskStorage<u64> = TaskStorage::new();

#[raw_tracepoint(tracepoint = "mmap_lock_start_locking")]
pub fn floor_start_locking(_ctx: RawTracePointContext) -> i32 {
    0
}

#[raw_tracepoint(tracepoint = "mmap_lock_acquire_returned")]
pub fn floor_acquire_returned(_ctx: RawTracePointContext) -> i32 {
    0
}

#[raw_tracepoint(tracepoint = "mmap_lock_released")]
pub fn floor_released(_ctx: RawTracePointContext) -> i32 {
    0
}

/// One clock read, its result used so that it is not optimised away.
#[inline(always)]
fn clock() -> i32 {
    // SAFETY: no preconditions.
    (unsafe { bpf_ktime_get_ns() } & 1) as i32
}

#[raw_tracepoint(tracepoint = "mmap_lock_start_locking")]
pub fn clock_start_locking(_ctx: RawTracePointContext) -> i32 {
    clock()
}

#[raw_tracepoint(tracepoint = "mmap_lock_acquire_returned")]
pub fn clock_acquire_returned(_ctx: RawTracePointContext) -> i32 {
    clock()
}

#[raw_tracepoint(tracepoint = "mmap_lock_released")]
pub fn clock_released(_ctx: RawTracePointContext) -> i32 {
    clock()
}

/// One clock read, stored in the thread's task storage (created at its first run).
#[inline(always)]
fn stored_clock() -> i32 {
    // SAFETY: no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    if let Some(v) = FLOOR_STATE.get(Task::current(), true) {
        *v = now;
    }
    0
}

#[raw_tracepoint(tracepoint = "mmap_lock_start_locking")]
pub fn storage_start_locking(_ctx: RawTracePointContext) -> i32 {
    stored_clock()
}

#[raw_tracepoint(tracepoint = "mmap_lock_acquire_returned")]
pub fn storage_acquire_returned(_ctx: RawTracePointContext) -> i32 {
    stored_clock()
}

#[raw_tracepoint(tracepoint = "mmap_lock_released")]
pub fn storage_released(_ctx: RawTracePointContext) -> i32 {
    stored_clock()
}
