//! What userspace hands the eBPF programs at load time, besides the selection: run-time
//! settings and the running kernel's layout.

use bytemuck::{Pod, Zeroable};

/// Run-time settings, passed as the `SETTINGS` global at load time.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Settings {
    /// Capture the user stack of one in this many write acquisitions per thread (0: never).
    pub stack_sample: u32,
    /// Non-zero: profile write acquisitions only (`--writes-only`). Read acquisitions then
    /// cost a few instructions; a downgraded write's hold runs to its final release.
    pub writes_only: u32,
    /// Non-zero: charge each wait to the holds that made it wait (`BLOCKED`): every write
    /// hold, and read holds released while a profiled writer waits, add their time to the
    /// lock's accumulators (`LOCKS`) at release.
    pub blockers: u32,
    /// The profiler's own process (tgid): its threads' acquisitions of a profiled lock are
    /// counted apart (`counter::PROFILER_OWN`, role `profiler`) and never charged as blockers.
    pub self_tgid: u32,
    /// Non-zero when the CPU orders stores (x86-64): a flush claim is then released with a
    /// plain store instead of an atomic exchange (the BPF instruction set has no release
    /// store; on weakly ordered CPUs the exchange is the barrier).
    pub strong_order: u32,
    /// Where our glibc keeps a thread's `start_routine`, from the thread pointer
    /// (`KernelLayout::task_fsbase`), in bytes (0: unknown): after it on x86_64, whose fs
    /// base is the `struct pthread`; before it on arm64, whose TPIDR_EL0 points at the TCB
    /// that follows the `struct pthread`. A thread reads its own when it is announced
    /// (`NewThread::start_routine`).
    pub start_routine_off: i32,
    /// Non-zero in tests only (`MMAPLOCK_PROF_SPILL_TEST`): half the completed acquisitions
    /// take the path of a full ring held elsewhere (`counter::SPILLED`), so that its counts
    /// can be checked against ground truth.
    pub spill_test: u32,
    /// Non-zero: a thread's wait (contention mode: a contended write or read; full mode: a
    /// write) is sampled whenever the thread had no sample for this many milliseconds,
    /// besides one in `stack_sample`: every thread that waits in a second has a stack in it
    /// (the agent's triggered captures, whose `before.pb.gz` must hold the window's waits).
    pub sample_floor_ms: u32,
    /// Non-zero: a process's first floor sample is due a floor's time after its first wait
    /// (or write), not at it (the agent's: a floor serves its captures, and a process is
    /// captured only once it has been measured over a whole window, never in its first
    /// second; a host's short processes, a test runner's or a build's, then take none).
    pub floor_after_first: u32,
    /// Non-zero: at most about this many stacks a second per process. A process sampling
    /// more has its one-in-N doubled (and halved again, never below `stack_sample`, once it
    /// samples a quarter of it), each sample carrying the N it was drawn at
    /// (`StackHeader::every`) so that userspace weights it: a hot process costs the
    /// profiler a bounded number of stacks, its estimates still unbiased.
    pub max_stack_rate: u32,
}

/// Kernel facts the eBPF programs need, found by userspace in the running kernel's BTF and
/// passed as the `KERNEL` global at load time (offsets in bytes; 0 = absent).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct KernelLayout {
    pub task_mm: u32,
    pub task_tgid: u32,
    pub task_group_leader: u32,
    pub task_comm: u32,
    /// `mm_struct.owner` (CONFIG_MEMCG); 0 when the kernel has none, and then a foreign
    /// thread's acquisition is charged to owner 0.
    pub mm_owner: u32,
    /// `task_struct.flags` (PF_EXITING, PF_KTHREAD).
    pub task_flags: u32,
    /// The thread pointer the kernel keeps for a task, where glibc's `struct pthread` is
    /// found: x86_64 `task_struct.thread.fsbase`, arm64 `task_struct.thread.uw.tp_value`
    /// (TPIDR_EL0). Called `fsbase` throughout, whichever it is.
    pub task_fsbase: u32,
    /// The syscall number saved at kernel entry (-1 at an exception's): x86_64
    /// `pt_regs.orig_ax` (a u64), arm64 `pt_regs.syscallno` (an s32; how wide is the
    /// eBPF side's `arch` module's business).
    pub regs_syscall: u32,
    /// The user registers saved at kernel entry: the instruction pointer, the stack pointer
    /// and the frame pointer (x86_64 `pt_regs.ip`, `sp`, `bp`; arm64 `pt_regs.pc`, `sp`,
    /// `regs[29]`).
    pub regs_ip: u32,
    pub regs_sp: u32,
    pub regs_bp: u32,
    /// `task_struct.start_boottime` (ns since boot, what /proc reports as a start time).
    pub task_start_boottime: u32,
    /// `task_struct.pid`.
    pub task_pid: u32,
    /// `mm_struct.mmap_lock.count` (the rwsem's count word): a blocking acquisition that
    /// finds the lock free takes no blockers snapshot (`--blockers`).
    pub mm_lock_count: u32,
    /// `task_struct.se.sum_exec_runtime` (a thread's CPU time, ns).
    pub task_cpu_ns: u32,
    /// Non-zero when the kernel has `bpf_loop` (Linux 5.17+): loops over a thread's pending
    /// acquisitions, accumulators and holder slots are then verified once, not per
    /// iteration, which is most of the attach time.
    pub has_bpf_loop: u32,
    /// The executable a process runs, for `--exe` selectors matched at exec:
    /// `mm_struct.exe_file`, `file.f_path.dentry`, `dentry.d_name.len`, `dentry.d_name.name`
    /// and `dentry.d_parent`.
    pub mm_exe_file: u32,
    pub file_dentry: u32,
    pub dentry_name_len: u32,
    pub dentry_name: u32,
    pub dentry_parent: u32,
    /// `mm_struct.context.ctx_id` (x86_64: an id the kernel gives each address space and never
    /// reuses; 0 elsewhere): tells a freed address space from a new one at the same address.
    pub mm_ctx_id: u32,
    /// `mm_struct.mmap_lock`: contention mode tells an mm's lock from every other lock the
    /// contention tracepoints report by its address, `mm + mm_lock`.
    pub mm_lock: u32,
    /// `rw_semaphore.owner`: the task holding the lock for write (flags in its low 3 bits;
    /// bit 0 set when readers own it), read when a contended wait begins.
    pub rwsem_owner: u32,
    /// `task_struct.stack`: another task's saved user registers sit at a fixed distance from
    /// its kernel stack (found on the current task), for a holder's syscall.
    pub task_stack: u32,
    /// The link register saved at kernel entry (arm64 `pt_regs.regs[30]`: a leaf function's
    /// return address, which its frame may not hold, such as glibc's syscall wrappers); 0
    /// where return addresses are on the stack (x86_64).
    pub regs_lr: u32,
    /// `task_struct.sched_info.run_delay` (CONFIG_SCHED_INFO: a thread's time runnable but
    /// waiting for a CPU, ns); 0 when the kernel keeps none, and the records then carry
    /// [`crate::NO_RUN_DELAY`].
    pub task_run_delay: u32,
}
