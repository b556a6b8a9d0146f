//! Types shared by the eBPF programs (`profiler-ebpf`) and the userspace agent (`profiler`).
//!
//! Every type is `#[repr(C)]` with explicit padding so both sides agree on the layout byte for
//! byte; `aya::Pod` is implemented only with the `user` feature, keeping the eBPF side free of
//! userspace dependencies.
#![no_std]

use bytemuck::{Pod, Zeroable};

pub mod cause;
pub mod counter;
pub mod diag;
pub mod scope_info;

mod blockers;
mod hist;
mod load;
mod selection;
mod stacks;
mod stats;
mod threads;

pub use blockers::*;
pub use hist::*;
pub use load::*;
pub use selection::*;
pub use stacks::*;
pub use stats::*;
pub use threads::*;

/// Length of a kernel task command name (`TASK_COMM_LEN`).
pub const COMM_LEN: usize = 16;

/// Index of the read side in `[read, write]` pairs.
pub const READ: usize = 0;
/// Index of the write side in `[read, write]` pairs.
pub const WRITE: usize = 1;

/// An all-zero `T` where a `const` is wanted (`Zeroable::zeroed` is not a `const fn`).
const fn zeroed<T: Zeroable>() -> T {
    // SAFETY: `T: Zeroable` promises that all-zero bytes are a valid `T`.
    unsafe { core::mem::zeroed() }
}

/// Decodes a plain-data record from a ring buffer or an iterator's output (their records are
/// 8-byte aligned at best, hence unaligned); `None` if `bytes` is too short.
pub fn read_record<T: Pod>(bytes: &[u8]) -> Option<T> {
    bytes
        .get(..size_of::<T>())
        .map(bytemuck::pod_read_unaligned)
}

#[cfg(feature = "user")]
pub mod skip;

#[cfg(feature = "user")]
mod user {
    use super::*;

    /// `aya::Pod` for types that are `bytemuck::Pod`, which the derive checks at compile
    /// time (repr(C), no padding, plain integers and arrays of them).
    macro_rules! aya_pod {
        ($($t:ty),* $(,)?) => {$(
            // SAFETY: `$t: bytemuck::Pod` (asserted below): any bit pattern is valid and
            // there are no padding bytes, which is what `aya::Pod` requires.
            unsafe impl aya::Pod for $t {}
            const _: fn() = || {
                fn is_pod<T: bytemuck::Pod>() {}
                is_pod::<$t>();
            };
        )*};
    }

    aya_pod!(
        LockStats,
        StatsKey,
        ThreadStats,
        NewThread,
        ExitedThread,
        ThreadCpu,
        Settings,
        KernelLayout,
        Filter,
        ExeSelector,
        CgroupSelector,
        SelectorCounts,
        HolderId,
        LockAcc,
        BlockedKey,
        BlockedVal,
        V8Frames,
        V8Named,
        SampleRate,
    );
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use core::mem::size_of;
    use std::vec;

    /// A record is read from any offset (rings align to 8 bytes, an iterator's output not at
    /// all), trailing bytes ignored; a short one is refused.
    #[test]
    fn records_are_read_unaligned_and_whole() {
        let rec = ThreadCpu {
            tid: 7,
            tgid: 5,
            tid_start: 1 << 40,
            cpu_ns: 123_456,
            queued_ns: 7,
            at_ns: u64::MAX,
            owner_start: 1 << 39,
            comm: *b"libuv-worker\0\0\0\0",
            flags: thread_cpu::BYSTANDER,
            _pad: 0,
        };
        let mut bytes = vec![0xa5u8; 3];
        bytes.extend_from_slice(bytemuck::bytes_of(&rec));
        bytes.push(1);
        assert_eq!(read_record::<ThreadCpu>(&bytes[3..]), Some(rec));
        assert_eq!(read_record::<ThreadCpu>(&bytes[3..bytes.len() - 2]), None);
        assert_eq!(read_record::<u32>(&bytes[3..]), Some(7));
    }

    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(size_of::<LockStats>(), 6 * 8 + 2 * 4 * HIST_BUCKETS);
        assert_eq!(size_of::<StatsKey>(), 32);
        assert_eq!(size_of::<ExitedThread>(), 64 + COMM_LEN);
        assert_eq!(size_of::<ThreadCpu>(), 56 + COMM_LEN);
        assert_eq!(
            size_of::<ThreadStats>(),
            16 + COMM_LEN + size_of::<LockStats>()
        );
        assert_eq!(size_of::<KernelLayout>(), 27 * 4);
        assert_eq!(size_of::<HolderId>(), 24);
        assert_eq!(size_of::<LockAcc>(), 64 + HOLDER_SLOTS * (8 + 24));
        assert_eq!(size_of::<BlockedKey>(), 6 * 4 + 3 * 8);
        assert_eq!(size_of::<BlockedVal>(), 16);
        assert!(HOLDER_SLOTS.is_power_of_two() && LOCK_SLOTS.is_power_of_two());
        // Holder slots spread: the threads of a process, and the kinds of one thread.
        let mut used = [0u32; HOLDER_SLOTS];
        for tid in 1000..1016 {
            used[holder_slot(tid, cause::MPROTECT)] += 1;
        }
        assert!(used.iter().filter(|&&n| n > 0).count() >= 10, "{used:?}");
        assert_ne!(holder_slot(7, cause::READ), holder_slot(7, cause::MUNMAP));
        assert_eq!(size_of::<StackHeader>(), 80);
        assert_eq!(
            size_of::<StackSample>(),
            80 + STACK_BYTES + V8_COPY_SLOTS * 80
        );
        assert!(V8_COPY_SLOTS.is_power_of_two() && V8_COPY_SLOTS > MAX_V8_COPIES);
        assert_eq!(size_of::<V8Copy>(), 8 + V8_COPY_BYTES);
        assert_eq!(size_of::<V8Frames>(), 64);
        assert_eq!(size_of::<V8Named>(), 16);
        assert!(size_of::<StackSample>() < 32 << 10);
        assert_eq!(size_of::<SampleDone>(), 32);
        assert_eq!(STACK_BYTES % STACK_CHUNK, 0);
        assert_eq!(size_of::<NewThread>(), 16 + 24 + COMM_LEN + 8);
        assert_eq!(size_of::<Filter>(), 20 + 4 * MAX_FILTER_PIDS);
        // A selection's value: its start ticks, mark, how and selector, each read back.
        let v = selected_value(123_456_789, true, how::RENAME, 70);
        assert_eq!(
            (
                selected_ticks(v),
                v & SELECTED_BY_RULE != 0,
                selected_how(v),
                selected_selector(v)
            ),
            (123_456_789, true, how::RENAME, 70)
        );
        assert_eq!(selected_value(5, false, how::SET, 0), 5);
    }
}
