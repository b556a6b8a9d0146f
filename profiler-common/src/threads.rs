//! Threads coming and going: announced on `NEW_THREADS`, exiting on `EXITED`, and their CPU
//! time from the flush iterator.

use bytemuck::{Pod, Zeroable};

use crate::COMM_LEN;

/// Sent on the `NEW_THREADS` ring buffer when a thread's first acquisitions of a profiled
/// lock are flushed (outside the lock), so that userspace classifies it while it (very
/// likely) still runs.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct NewThread {
    pub owner: u32,
    pub tid: u32,
    pub tgid: u32,
    pub _pad: u32,
    pub owner_start: u64,
    pub tid_start: u64,
    pub fsbase: u64,
    pub comm: [u8; COMM_LEN],
    /// The thread's start routine, read from its glibc `struct pthread` (at the fs base, at
    /// the offset `Settings::start_routine_off` calibrated on our glibc) by the thread itself
    /// as it was announced: kept even if its process is gone when userspace reads the record,
    /// and meaningful only for a process that maps our C library. 0: not read.
    pub start_routine: u64,
}

/// Records of the `EXITED` ring buffer: a thread that had profiler state is exiting, or is
/// gone for good.
pub mod exit_record {
    /// The thread is exiting but its pending acquisitions could not be flushed yet (another
    /// context held its ring): wait for its `FREED`.
    pub const EXITING: u32 = 1;
    /// The exiting thread's acquisitions are flushed into `STATS` (at `sched_process_exit`,
    /// at any release after it, or when the task is freed): its entries may be read one last
    /// time and deleted. Sent again if it takes a lock after that (the last thread's
    /// exit_mmap).
    pub const FREED: u32 = 2;
    /// A profiled (or newly selected) process has exec'd: its name, maps and code are new
    /// (`tid` is the process's pid, `tid_start` its start time).
    pub const EXEC: u32 = 3;
    /// A process was selected as it forked from a selected one (`tid` is its pid,
    /// `tid_start` its start time): it runs its parent's image, in its parent's cgroup.
    pub const FORK: u32 = 4;
    /// A thread of a profiled process that was not profiled itself (it took none of its
    /// profiled locks, or, in contention mode, never waited) is exiting: its time alive ends
    /// at `at_ns`, its CPU time is `cpu_ns`, its process started at `owner_start`. Its time
    /// is the process's all the same (the time shares count every thread).
    pub const BYSTANDER: u32 = 5;
}

/// A record of the `EXITED` ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct ExitedThread {
    /// An [`exit_record`] tag.
    pub tag: u32,
    pub tid: u32,
    pub tgid: u32,
    pub _pad: u32,
    pub tid_start: u64,
    /// The thread's CPU time (`se.sum_exec_runtime`, ns) when the notice was sent.
    pub cpu_ns: u64,
    /// Its run-queue delay then (`sched_info.run_delay`, ns), or [`NO_RUN_DELAY`].
    pub queued_ns: u64,
    /// When the notice was sent, ns since boot (the clock of `tid_start`).
    pub at_ns: u64,
    /// EXEC and FORK: the process's cgroup (v2 id), so that one gone before userspace could
    /// read its /proc entry is still labelled by its cgroup.
    pub cgroup_id: u64,
    /// BYSTANDER: its process's start time (ns since boot, the clock of `tid_start`); 0
    /// otherwise.
    pub owner_start: u64,
    /// The thread's command name when the notice was sent: at EXEC, the new image's (a
    /// process that exits before userspace reads its /proc entry is still named after what
    /// it exec'd, not after runc's init that exec'd it).
    pub comm: [u8; COMM_LEN],
}

/// `ThreadCpu::flags`.
pub mod thread_cpu {
    /// The thread is not profiled itself but its process is (its address space is the one
    /// the process's profiled threads noted): a bystander, whose time is its process's.
    pub const BYSTANDER: u32 = 1;
}

/// A thread's CPU time, written by the flush iterator into its output (read by userspace each
/// time it runs the iterator): a profiled thread's whenever it changed since the last time,
/// and every pass that of each thread of a profiled process that is not profiled itself
/// (`thread_cpu::BYSTANDER`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct ThreadCpu {
    pub tid: u32,
    pub tgid: u32,
    pub tid_start: u64,
    /// `se.sum_exec_runtime`, ns.
    pub cpu_ns: u64,
    /// `sched_info.run_delay`, ns (time runnable but waiting for a CPU), or [`NO_RUN_DELAY`].
    pub queued_ns: u64,
    /// When it was read, ns since boot.
    pub at_ns: u64,
    /// A bystander's process's start time (ns since boot); 0 for a profiled thread.
    pub owner_start: u64,
    /// A bystander's name (its role is told by it: its start routine is not read).
    pub comm: [u8; COMM_LEN],
    /// [`thread_cpu`] flags.
    pub flags: u32,
    pub _pad: u32,
}

/// A record's `queued_ns` on a kernel that keeps no run-queue delay (no CONFIG_SCHED_INFO).
pub const NO_RUN_DELAY: u64 = u64::MAX;
