//! The selection (the agent's, and the one-shot profiler's `--comm`), decided in the kernel
//! per process when a process begins: inside its exec (at the exec's rename, once its new mm
//! is installed and before its image is mapped: its comm, its executable, its cgroup subtree;
//! confirmed or undone when the exec is over), at fork (the child of a selected process, or
//! of a process followed with `--children`), and when it renames itself to a selected name,
//! so that a selected process is profiled from its first instruction, its image's loading
//! included, and in all its threads whatever their names. Userspace writes the selectors
//! (and the agent changes them on SIGHUP), and adds the processes that already run when it
//! starts; every exec of a selected process is announced, so that userspace names it after
//! its new image, never its runtime's init. Each selection says how it was made
//! (`profiler_common::how`) and by which selector, for the report.

use core::{
    ffi::c_void,
    intrinsics::{AtomicOrdering, atomic_xadd},
    ptr,
};

use aya_ebpf::{
    helpers::generated::{bpf_get_current_ancestor_cgroup_id, bpf_probe_read_kernel_str},
    macros::{map, raw_tracepoint},
    maps::{Array, HashMap},
    programs::RawTracePointContext,
};
use profiler_common::{
    CgroupSelector, EXE_COMPONENT_LEN, EXE_COMPONENTS, ExeSelector, MAX_CGROUP_SELECTORS,
    MAX_EXE_SELECTORS, SELECTED_BY_RULE, SelectorCounts, counter, how,
    selected_ticks, selected_value,
};

use crate::{
    kread::{self, Comm, Task},
    lifecycle,
    maps::{FILTER, KERNEL, SELECTED, SELECTION_GEN, bump, for_each, konst},
    owner,
    state::{THREAD_STATE, VERDICT},
};

/// Command names selected (`--comm`), as two words each, with their number + 1.
#[map]
pub static SEL_COMMS: HashMap<Comm, u8> = HashMap::with_max_entries(64, 0);

/// Executable selectors (`--exe`), the first `SEL_COUNTS.exes` in use.
#[map]
pub static SEL_EXES: Array<ExeSelector> = Array::with_max_entries(MAX_EXE_SELECTORS, 0);

/// Cgroup subtree selectors (`--cgroup`), the first `SEL_COUNTS.cgroups` in use.
#[map]
pub static SEL_CGROUPS: Array<CgroupSelector> = Array::with_max_entries(MAX_CGROUP_SELECTORS, 0);

#[map]
pub static SEL_COUNTS: Array<SelectorCounts> = Array::with_max_entries(1, 0);

/// Does dentry `d`'s name equal component `c` of length `len` (< 32 bytes, so the name is
/// the dentry's inline one and 32 bytes of it can be read)?
#[inline(always)]
fn name_is(d: u64, want: &[u64; EXE_COMPONENT_LEN / 8], len: u32) -> bool {
    if kread::u32_at(d + konst(&KERNEL.dentry_name_len) as u64) != len {
        return false;
    }
    let name = kread::u64_at(d + konst(&KERNEL.dentry_name) as u64);
    let mut got = [0u64; EXE_COMPONENT_LEN / 8];
    for (k, w) in got.iter_mut().enumerate() {
        *w = kread::u64_at(name + 8 * k as u64);
    }
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        let first = 8 * k as u32;
        if len <= first {
            break;
        }
        let mask = if len >= first + 8 {
            u64::MAX
        } else {
            (1u64 << (8 * (len - first))) - 1
        };
        if g & mask != w & mask {
            return false;
        }
    }
    true
}

/// What `exe_matches` works on (on its stack).
#[repr(C)]
struct ExeCtx {
    dentry: u64,
    /// The selector that matched, + 1 (0: none).
    matched: u64,
}

/// One executable selector against the process's executable (a `for_each` callback).
extern "C" fn exe_selector(i: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `ctx` is the `ExeCtx` on `exe_matches`'s stack.
    let ctx = unsafe { &mut *ctx.cast::<ExeCtx>() };
    let Some(sel) = SEL_EXES.get(i as u32) else {
        return 1;
    };
    let mut d = ctx.dentry;
    for j in 0..EXE_COMPONENTS {
        if j as u32 >= sel.n {
            break;
        }
        // SAFETY: the component is 32 bytes at an 8-byte aligned offset of an 8-byte aligned
        // map value (asserted in the common crate's layout test), read as words.
        let want = unsafe { &*ptr::from_ref(&sel.comps[j]).cast::<[u64; EXE_COMPONENT_LEN / 8]>() };
        if d == 0 || !name_is(d, want, sel.lens[j]) {
            return 0;
        }
        d = kread::u64_at(d + konst(&KERNEL.dentry_parent) as u64);
    }
    // Anchored: nothing above (a file system's root is its own parent).
    if sel.anchored != 0 && kread::u64_at(d + konst(&KERNEL.dentry_parent) as u64) != d {
        return 0;
    }
    ctx.matched = i + 1;
    1
}

/// The selected cgroup subtree the current task is in: its index + 1 (0: none).
#[inline(always)]
fn cgroup_matches(counts: &SelectorCounts) -> u64 {
    for i in 0..MAX_CGROUP_SELECTORS {
        if i >= counts.cgroups {
            break;
        }
        if let Some(sel) = SEL_CGROUPS.get(i) {
            // SAFETY: no preconditions; 0 when the level is deeper than the task's cgroup.
            let id = unsafe { bpf_get_current_ancestor_cgroup_id(sel.level as i32) };
            if id == sel.id {
                return i as u64 + 1;
            }
        }
    }
    0
}

/// The executable selector the executable whose dentry this is matches: its index + 1 (0:
/// none).
#[inline(never)]
fn exe_matches(dentry: u64, counts: &SelectorCounts) -> u64 {
    if counts.exes == 0 || dentry == 0 {
        return 0;
    }
    let mut ctx = ExeCtx { dentry, matched: 0 };
    let c = ptr::from_mut(&mut ctx);
    for_each::<MAX_EXE_SELECTORS>(counts.exes, exe_selector, c.cast());
    // SAFETY: the loop is over; the context is ours again.
    unsafe { ptr::read_volatile(&(*c).matched) }
}

/// The command name selector `comm` is: its number + 1 (0: none).
#[inline(always)]
fn comm_selector(comm: Comm, counts: &SelectorCounts) -> u64 {
    if counts.comms == 0 {
        return 0;
    }
    // SAFETY: the value is copied out at once.
    unsafe { SEL_COMMS.get(comm) }.map_or(0, |&n| n as u64)
}

/// The selector the current process (exec'ing or just exec'd), named `comm`, matches: its
/// number + 1 in the order of `profiler_common::SELECTED_SELECTOR_SHIFT` (0: none).
#[inline(always)]
fn matches(task: Task, comm: Comm, counts: &SelectorCounts) -> u64 {
    let n = comm_selector(comm, counts);
    if n != 0 {
        return n;
    }
    let n = cgroup_matches(counts);
    if n != 0 {
        return (counts.comms + counts.exes) as u64 + n;
    }
    let mm = kread::u64_at(task.addr() + konst(&KERNEL.task_mm) as u64);
    let file = if mm == 0 {
        0
    } else {
        kread::u64_at(mm + konst(&KERNEL.mm_exe_file) as u64)
    };
    if file == 0 {
        return 0;
    }
    let n = exe_matches(
        kread::u64_at(file + konst(&KERNEL.file_dentry) as u64),
        counts,
    );
    if n == 0 { 0 } else { counts.comms as u64 + n }
}

/// A process has exec'd (`current` is its thread group leader now, with its new image and
/// name): selected or deselected by the selectors, and announced if profiled.
#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn sched_process_exec(_ctx: RawTracePointContext) -> i32 {
    let task = Task::current();
    let tgid = task.u32_at(konst(&KERNEL.task_tgid));
    let per_tick = konst(&FILTER.ns_per_tick) as u64;
    if per_tick == 0 {
        return 0;
    }
    let ticks = owner::process_start(task.addr()) / per_tick;
    let profiled = if konst(&FILTER.use_selection) != 0 {
        // SAFETY: the value is copied out at once. (A value left by an earlier process with
        // this pid is no selection of this one.)
        let was = unsafe { SELECTED.get(tgid) }
            .copied()
            .filter(|&v| selected_ticks(v) == ticks);
        let counts = SEL_COUNTS.get(0).copied().unwrap_or_default();
        let comm = kread::comm_at(task.addr() + konst(&KERNEL.task_comm) as u64);
        let selector = matches(task, comm, &counts);
        if selector != 0 {
            let v = selected_value(ticks, true, how::EXEC, selector);
            if SELECTED.insert(tgid, v, 0).is_err() {
                bump(counter::MAP_FULL);
            }
            true
        } else {
            match was {
                // Selected by the rules before: its new image is not (by pid, it stays).
                Some(v) if v & SELECTED_BY_RULE != 0 => {
                    let _ = SELECTED.remove(tgid);
                    false
                }
                Some(_) => true,
                None => false,
            }
        }
    } else {
        owner::passes_filter(tgid, task.addr())
    };
    // The verdict this thread cached for its new mm was decided while exec was loading it,
    // under the old name and before the selection above: decided again at its next lock.
    if let Some(v) = VERDICT.get(task, false) {
        v.tracked = 0;
    }
    if let Some(st) = THREAD_STATE.get(task, false) {
        st.own.tracked = 0;
    }
    if profiled {
        lifecycle::notify_exec(task, tgid);
        // Its new address space's lock, for other tasks' waits on it (contention mode).
        crate::contention::note_own_lock(task, tgid);
    }
    0
}

/// A process renamed itself to a selected command name (prctl `PR_SET_NAME` from its main
/// thread, a write to `/proc/PID/comm`, Node's `process.title`): selected from now on, in all
/// its threads, marked as selected by the rules, as the agent's scan of /proc would select it
/// (and, as there, a rename away does not deselect it: a selected process stays selected
/// whatever it calls itself); its threads stop trusting the verdict they cached under the old
/// name. Exec renames too, after the new image's mm replaced the old one and before the
/// image is mapped: a process exec'd under a selected name is profiled from there, its
/// loading included (and its exec, which follows, says so).
#[raw_tracepoint(tracepoint = "task_rename")]
pub fn task_rename(ctx: RawTracePointContext) -> i32 {
    let task: u64 = ctx.arg(0);
    let new_name: u64 = ctx.arg(1);
    // A process's name is its main thread's.
    let tgid = kread::u32_at(task + konst(&KERNEL.task_tgid) as u64);
    if tgid == 0 || kread::u32_at(task + konst(&KERNEL.task_pid) as u64) != tgid {
        return 0;
    }
    let mut comm: Comm = [1; 2];
    // Zeroed with two stores (an initializer of zeros becomes a call of memset).
    kread::set_comm(&mut comm, &[0, 0]);
    // SAFETY: reads at most 16 bytes (15 and a NUL) of the new name, a kernel string, into
    // `comm`, zero-filled beyond them as the kernel pads a task's comm.
    let n = unsafe {
        bpf_probe_read_kernel_str(
            ptr::from_mut(&mut comm).cast(),
            size_of::<Comm>() as u32,
            new_name as *const c_void,
        )
    };
    if n <= 0 {
        return 0;
    }
    // Inside exec, the agent's other selectors too: the new executable is the mm's already,
    // and the task (current, the exec'ing thread) is in its cgroup. (After a prctl rename,
    // they match only a process that was selected already, or will be at the next scan.)
    if konst(&FILTER.use_selection) == 0 {
        return 0;
    }
    let counts = SEL_COUNTS.get(0).copied().unwrap_or_default();
    let current = Task::current();
    let selector = if current.addr() == task {
        matches(current, comm, &counts)
    } else {
        comm_selector(comm, &counts)
    };
    if selector == 0 {
        return 0;
    }
    let per_tick = konst(&FILTER.ns_per_tick) as u64;
    if per_tick == 0 {
        return 0;
    }
    let ticks = owner::process_start(task) / per_tick;
    // SAFETY: the value is copied out at once.
    if let Some(&v) = unsafe { SELECTED.get(tgid) }
        && selected_ticks(v) == ticks
    {
        return 0;
    }
    // (A value left by an earlier process with this pid is replaced.)
    let v = selected_value(ticks, true, how::RENAME, selector);
    if SELECTED.insert(tgid, v, 0).is_err() {
        bump(counter::MAP_FULL);
        return 0;
    }
    // Its threads cached "not profiled" for its lock: every thread resolves its lock again.
    if let Some(g) = SELECTION_GEN.get_ptr_mut(1) {
        // SAFETY: an atomic add to the kernel's element of the map; BPF_ADD with fetch.
        unsafe { atomic_xadd::<u32, u32, { AtomicOrdering::SeqCst }>(g, 1) };
    }
    0
}

/// Whether the child of a parent with this `SELECTED` value is selected too, and with which
/// marks (the parent's mark and selector pass on; it came by fork).
#[inline(always)]
pub fn inherited(parent: u64) -> Option<u64> {
    if konst(&FILTER.follow_children) != 0 || parent & SELECTED_BY_RULE != 0 {
        Some(selected_value(0, parent & SELECTED_BY_RULE != 0, how::FORK, 0) | parent & SELECTOR)
    } else {
        None
    }
}

/// A `SELECTED` value's selector bits.
const SELECTOR: u64 = 0xff << profiler_common::SELECTED_SELECTOR_SHIFT;
