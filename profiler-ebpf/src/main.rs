//! mmaplock-prof's eBPF programs: raw tracepoints on `mmap_lock_start_locking`,
//! `mmap_lock_acquire_returned` and `mmap_lock_released`.
//!
//! Per acquisition, wait = start_locking -> acquire_returned and hold = acquire_returned ->
//! released, aggregated in the kernel per (owner process of the mm, thread) into log2
//! histograms. Both `acquire_returned` and `released` fire while the lock is held, so every
//! instruction here adds to the hold times we measure: per event the hot path is one
//! task-local-storage lookup (no shared hash, no lock), one clock read and a few stores; the
//! only hash lookup happens at release, into an entry that only the current thread writes.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
// Atomics (the flush claim, and the barrier before an epoch check): the bpfel target has no
// atomic types, but the intrinsics compile to BPF_ATOMIC instructions.
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics, adt_const_params))]
#![cfg_attr(target_arch = "bpf", allow(internal_features))]

#[cfg(target_arch = "bpf")]
mod programs;

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
