//! mmaplock-prof's eBPF programs: raw tracepoints on `mmap_lock_start_locking`,
//! `mmap_lock_acquire_returned` and `mmap_lock_released`, the thread lifecycle, and a task
//! iterator that hands what threads accumulated to userspace.
//!
//! Per acquisition, wait = start_locking -> acquire_returned and hold = acquire_returned ->
//! released, accumulated per thread in task storage and moved into a shared map only when
//! userspace reads (the iterator) or the thread exits. `acquire_returned` and `released` run
//! while the lock is held, so they only take a timestamp and store it: every instruction there
//! lengthens the holds and waits we measure.
//!
//! The modules follow the data: [`arch`] (the one read that differs between architectures),
//! [`maps`] (what is shared with userspace, and the load-time
//! settings), [`kread`] (reading kernel memory), [`state`] (per-thread state), [`owner`] (whose
//! lock, and is it profiled), [`timing`] (the three tracepoints), [`accum`] (pending
//! acquisitions into per-thread accumulators, and those into `STATS`), [`blockers`] (who made
//! whom wait), [`sampling`] (user stacks), [`lifecycle`] (exit, fork, the flush iterator),
//! [`v8copy`] (the objects of sampled V8 frames), [`selection`] (the agent's selectors, matched
//! at exec and fork), [`contention`] (contention
//! mode: `lock:contention_begin/end` instead of the three tracepoints), [`diag`] (rare
//! diagnostics, logged with aya-log when asked for) and [`floors`] (the benchmark's reference
//! programs).
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
// Atomics (flush claims, counters of shared accumulators): the bpfel target has no atomic
// types, but the intrinsics compile to BPF_ATOMIC instructions.
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics, adt_const_params))]
#![cfg_attr(target_arch = "bpf", allow(internal_features))]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

/// The programs' modules, built for the BPF target only (the host build is an empty `main`,
/// for the workspace's checks).
macro_rules! bpf_modules {
    ($($m:ident),* $(,)?) => {
        $(
            #[cfg(target_arch = "bpf")]
            mod $m;
        )*
    };
}

bpf_modules!(
    accum, announce, arch, blockers, contention, diag, floors, kread, lifecycle, maps, owner,
    sampling, selection, slots, state, timing, v8copy,
);

#[cfg(not(target_arch = "bpf"))]
fn main() {}

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[cfg(target_arch = "bpf")]
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
