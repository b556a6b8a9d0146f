//! Stack sampling (`--stack-sample`): the user registers and the top of the user stack of one
//! write in N, copied at `start_locking`, before the lock is held, for userspace to unwind.

use core::ptr;

use aya_ebpf::{
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP, BPF_RB_RING_SIZE},
    helpers::{bpf_get_prandom_u32, bpf_probe_read_kernel_buf, bpf_probe_read_user_buf},
};
use profiler_common::{
    STACK_BYTES, STACK_CHUNK, SampleDone, SampleRate, StackHeader, StackSample, V8_COPY_SLOTS,
    V8Copy, counter, stack_record,
};

use crate::{
    kread::{self, Task},
    maps::{
        FLOOR_LAST, KERNEL, SAMPLE_BUF, SAMPLE_RATE, SETTINGS, STACKS, STACKS_WAKE, bump, konst,
    },
    state::ThreadState,
};

/// Whether this write is sampled: one in `--stack-sample` on average, at random (a counter
/// would alias with periodic workloads: a loop of mmap then munmap sampled one in an even N
/// shows munmaps only), or one in more in a process past `Settings::max_stack_rate` (see
/// [`every_for`]). The gaps between samples are drawn uniformly in 1..=2N-1 (mean N), one
/// draw per sample: a random number per write cost about 8% of `start_locking`. Returns the
/// sample's sequence number (never 0, which means "not sampled"; below 2^16, and unique
/// among a thread's last 65,535 writes).
#[inline(always)]
pub fn pick(st: &mut ThreadState, tgid: u32) -> u16 {
    pick_in(
        tgid,
        &mut st.writes,
        &mut st.sample_left,
        &mut st.sample_every,
    )
}

/// [`pick`] on a thread's counters wherever they are kept (contention mode keeps them in a
/// hash map: its programs use no task storage). `every` keeps the N the current gap was
/// drawn at: the weight of the sample that ends it.
#[inline(always)]
pub fn pick_in(tgid: u32, writes: &mut u32, sample_left: &mut u32, every: &mut u32) -> u16 {
    let base = konst(&SETTINGS.stack_sample);
    if base == 0 {
        return 0;
    }
    *writes = writes.wrapping_add(1);
    if *sample_left == 0 {
        let n = every_for(tgid, base);
        *every = n;
        *sample_left = if n <= 1 {
            1
        } else {
            // SAFETY: no preconditions.
            let r = unsafe { bpf_get_prandom_u32() };
            1 + r % n.saturating_mul(2).saturating_sub(1)
        };
    }
    *sample_left -= 1;
    if *sample_left != 0 {
        return 0;
    }
    let seq = *writes as u16;
    if seq == 0 { 1 } else { seq }
}

/// How often the rate of a process is looked at: often enough that a process that lives a
/// second is bounded for most of it.
const RATE_WINDOW_NS: u64 = 100_000_000;
/// The most a rate is raised to (one in 2^20 of a thread's waits).
const MAX_EVERY: u32 = 1 << 20;

/// The one-in-N process `tgid`'s next gap is drawn at: `base` (`--stack-sample`) without a
/// bound on stacks a second. With one, doubled as soon as the process has drawn more gaps in
/// the current window of about 100 ms than the bound allows a window (from its first window
/// on: a process that starts writing a hundred thousand times a second takes a few hundred
/// stacks, not thousands), and halved (never below `base`) after a window in which it drew a
/// quarter of what the bound allowed or less. Called once per sample, not per write. Updates
/// from several CPUs may race: a lost count only moves the rate a little later, and each
/// sample carries the N it was drawn at, so the weights stay exact.
#[inline(always)]
fn every_for(tgid: u32, base: u32) -> u32 {
    let max = konst(&SETTINGS.max_stack_rate);
    if max == 0 {
        return base;
    }
    let now = crate::timing::now();
    let Some(r) = SAMPLE_RATE.get_ptr_mut(tgid) else {
        let first = SampleRate {
            every: base,
            drawn: 1,
            since: now,
        };
        let _ = SAMPLE_RATE.insert(tgid, first, 0);
        return base;
    };
    // SAFETY: a map value, valid while this program runs; racing updates are tolerated
    // (above).
    let r = unsafe { &mut *r };
    let elapsed = now.wrapping_sub(r.since);
    if elapsed >= RATE_WINDOW_NS {
        // What the window allowed, at least one.
        let allowed = (max as u64 * elapsed / 1_000_000_000).max(1);
        if r.drawn as u64 * 4 <= allowed && r.every / 2 >= base {
            r.every /= 2;
        }
        r.drawn = 0;
        r.since = now;
    }
    r.drawn = r.drawn.wrapping_add(1);
    let per_window = (max as u64 * RATE_WINDOW_NS / 1_000_000_000).max(1);
    if r.drawn as u64 > per_window && r.every < MAX_EVERY {
        r.every = r.every.max(base).saturating_mul(2);
        r.drawn /= 2;
    }
    r.every.max(base)
}

/// The sampling floor (`Settings::sample_floor_ms`): when process `tgid`'s last floor sample
/// is that old (or it has none), this pick is a sample (`*left` set to 1). `seen` is the
/// thread's own copy of that time: the process's can only be later, so the map is looked up
/// only once the thread's copy is a floor old (at most once a floor per thread, not per
/// write). With `Settings::floor_after_first`, a process the floor has not seen yet is only
/// noted: its first floor sample is due a floor's time later. Returns the time read, for
/// [`floor_taken`] (0 without a floor: the clock is then not read).
#[inline(always)]
pub fn floor_due(tgid: u32, left: &mut u32, seen: &mut u64) -> u64 {
    let ms = konst(&SETTINGS.sample_floor_ms);
    if ms == 0 {
        return 0;
    }
    let t = crate::timing::now();
    let floor = ms as u64 * 1_000_000;
    if t.wrapping_sub(*seen) >= floor {
        // SAFETY: the value is copied out at once (another CPU may update it: a stale time
        // only samples one more).
        *seen = match unsafe { FLOOR_LAST.get(tgid) } {
            Some(&last) => last,
            None if konst(&SETTINGS.floor_after_first) != 0 => {
                let _ = FLOOR_LAST.insert(tgid, t, 0);
                t
            }
            None => 0,
        };
        if t.wrapping_sub(*seen) >= floor {
            *left = 1;
        }
    }
    t
}

/// A sample was taken at `t` (from [`floor_due`]; 0: no floor) for process `tgid`.
#[inline(always)]
pub fn floor_taken(tgid: u32, t: u64, seen: &mut u64) {
    if t != 0 {
        *seen = t;
        let _ = FLOOR_LAST.insert(tgid, t, 0);
    }
}

/// Copies the current thread's user registers and the top of its user stack to STACKS.
/// Returns whether it was sent.
#[inline(always)]
#[allow(clippy::too_many_arguments)] // the header's fields, inlined: no struct to build
pub fn sample(
    task: Task,
    tid: u32,
    tgid: u32,
    owner: u32,
    owner_start: u64,
    kind: u32,
    seq: u16,
    every: u32,
) -> bool {
    let sp_off = konst(&KERNEL.regs_sp);
    if sp_off == 0 {
        return false;
    }
    let Some(regs) = task.user_regs() else {
        return false;
    };
    let head = StackHeader {
        tag: stack_record::SAMPLE,
        owner,
        tid,
        tgid,
        kind,
        seq: seq as u32,
        ip: regs.u64_at(konst(&KERNEL.regs_ip)),
        sp: regs.u64_at(sp_off),
        bp: regs.u64_at(konst(&KERNEL.regs_bp)),
        owner_start,
        stack_len: 0,
        waiter: 0,
        lr: reg_or_zero(regs, konst(&KERNEL.regs_lr)),
        every,
        _pad: 0,
    };
    let fs_off = konst(&KERNEL.task_fsbase);
    let fs = if fs_off == 0 { 0 } else { task.u64_at(fs_off) };
    send::<{ counter::STACKS_LOST }>(&head, fs)
}

/// The register at `off` of `regs`, or 0 where this architecture has none (`off` 0: the
/// link register on x86_64).
#[inline(always)]
fn reg_or_zero(regs: kread::Regs, off: u32) -> u64 {
    if off == 0 { 0 } else { regs.u64_at(off) }
}

/// The holder of a lock a sampled wait of the current thread begins behind, as
/// [`stack_record::HOLDER`]: thread `h` (a kernel address) of the current thread's own
/// process, its user registers saved at `regs` (a kernel address: the holder is in the
/// kernel, in the syscall or fault that took the lock), its fs base `fs`. Its user stack is
/// read from the address space the two threads share, without faulting: nothing of the
/// holder's critical path is paid, only the waiter's.
#[inline(never)]
pub fn sample_holder(holder: &HolderSample, head: &StackHeader) -> bool {
    let sp_off = konst(&KERNEL.regs_sp);
    if sp_off == 0 || holder.regs == 0 {
        bump(counter::HOLDER_STACKS_LOST);
        return false;
    }
    let mut head = *head;
    head.tag = stack_record::HOLDER;
    head.ip = kread::u64_at(holder.regs + konst(&KERNEL.regs_ip) as u64);
    head.sp = kread::u64_at(holder.regs + sp_off as u64);
    head.bp = kread::u64_at(holder.regs + konst(&KERNEL.regs_bp) as u64);
    let lr_off = konst(&KERNEL.regs_lr);
    head.lr = if lr_off == 0 {
        0
    } else {
        kread::u64_at(holder.regs + lr_off as u64)
    };
    send::<{ counter::HOLDER_STACKS_LOST }>(&head, holder.fsbase)
}

/// What [`sample_holder`] needs of the holder besides the record's header.
#[repr(C)]
pub struct HolderSample {
    /// Its saved user registers (a kernel address; 0: unknown).
    pub regs: u64,
    pub fsbase: u64,
}

/// Sends `head` and the top of the user stack at `head.sp` (of the current address space),
/// as deep as a thread whose fs base is `fs` has one, to STACKS; counted in `LOST` if the
/// ring refuses it. Whether it was sent.
#[inline(always)]
fn send<const LOST: u32>(head: &StackHeader, fs: u64) -> bool {
    let Some(e) = SAMPLE_BUF.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: this CPU's buffer; programs do not migrate while they run, and only this
    // program uses it, which the kernel never runs nested in itself on one CPU.
    let e = unsafe { &mut *e };
    e.head = *head;
    let sp = head.sp;
    // Only as deep as the stack is: a glibc thread's fs base is its `struct pthread`, at the
    // top of its stack, above the outermost frame (the main thread's is elsewhere: it gets
    // the whole copy). Copying 16 KiB of cold memory above a shallow C stack cost some
    // 9 us a sample.
    let depth = if fs > sp && fs - sp < STACK_BYTES as u64 {
        (fs - sp) as usize
    } else {
        STACK_BYTES
    };
    // Chunk by chunk, so that a stack whose mapping ends within STACK_BYTES still yields the
    // part that exists.
    let mut chunks = 0usize;
    for i in 0..STACK_BYTES / STACK_CHUNK {
        let off = i * STACK_CHUNK;
        if off >= depth {
            break;
        }
        let dst = &mut e.stack[off..off + STACK_CHUNK];
        // SAFETY: bpf_probe_read_user fails instead of faulting on unmapped user memory.
        if unsafe { bpf_probe_read_user_buf((sp + off as u64) as *const u8, dst) }.is_err() {
            break;
        }
        chunks = i + 1;
    }
    e.head.stack_len = (chunks * STACK_CHUNK) as u32;
    // From here on the stack's length is read back from the buffer, not kept: the loop's
    // paths (one per length) then join, and what follows, the V8 copies above all, is
    // verified once instead of once per length (6.1's verifier went past its million
    // instructions so).
    let Some(len) = stack_len(e) else {
        bump(LOST);
        return false;
    };
    // The objects of its V8 frames, copied past the stack's room, then moved to follow the
    // stack read (a masked size: the verifier sees it bounded).
    let copies = crate::v8copy::copy_objects(head.tgid, sp, len as u32) as usize;
    let size = (copies & (V8_COPY_SLOTS - 1)) * size_of::<V8Copy>();
    if size > 0 {
        let Some(len) = stack_len(e) else {
            bump(LOST);
            return false;
        };
        if len < STACK_BYTES {
            let base = e.stack.as_mut_ptr();
            // SAFETY: both ranges lie within the buffer's array (`len + size` is at most
            // STACK_BYTES + V8_COPY_SLOTS entries); they may overlap with the destination
            // first, which a forward copy (the helper's) handles.
            let moved = unsafe {
                let dst = core::slice::from_raw_parts_mut(base.add(len), size);
                bpf_probe_read_kernel_buf(base.add(STACK_BYTES), dst)
            };
            if moved.is_err() {
                bump(LOST);
                return false;
            }
        }
    }
    let Some(len) = stack_len(e) else {
        bump(LOST);
        return false;
    };
    // The header, the stack read and the copies, as one record: contiguous in the buffer.
    let n = size_of::<StackHeader>() + len + size;
    let bytes = bytemuck::bytes_of(e);
    let Some(record) = bytes.get(..n) else {
        return false;
    };
    let flags = wakeup_before(n as u64);
    if STACKS.output::<[u8]>(record, flags).is_err() {
        bump(LOST);
        return false;
    }
    true
}

/// The length of the stack copied into the sample buffer, as `send` wrote it there, read
/// back (a fresh load, bounded by the check right before its use).
#[inline(always)]
fn stack_len(e: &StackSample) -> Option<usize> {
    // SAFETY: a field of this CPU's buffer, a valid map value.
    let len = unsafe { ptr::read_volatile(&e.head.stack_len) } as usize;
    (len <= STACK_BYTES).then_some(len)
}

/// A sampled acquisition's outcome (its wait and hold), joined by userspace to the sample
/// sent at its start. One the ring refuses is counted as a lost stack, as a refused sample
/// is: the sample alone can never be folded in.
#[inline(always)]
pub fn done(tid: u32, seq: u32, wait_ns: u64, hold_ns: u64) {
    let d = SampleDone {
        tag: stack_record::DONE,
        tid,
        seq,
        _pad: 0,
        wait_ns,
        hold_ns,
    };
    if STACKS
        .output::<SampleDone>(&d, wakeup_before(size_of::<SampleDone>() as u64))
        .is_err()
    {
        bump(counter::STACKS_LOST);
    }
}

/// Ring buffer flags for a STACKS record of `len` bytes about to be written with `output`: a
/// wakeup of userspace only when this record takes the ring past a quarter of its size, or
/// when userspace asked for one (`STACKS_WAKE`: its copier, idle, waits with no period).
/// Waking for every record cost far more than copying a sample: a wakeup is an interrupt the
/// CPU sends itself, which a virtual machine pays dearly for (several microseconds).
/// Userspace drains the ring every 25 ms while records come; past the quarter it is woken
/// once, not for every record until it catches up (which cost half of `start_locking` at one
/// write in 64 on a write-heavy workload).
#[inline(always)]
pub fn wakeup_before(len: u64) -> u64 {
    if let Some(p) = STACKS_WAKE.get_ptr_mut(0) {
        // SAFETY: an array element, valid for the map's life; racing writers may both see
        // it set and both wake userspace, which costs one spare wakeup.
        unsafe {
            if ptr::read_volatile(p) != 0 {
                ptr::write_volatile(p, 0);
                return BPF_RB_FORCE_WAKEUP as u64;
            }
        }
    }
    // Records are rounded up to 8 bytes, after an 8-byte header.
    let bytes = len.next_multiple_of(8) + 8;
    let after = STACKS.query(BPF_RB_AVAIL_DATA as u64) + bytes;
    let quarter = STACKS.query(BPF_RB_RING_SIZE as u64) / 4;
    if after >= quarter && after < quarter + bytes {
        BPF_RB_FORCE_WAKEUP as u64
    } else {
        BPF_RB_NO_WAKEUP as u64
    }
}
