//! The three mmap_lock tracepoints: wait = start_locking -> acquire_returned, hold =
//! acquire_returned -> released, per thread and lock slot. `acquire_returned` and `released`
//! run while the lock is held, so they take a timestamp, update the slot and, at release, put
//! the completed acquisition in the thread's ring; accumulating it waits for a moment when no
//! lock is held (see `accum`).
//!
//! The verifier needs constant context offsets, and rejects reads past a tracepoint's last
//! argument at attach time, so each tracepoint prototype gets its own programs and userspace
//! loads the ones the kernel's BTF describes.
//!
//! Each program also has a second copy. Where tracepoint callbacks can be preempted (Linux
//! 7.x calls them under SRCU, not with preemption off), the kernel skips a program's run on a
//! CPU where another thread is inside the same program, and the event is gone: a wait never
//! ended, a hold never released (it counts the run in the program's `recursion_misses`).
//! There userspace attaches the second copy after the first; it does the work only when the
//! first did not run for this event ([`this_copy_runs`]), and both are skipped only when two
//! threads are inside them on the same CPU at once. What is still skipped userspace counts
//! in `lost.skipped`.

use core::ptr;

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::raw_tracepoint,
    programs::RawTracePointContext,
};
use profiler_common::{cause, counter};

use crate::{
    accum, blockers, diag,
    kread::{self, Task},
    lifecycle,
    maps::{KERNEL, SETTINGS, blockers_on, bump, konst},
    owner::{self, Owner},
    sampling,
    slots::{complete, done_of, on_acquire},
    state::{FLUSH_AT, SlotState, THREAD_STATE, ThreadState, VERDICT},
};

/// `--writes-only` and this is a read acquisition: nothing to do.
#[inline(always)]
fn skip_read(write: bool) -> bool {
    !write && konst(&SETTINGS.writes_only) != 0
}

/// The thread's state if it has any, else created when `mm`'s lock is profiled. A thread
/// that never takes a profiled lock keeps only its cached verdict (a few bytes).
#[inline(always)]
fn state_of(task: Task, mm: u64) -> Option<&'static mut ThreadState> {
    if let Some(st) = THREAD_STATE.get(task, false) {
        return Some(st);
    }
    let verdict = VERDICT.get(task, true)?;
    if !matches!(
        owner::resolve(verdict, None, mm),
        Owner::Tracked(..) | Owner::Teardown(..)
    ) {
        return None;
    }
    let st = THREAD_STATE.get(task, true)?;
    st.own.set(verdict);
    Some(st)
}

/// PF_EXITING and PF_KTHREAD in `task_struct.flags`.
pub const PF_EXITING: u32 = 0x4;
pub const PF_KTHREAD: u32 = 0x0020_0000;

/// Why the current thread takes the lock for write: its exit, the syscall it is in, or a
/// user page fault (the syscall number saved at kernel entry, see `cause::of_syscall`).
#[inline(always)]
pub fn write_cause(task: Task) -> u32 {
    let flags = task.u32_at(konst(&KERNEL.task_flags));
    if flags & PF_EXITING != 0 {
        return cause::EXIT;
    }
    let syscall = konst(&KERNEL.regs_syscall);
    if flags & PF_KTHREAD != 0 || syscall == 0 {
        return cause::OTHER;
    }
    match task.user_regs() {
        Some(regs) => {
            let nr = crate::arch::syscall_nr(regs, syscall);
            let c = cause::of_syscall(nr);
            if c == cause::OTHER {
                diag::other_syscall(nr);
            }
            c
        }
        None => cause::OTHER,
    }
}

#[inline(always)]
pub fn now() -> u64 {
    // SAFETY: no preconditions.
    unsafe { bpf_ktime_get_ns() }
}

/// A lock tracepoint's two prototypes, one program each and a second copy of each: Linux
/// 6.14+ passes `(mm, write, ..)`, 5.8 to 6.13 `(mm, memcg_path, write, ..)`; `$body` takes
/// the index of `write` and whether it is the second copy.
macro_rules! prototypes {
    ($tp:tt, $name:ident, $memcg:ident, $second:ident, $memcg_second:ident, $body:ident) => {
        #[raw_tracepoint(tracepoint = $tp)]
        pub fn $name(ctx: RawTracePointContext) -> i32 {
            $body::<1, false>(&ctx)
        }

        #[raw_tracepoint(tracepoint = $tp)]
        pub fn $memcg(ctx: RawTracePointContext) -> i32 {
            $body::<2, false>(&ctx)
        }

        #[raw_tracepoint(tracepoint = $tp)]
        pub fn $second(ctx: RawTracePointContext) -> i32 {
            $body::<1, true>(&ctx)
        }

        #[raw_tracepoint(tracepoint = $tp)]
        pub fn $memcg_second(ctx: RawTracePointContext) -> i32 {
            $body::<2, true>(&ctx)
        }
    };
}

prototypes!(
    "mmap_lock_start_locking",
    mmap_lock_start_locking,
    mmap_lock_start_locking_memcg,
    mmap_lock_start_locking_second,
    mmap_lock_start_locking_memcg_second,
    start_locking
);
prototypes!(
    "mmap_lock_acquire_returned",
    mmap_lock_acquire_returned,
    mmap_lock_acquire_returned_memcg,
    mmap_lock_acquire_returned_second,
    mmap_lock_acquire_returned_memcg_second,
    acquire_returned
);

/// Whether this run of a lock program does the work. The first copy always does, and notes
/// that it ran; the second copy (attached only where programs can be preempted, see the
/// module's doc) only when the first did not run for this event, which it counts. (A second
/// copy skipped after a first that ran leaves the note set: if the first is then skipped at
/// the thread's next event, that event is lost, and counted as skipped.)
#[inline(always)]
fn this_copy_runs<const SECOND: bool>(st: &mut ThreadState) -> bool {
    if !SECOND {
        st.first_ran = 1;
        return true;
    }
    if st.first_ran != 0 {
        st.first_ran = 0;
        return false;
    }
    bump(counter::RESCUED);
    true
}

/// A lock tracepoint's start: its `mm`, whether it is a write, and the thread's state; None
/// when there is nothing to do (a read under `--writes-only`, a lock not profiled).
#[inline(always)]
fn enter<const WRITE_ARG: usize, const SECOND: bool>(
    ctx: &RawTracePointContext,
) -> Option<(u64, bool, Task, &'static mut ThreadState)> {
    let mm: u64 = ctx.arg(0);
    // `bool` arguments arrive as u64 slots; only the low byte is defined.
    let write = (ctx.arg::<u64>(WRITE_ARG) & 0xff) != 0;
    if skip_read(write) {
        // (Under --writes-only a downgrade is not seen: its write hold ends at the release.)
        return None;
    }
    let task = Task::current();
    // A trylock has no start_locking before it, so the state may not exist yet.
    let st = state_of(task, mm)?;
    if !this_copy_runs::<SECOND>(st) {
        return None;
    }
    Some((mm, write, task, st))
}

/// Does no one hold `mm`'s lock now (its rwsem's count is 0)? A freed mm may read as anything:
/// only a 0 is trusted.
#[inline(always)]
fn lock_unheld(mm: u64) -> bool {
    let off = konst(&KERNEL.mm_lock_count);
    off != 0 && kread::u64_at(mm + off as u64) == 0
}

/// Whose lock `mm` is, for this thread: the owner, its start time, and whether this is a
/// teardown on another task's reference; None when not counted (a fork child's lock is
/// counted once, when acquired: `at_acquire` counts it then).
#[inline(always)]
pub fn owner_of(st: &mut ThreadState, mm: u64, at_acquire: bool) -> Option<(u32, u64, bool)> {
    match owner::resolve(&mut st.own, Some(&st.slots), mm) {
        Owner::Tracked(o, s) => Some((o, s, false)),
        Owner::Teardown(o, s) => Some((o, s, true)),
        Owner::Ignored => None,
        Owner::ForkChild => {
            if at_acquire {
                bump(counter::FORK_CHILD);
            }
            None
        }
    }
}

/// The kind of an acquisition: a write's cause (a teardown on another task's reference is
/// the owner's exit, whatever that task does), or a read.
#[inline(always)]
pub fn kind_of(task: Task, write: bool, teardown: bool) -> u32 {
    if !write {
        cause::READ
    } else if teardown {
        cause::EXIT
    } else {
        write_cause(task)
    }
}

/// Before a blocking acquire, with no lock of this one held: the place to accumulate what is
/// pending, find a write's cause and sample its stack, none of which then adds to a hold.
#[inline(always)]
fn start_locking<const WRITE_ARG: usize, const SECOND: bool>(
    ctx: &RawTracePointContext,
) -> i32 {
    let Some((mm, write, task, st)) = enter::<WRITE_ARG, SECOND>(ctx) else {
        return 0;
    };
    // A thread waits for one lock at a time: a slot still waiting is stale (its acquire was
    // never seen), and is reused. So is a slot holding this very lock (the thread would wait
    // for itself) or a lock that no one holds now: its release was never seen, a run the
    // kernel skipped (counted in lost.skipped). Kept, such a slot would take its lock's next
    // release as its own (a hold spanning both) and, two of them, lose every later
    // acquisition of the thread as `nested` (the agent's own reader of processes' maps).
    for s in st.slots.iter_mut() {
        if s.state == SlotState::Waiting {
            s.state = SlotState::Free;
            if blockers_on() {
                blockers::end_wait(s, blockers::write_kind(s.kind));
            }
        } else if s.state == SlotState::Held && (s.mm == mm || lock_unheld(s.mm)) {
            s.state = SlotState::Free;
        }
    }
    let free0 = st.slots[0].state == SlotState::Free;
    let free1 = st.slots[1].state == SlotState::Free;
    let Some((owner, owner_start, teardown)) = owner_of(st, mm, false) else {
        return 0;
    };
    // Holding nothing: accumulate what is pending, a batch at a time (inside dup_mmap, the
    // parent's lock is held), and announce a thread at its first lock.
    // SAFETY: a volatile read of a field another CPU holding the claim may write.
    let tail = unsafe { ptr::read_volatile(&st.tail) };
    if free0
        && free1
        && (st.head.wrapping_sub(tail) >= FLUSH_AT || st.charge_pending != 0 || st.announced == 0)
    {
        accum::flush(st, task, true);
        if st.announced == 0 {
            accum::announce_first(st, task, owner, owner_start);
        }
    }
    let idx = if free0 {
        0
    } else if free1 {
        1
    } else {
        bump(counter::NESTED);
        return 0;
    };
    let mut sample_seq = 0;
    let kind = if write {
        let c = kind_of(task, true, teardown);
        // The second copy samples no stack: the sample is assembled in a per-CPU buffer
        // that a first copy preempted on this CPU may be filling. A write it counts that the
        // sampling picks has its stack counted lost, so that the stacks taken and lost stay
        // the writes picked.
        let pid_tgid = bpf_get_current_pid_tgid();
        let (seq, t) = if SECOND {
            if sampling::pick(st, (pid_tgid >> 32) as u32) != 0 {
                bump(counter::STACKS_LOST);
            }
            (0, 0)
        } else {
            let t = sampling::floor_due(
                (pid_tgid >> 32) as u32,
                &mut st.sample_left,
                &mut st.floor_seen_ns,
            );
            (sampling::pick(st, (pid_tgid >> 32) as u32), t)
        };
        if seq != 0
            && sampling::sample(
                task,
                pid_tgid as u32,
                (pid_tgid >> 32) as u32,
                owner,
                owner_start,
                c,
                seq,
                st.sample_every,
            )
        {
            sample_seq = seq;
            sampling::floor_taken((pid_tgid >> 32) as u32, t, &mut st.floor_seen_ns);
            if blockers_on() && owner == (pid_tgid >> 32) as u32 {
                own_writer_stack(task, mm, owner_start, seq, st.sample_every);
            }
        }
        c
    } else {
        cause::READ
    };
    let mut snap = if blockers_on() {
        blockers::begin_wait(st, task, idx, mm, write)
    } else {
        None
    };
    let snapped = snap.is_some();
    let s = &mut st.slots[idx];
    s.mm = mm;
    s.owner = owner;
    s.owner_start = owner_start;
    s.kind = kind;
    s.sample_seq = sample_seq;
    s.snapped = snapped as u16;
    s.acq_ts = 0;
    s.state = SlotState::Waiting;
    let start = now();
    s.start_ts = start;
    if let Some(snap) = snap.as_mut() {
        blockers::wait_starts(snap, start);
    }
    0
}

/// After any acquire, with the lock held when it succeeded: timestamps and flags only.
#[inline(always)]
fn acquire_returned<const WRITE_ARG: usize, const SECOND: bool>(
    ctx: &RawTracePointContext,
) -> i32 {
    let Some((mm, write, task, st)) = enter::<WRITE_ARG, SECOND>(ctx) else {
        return 0;
    };
    let success = (ctx.arg::<u64>(WRITE_ARG + 1) & 0xff) != 0;
    let now = now();
    // One completed record at most, put in the ring at the end (one call site keeps the
    // program small for the verifier).
    if let Some(d) = on_acquire(st, task, mm, write, success, now) {
        complete(st, task, d);
    }
    0
}

#[raw_tracepoint(tracepoint = "mmap_lock_released")]
pub fn mmap_lock_released(ctx: RawTracePointContext) -> i32 {
    released::<false>(&ctx)
}

#[raw_tracepoint(tracepoint = "mmap_lock_released")]
pub fn mmap_lock_released_second(ctx: RawTracePointContext) -> i32 {
    released::<true>(&ctx)
}

/// Before the lock is let go: a timestamp, and the completed acquisition into the ring.
#[inline(always)]
fn released<const SECOND: bool>(ctx: &RawTracePointContext) -> i32 {
    let mm: u64 = ctx.arg(0);
    let task = Task::current();
    let Some(st) = THREAD_STATE.get(task, false) else {
        return 0;
    };
    if !this_copy_runs::<SECOND>(st) {
        return 0;
    }
    // The innermost lock first; nothing held: acquired before we attached, or not profiled.
    let idx = if st.slots[1].state == SlotState::Held && st.slots[1].mm == mm {
        1
    } else if st.slots[0].state == SlotState::Held && st.slots[0].mm == mm {
        0
    } else {
        return 0;
    };
    let now = now();
    if blockers_on() {
        let (kind, acq_ts) = (st.slots[idx].kind, st.slots[idx].acq_ts);
        blockers::add_hold(st, mm, kind, acq_ts, now, task);
    }
    let s = &mut st.slots[idx];
    s.state = SlotState::Free;
    let d = done_of(s, now);
    complete(st, task, d);
    if st.exiting != 0 {
        // The exit path only: this is one of the thread's last locks (exit_mm's, the last
        // thread's exit_mmap), and nothing else would accumulate it.
        lifecycle::final_flush(st, task, false);
    }
    0
}

/// `--blockers`: the stack of the writer of the thread's own process that holds `mm`'s lock
/// (the process's own: its owner is the thread's process) as a sampled write starts waiting
/// for it (as contention mode takes it), charged that write's wait at its release.
#[inline(never)]
fn own_writer_stack(task: Task, mm: u64, owner_start: u64, seq: u16, every: u32) {
    // (Read again rather than passed: a BPF function takes at most five arguments.)
    let pid_tgid = bpf_get_current_pid_tgid();
    let (tid, tgid) = (pid_tgid as u32, (pid_tgid >> 32) as u32);
    let owner = tgid;
    let lock = mm + konst(&KERNEL.mm_lock) as u64;
    let Some(h) = crate::contention::holder::own_writer(lock, task, tid, tgid) else {
        return;
    };
    let head = profiler_common::StackHeader {
        tag: 0,
        owner,
        tid: h.tid,
        tgid,
        kind: h.kind,
        seq: seq as u32,
        ip: 0,
        sp: 0,
        bp: 0,
        owner_start,
        stack_len: 0,
        waiter: tid,
        lr: 0,
        every,
        _pad: 0,
    };
    let holder = sampling::HolderSample {
        regs: h.regs,
        fsbase: h.fsbase,
    };
    sampling::sample_holder(&holder, &head);
}
