//! Stack sampling (`--stack-sample`): the user registers and the top of the user stack of one
//! write in N, copied at `start_locking`, before the lock is held, for userspace to unwind.

use aya_ebpf::{
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP, BPF_RB_RING_SIZE},
    helpers::{bpf_get_prandom_u32, bpf_probe_read_user_buf},
};
use profiler_common::{STACK_BYTES, STACK_CHUNK, StackSample, counter, stack_record};

use crate::{
    kread::Task,
    maps::{KERNEL, SETTINGS, STACKS, bump, konst},
    state::ThreadState,
};

/// Whether this write is sampled: one in `--stack-sample`, at random (a counter would alias
/// with periodic workloads: a loop of mmap then munmap sampled one in an even N shows
/// munmaps only). Returns the sample's sequence number (never 0, which means "not sampled";
/// below 2^16, and unique among a thread's last 65,535 writes).
#[inline(always)]
pub fn pick(st: &mut ThreadState) -> u16 {
    let every = konst(&SETTINGS.stack_sample);
    if every == 0 {
        return 0;
    }
    st.writes = st.writes.wrapping_add(1);
    // SAFETY: no preconditions.
    if every != 1 && unsafe { bpf_get_prandom_u32() } % every != 0 {
        return 0;
    }
    let seq = st.writes as u16;
    if seq == 0 { 1 } else { seq }
}

/// Copies the current thread's user registers and the top of its user stack to STACKS.
/// Returns whether it was sent.
#[inline(always)]
pub fn sample(
    task: Task,
    tid: u32,
    tgid: u32,
    owner: u32,
    owner_start: u64,
    kind: u32,
    seq: u16,
) -> bool {
    let sp_off = konst(&KERNEL.regs_sp);
    if sp_off == 0 {
        return false;
    }
    let Some(regs) = task.user_regs() else {
        return false;
    };
    let Some(mut entry) = STACKS.reserve::<StackSample>(0) else {
        bump(counter::STACKS_LOST);
        return false;
    };
    let e = entry.as_mut_ptr();
    let sp = regs.u64_at(sp_off);
    // SAFETY: `e` points to a reserved ring buffer record of StackSample's size, ours until
    // submitted; its header is written field by field, the stack below.
    unsafe {
        (*e).tag = stack_record::SAMPLE;
        (*e).owner = owner;
        (*e).tid = tid;
        (*e).tgid = tgid;
        (*e).kind = kind;
        (*e).seq = seq as u32;
        (*e).ip = regs.u64_at(konst(&KERNEL.regs_ip));
        (*e).sp = sp;
        (*e).bp = regs.u64_at(konst(&KERNEL.regs_bp));
        (*e).owner_start = owner_start;
        (*e)._pad = 0;
    }
    // Only as deep as the stack is: a glibc thread's fs base is its `struct pthread`, at the
    // top of its stack, above the outermost frame (the main thread's is elsewhere: it gets
    // the whole copy). Copying 16 KiB of cold memory above a shallow C stack cost some
    // 9 us a sample.
    let fs_off = konst(&KERNEL.task_fsbase);
    let fs = if fs_off == 0 { 0 } else { task.u64_at(fs_off) };
    let depth = if fs > sp && fs - sp < STACK_BYTES as u64 {
        (fs - sp) as usize
    } else {
        STACK_BYTES
    };
    // Chunk by chunk, so that a stack whose mapping ends within STACK_BYTES still yields the
    // part that exists.
    let mut len = 0u32;
    for i in 0..STACK_BYTES / STACK_CHUNK {
        let off = i * STACK_CHUNK;
        if off >= depth {
            break;
        }
        // SAFETY: a subslice of the reserved record's stack array.
        let dst = unsafe { &mut (&mut (*e).stack)[off..off + STACK_CHUNK] };
        // SAFETY: bpf_probe_read_user fails instead of faulting on unmapped user memory.
        if unsafe { bpf_probe_read_user_buf((sp + off as u64) as *const u8, dst) }.is_err() {
            break;
        }
        len += STACK_CHUNK as u32;
    }
    // SAFETY: as above.
    unsafe { (*e).stack_len = len };
    entry.submit(wakeup_flags());
    true
}

/// Ring buffer flags for a STACKS record: no wakeup of userspace (which drains the ring every
/// 50 ms) until a quarter of the ring is used. Waking it for every sample cost far more
/// than copying the sample: a wakeup signals another CPU, which a virtual machine pays
/// dearly for (about 19 us a sample here, 300 ns a write at one write in 64).
#[inline(always)]
pub fn wakeup_flags() -> u64 {
    let size = STACKS.query(BPF_RB_RING_SIZE as u64);
    if STACKS.query(BPF_RB_AVAIL_DATA as u64) >= size / 4 {
        BPF_RB_FORCE_WAKEUP as u64
    } else {
        BPF_RB_NO_WAKEUP as u64
    }
}
