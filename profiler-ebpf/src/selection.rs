//! The agent's selection, decided in the kernel when a process begins: at exec (its comm, its
//! executable, its cgroup subtree) and at fork (the child of a selected process, or of a
//! process followed with `--children`), so that a selected process is profiled from its
//! first instruction. (Not from within its exec: the kernel's own writes while it maps the
//! new image come before the exec's tracepoint, the only one there is; an fexit program on
//! `do_open_execat` would see them, but this machine kind refuses fentry/fexit programs.) Userspace writes the selectors (and changes them on SIGHUP), and adds
//! the processes that already run when it starts; every exec of a selected process is
//! announced, so that userspace names it after its new image, never its runtime's init.

use core::{ffi::c_void, ptr};

use aya_ebpf::{
    helpers::generated::bpf_get_current_ancestor_cgroup_id,
    macros::{map, raw_tracepoint},
    maps::{Array, HashMap},
    programs::RawTracePointContext,
};
use profiler_common::{
    CgroupSelector, EXE_COMPONENT_LEN, EXE_COMPONENTS, ExeSelector, MAX_CGROUP_SELECTORS,
    MAX_EXE_SELECTORS, SELECTED_BY_RULE, SelectorCounts, counter,
};

use crate::{
    kread::{self, Comm, Task},
    lifecycle,
    maps::{FILTER, KERNEL, SELECTED, bump, for_each, konst},
    owner,
    state::{THREAD_STATE, VERDICT},
};

/// Command names selected (`--comm`), as two words each.
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
    ctx.matched = 1;
    1
}

/// Is the current task in one of the selected cgroup subtrees?
#[inline(always)]
fn cgroup_matches(counts: &SelectorCounts) -> bool {
    for i in 0..MAX_CGROUP_SELECTORS {
        if i >= counts.cgroups {
            break;
        }
        if let Some(sel) = SEL_CGROUPS.get(i) {
            // SAFETY: no preconditions; 0 when the level is deeper than the task's cgroup.
            let id = unsafe { bpf_get_current_ancestor_cgroup_id(sel.level as i32) };
            if id == sel.id {
                return true;
            }
        }
    }
    false
}

/// Does the executable whose dentry this is match an executable selector?
#[inline(never)]
fn exe_matches(dentry: u64, counts: &SelectorCounts) -> bool {
    if counts.exes == 0 || dentry == 0 {
        return false;
    }
    let mut ctx = ExeCtx { dentry, matched: 0 };
    let c = ptr::from_mut(&mut ctx);
    for_each::<MAX_EXE_SELECTORS>(counts.exes, exe_selector, c.cast());
    // SAFETY: the loop is over; the context is ours again.
    unsafe { ptr::read_volatile(&(*c).matched) != 0 }
}

/// Does the current process (just exec'd) match the selectors?
#[inline(always)]
fn matches(task: Task, counts: &SelectorCounts) -> bool {
    let comm = kread::comm_at(task.addr() + konst(&KERNEL.task_comm) as u64);
    // SAFETY: the value is only tested for presence.
    if counts.comms != 0 && unsafe { SEL_COMMS.get(comm) }.is_some() {
        return true;
    }
    if cgroup_matches(counts) {
        return true;
    }
    let mm = kread::u64_at(task.addr() + konst(&KERNEL.task_mm) as u64);
    let file = if mm == 0 {
        0
    } else {
        kread::u64_at(mm + konst(&KERNEL.mm_exe_file) as u64)
    };
    file != 0
        && exe_matches(
            kread::u64_at(file + konst(&KERNEL.file_dentry) as u64),
            counts,
        )
}

/// A process has exec'd (`current` is its thread group leader now, with its new image and
/// name): selected or deselected by the selectors (the agent), and announced if profiled.
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
        // SAFETY: the value is copied out at once.
        let was = unsafe { SELECTED.get(tgid) }.copied();
        let counts = SEL_COUNTS.get(0).copied().unwrap_or_default();
        if matches(task, &counts) {
            if SELECTED.insert(tgid, ticks | SELECTED_BY_RULE, 0).is_err() {
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
    }
    0
}

/// Whether the child of a parent with this `SELECTED` value is selected too, and with which
/// value (the mark passes on).
#[inline(always)]
pub fn inherited(parent: u64) -> Option<u64> {
    if konst(&FILTER.follow_children) != 0 {
        Some(parent & SELECTED_BY_RULE)
    } else if parent & SELECTED_BY_RULE != 0 {
        Some(SELECTED_BY_RULE)
    } else {
        None
    }
}
