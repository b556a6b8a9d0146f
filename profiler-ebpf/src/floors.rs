//! The benchmark's reference programs on the same tracepoints: the floor (`--floor`, empty
//! programs: what any program there costs) and the clock floor (`--floor-clock`, one clock
//! read each: the least any program that times acquisitions pays under the lock).

use aya_ebpf::{helpers::bpf_ktime_get_ns, macros::raw_tracepoint, programs::RawTracePointContext};

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
