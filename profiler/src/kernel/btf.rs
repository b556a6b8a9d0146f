//! What the eBPF programs need to know about the running kernel, read from its BTF
//! (`/sys/kernel/btf/vmlinux`) instead of being compiled in, so that one object works across
//! kernel builds: the mmap_lock tracepoints' argument layout and a few struct offsets.

use std::path::Path;

use btf_rs::{Btf, BtfType, Type};
use profiler_common::KernelLayout;

/// Where the running kernel describes its own types.
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error(
        "this kernel has no BTF at {VMLINUX_BTF} (needs CONFIG_DEBUG_INFO_BTF=y, Linux 5.11 or newer)"
    )]
    NoBtf,
    #[error("cannot read the kernel's BTF at {VMLINUX_BTF}: {0}")]
    BadBtf(String),
    #[error(
        "this kernel has no mmap_lock tracepoints (needs Linux 5.8 or newer built with CONFIG_TRACING)"
    )]
    NoTracepoints,
    #[error(
        "this kernel has no lock contention tracepoints (lock:contention_begin/end, Linux 5.19+): --mode contention cannot run here; use --mode full"
    )]
    NoContentionTracepoints,
    #[error("unrecognised prototype of tracepoint mmap_lock_acquire_returned ({0} arguments)")]
    UnknownLayout(usize),
    #[error("the kernel's BTF has no {0}")]
    MissingMember(String),
}

/// The two prototypes the mmap_lock tracepoints have had.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TracepointLayout {
    /// Linux 6.14+: `(mm, write[, success])`.
    Current,
    /// Linux 5.8 to 6.13: `(mm, memcg_path, write[, success])`.
    WithMemcgPath,
}

impl TracepointLayout {
    /// The eBPF program for `mmap_lock_start_locking` that reads this prototype.
    pub fn start_program(self) -> &'static str {
        match self {
            TracepointLayout::Current => "mmap_lock_start_locking",
            TracepointLayout::WithMemcgPath => "mmap_lock_start_locking_memcg",
        }
    }

    /// The eBPF program for `mmap_lock_acquire_returned` that reads this prototype.
    pub fn acquire_program(self) -> &'static str {
        match self {
            TracepointLayout::Current => "mmap_lock_acquire_returned",
            TracepointLayout::WithMemcgPath => "mmap_lock_acquire_returned_memcg",
        }
    }

    /// Classifies by the number of arguments of `acquire_returned`, whose BTF prototype also
    /// counts the leading `void *` context of a raw tracepoint.
    fn from_acquire_returned_params(n: usize) -> Result<Self, KernelError> {
        match n {
            4 => Ok(TracepointLayout::Current),
            5 => Ok(TracepointLayout::WithMemcgPath),
            n => Err(KernelError::UnknownLayout(n.saturating_sub(1))),
        }
    }
}

impl std::fmt::Display for TracepointLayout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TracepointLayout::Current => "(mm, write, success) [Linux 6.14+]",
            TracepointLayout::WithMemcgPath => "(mm, memcg_path, write, success) [Linux 5.8-6.13]",
        })
    }
}

/// The layout found, and the globals it turns into.
#[derive(Clone, Copy, Debug)]
pub struct KernelInfo {
    pub tracepoints: TracepointLayout,
    pub layout: KernelLayout,
    /// The BTF id of `bpf_iter_task` (the task iterator's target), which loading the flush
    /// iterator needs; 0 when the kernel has no task iterator.
    pub iter_task_btf_id: u32,
    /// The lock contention tracepoints (`lock:contention_begin/end`, Linux 5.19+), which
    /// contention mode attaches to.
    pub contention_tracepoints: bool,
    /// Tracepoint programs can be preempted (see [`preemptible_tracepoints`]): the lock
    /// programs' second copies are attached.
    pub preemptible_tracepoints: bool,
}

impl KernelInfo {
    /// Reads the running kernel's BTF.
    pub fn detect() -> Result<Self, KernelError> {
        let path = Path::new(VMLINUX_BTF);
        if !path.exists() {
            return Err(KernelError::NoBtf);
        }
        // Mapped: parse only the few types we look up (kernel/vmlinux.rs).
        let btf = super::vmlinux::open().map_err(|e| KernelError::BadBtf(e.to_string()))?;
        Self::from_btf(&btf)
    }

    pub fn from_btf(btf: &Btf) -> Result<Self, KernelError> {
        let tracepoints = tracepoint_layout(btf)?;
        let off = |s: &str, m: &str| -> Result<u32, KernelError> {
            member_offset(btf, s, m)?.ok_or_else(|| KernelError::MissingMember(format!("{s}.{m}")))
        };
        let arch = super::regs::ArchLayout::from_btf(btf)?;
        let layout = KernelLayout {
            task_mm: off("task_struct", "mm")?,
            task_tgid: off("task_struct", "tgid")?,
            task_group_leader: off("task_struct", "group_leader")?,
            task_comm: off("task_struct", "comm")?,
            // Only with CONFIG_MEMCG; without it foreign takers are charged to owner 0.
            mm_owner: member_offset(btf, "mm_struct", "owner")?.unwrap_or(0),
            task_flags: off("task_struct", "flags")?,
            // Per architecture (kernel/regs.rs); 0 where the kernel is neither x86_64 nor
            // arm64: thread roles then fall back to names, causes are `other`, no stacks.
            task_fsbase: arch.task_fsbase,
            regs_syscall: arch.regs_syscall,
            regs_ip: arch.regs_ip,
            regs_sp: arch.regs_sp,
            regs_bp: arch.regs_bp,
            task_start_boottime: off("task_struct", "start_boottime")?,
            task_pid: off("task_struct", "pid")?,
            // The rwsem's count word; 0 (never a real offset: mmap_lock is not mm_struct's
            // first member) makes every blocking acquisition take its blockers snapshot.
            mm_lock_count: nested_offset(
                btf,
                ("mm_struct", "mmap_lock"),
                ("rw_semaphore", "count"),
            )?
            .unwrap_or(0),
            task_cpu_ns: nested_offset(
                btf,
                ("task_struct", "se"),
                ("sched_entity", "sum_exec_runtime"),
            )?
            .ok_or_else(|| KernelError::MissingMember("task_struct.se.sum_exec_runtime".into()))?,
            // The helper's implementation is a kernel function of that name (5.17+).
            has_bpf_loop: func_id(btf, "bpf_loop").is_some() as u32,
            mm_exe_file: off("mm_struct", "exe_file")?,
            file_dentry: off("file", "f_path")? + off("path", "dentry")?,
            // struct qstr { union { struct { u32 hash; u32 len; }; u64 hash_len; }; name }
            dentry_name_len: off("dentry", "d_name")? + off("qstr", "len")?,
            dentry_name: off("dentry", "d_name")? + off("qstr", "name")?,
            dentry_parent: off("dentry", "d_parent")?,
            // x86_64 only (`mm_context_t` is a typedef of an anonymous struct there). arm64's
            // `context.id` is an ASID and its generation, given again at each rollover: not an
            // id that is never reused, so not taken (0, as on a kernel without one).
            mm_ctx_id: nested_offset(btf, ("mm_struct", "context"), ("mm_context_t", "ctx_id"))?
                .unwrap_or(0),
            mm_lock: off("mm_struct", "mmap_lock")?,
            // Absent under PREEMPT_RT (its rwsem is another type): holders are then unknown.
            rwsem_owner: member_offset(btf, "rw_semaphore", "owner")?.unwrap_or(0),
            task_stack: off("task_struct", "stack")?,
            regs_lr: arch.regs_lr,
            // CONFIG_SCHED_INFO (schedstats, delay accounting): absent, the run-queue delay
            // is unknown and the findings say so.
            task_run_delay: nested_offset(
                btf,
                ("task_struct", "sched_info"),
                ("sched_info", "run_delay"),
            )?
            .unwrap_or(0),
        };
        Ok(KernelInfo {
            tracepoints,
            layout,
            iter_task_btf_id: func_id(btf, "bpf_iter_task").unwrap_or(0),
            contention_tracepoints: has_tracepoint(btf, "contention_begin")
                && has_tracepoint(btf, "contention_end"),
            preemptible_tracepoints: preemptible_tracepoints(btf),
        })
    }
}

/// Does the kernel call tracepoint callbacks, and so our programs, with preemption on?
/// Linux 7.x protects them with SRCU-fast (`tracepoint_srcu`) instead of disabling
/// preemption, and waits for that domain's grace period when callbacks change: its BTF has
/// the domain's per-CPU data (a variable) and `tp_transition_snapshot.srcu_gp`. The
/// variable alone is not enough: kernels up to 6.12 have a `tracepoint_srcu` for their
/// rcuidle tracepoints only (the snapshot's member is then `srcu`), and run every callback
/// with preemption off.
pub fn preemptible_tracepoints(btf: &Btf) -> bool {
    let domain = btf
        .resolve_types_by_name("tracepoint_srcu_srcu_data")
        .is_ok_and(|t| t.iter().any(|t| matches!(t, Type::Var(_))));
    domain
        && matches!(
            member_offset(btf, "tp_transition_snapshot", "srcu_gp"),
            Ok(Some(_))
        )
}

/// The BTF id of the kernel function `name`, if it has one.
fn func_id(btf: &Btf, name: &str) -> Option<u32> {
    let ids = btf.resolve_ids_by_name(name).ok()?;
    ids.into_iter()
        .find(|&id| matches!(btf.resolve_type_by_id(id), Ok(Type::Func(_))))
}

/// Does the kernel have raw tracepoint `name` (its `btf_trace_<name>` typedef)?
fn has_tracepoint(btf: &Btf, name: &str) -> bool {
    btf.resolve_types_by_name(&format!("btf_trace_{name}"))
        .is_ok_and(|t| t.iter().any(|t| matches!(t, Type::Typedef(_))))
}

fn bad(e: btf_rs::Error) -> KernelError {
    KernelError::BadBtf(e.to_string())
}

pub(super) fn tracepoint_layout(btf: &Btf) -> Result<TracepointLayout, KernelError> {
    // Every tracepoint has a `btf_trace_<name>` typedef: a pointer to its raw prototype.
    let types = btf
        .resolve_types_by_name("btf_trace_mmap_lock_acquire_returned")
        .map_err(|_| KernelError::NoTracepoints)?;
    let Some(Type::Typedef(td)) = types.into_iter().next() else {
        return Err(KernelError::NoTracepoints);
    };
    let mut t = btf.resolve_chained_type(&td).map_err(bad)?;
    loop {
        match t {
            Type::Ptr(p) => t = btf.resolve_chained_type(&p).map_err(bad)?,
            Type::FuncProto(fp) => {
                return TracepointLayout::from_acquire_returned_params(fp.parameters.len());
            }
            other => return Err(KernelError::BadBtf(format!("unexpected {}", other.name()))),
        }
    }
}

/// Byte offset of `member` in `struct name`, looking through anonymous structs and unions.
/// The offset of a member of a member: `outer.0.outer.1` is of type `inner.0`, whose member
/// `inner.1` is wanted (`task_struct.se.sum_exec_runtime`). None if either is missing.
fn nested_offset(
    btf: &Btf,
    outer: (&str, &str),
    inner: (&str, &str),
) -> Result<Option<u32>, KernelError> {
    Ok(
        match (
            member_offset(btf, outer.0, outer.1)?,
            member_offset(btf, inner.0, inner.1)?,
        ) {
            (Some(o), Some(i)) => Some(o + i),
            _ => None,
        },
    )
}

pub(super) fn member_offset(
    btf: &Btf,
    name: &str,
    member: &str,
) -> Result<Option<u32>, KernelError> {
    let types = btf
        .resolve_types_by_name(name)
        .map_err(|_| KernelError::MissingMember(format!("struct {name}")))?;
    for mut t in types {
        // A typedef of a struct (`mm_context_t`) is looked through.
        while let Type::Typedef(td) = t {
            t = btf.resolve_chained_type(&td).map_err(bad)?;
        }
        if let Type::Struct(s) = t
            && let Some(bits) = find_member(btf, &s, member)?
        {
            return Ok(Some(bits / 8));
        }
    }
    Ok(None)
}

/// Byte offset of a member path in `struct name` (`task_struct`, `["thread", "uw",
/// "tp_value"]`), each step in the type of the one before (through typedefs, anonymous
/// structs and unions); None if a step is missing or not a struct or union.
pub(super) fn path_offset(
    btf: &Btf,
    name: &str,
    path: &[&str],
) -> Result<Option<u32>, KernelError> {
    let types = btf
        .resolve_types_by_name(name)
        .map_err(|_| KernelError::MissingMember(format!("struct {name}")))?;
    'candidates: for t in types {
        let mut t = t;
        let mut bits = 0;
        for (i, step) in path.iter().enumerate() {
            while let Type::Typedef(td) = t {
                t = btf.resolve_chained_type(&td).map_err(bad)?;
            }
            let (Type::Struct(s) | Type::Union(s)) = t else {
                continue 'candidates;
            };
            let Some((off, member)) = find_member_typed(btf, &s, step)? else {
                continue 'candidates;
            };
            bits += off;
            if i + 1 == path.len() {
                return Ok(Some(bits / 8));
            }
            t = member;
        }
    }
    Ok(None)
}

/// [`find_member`], with the member's type.
fn find_member_typed(
    btf: &Btf,
    s: &btf_rs::Struct,
    want: &str,
) -> Result<Option<(u32, Type)>, KernelError> {
    for m in &s.members {
        let name = btf.resolve_name(m).unwrap_or_default();
        if name == want {
            return Ok(Some((
                m.bit_offset(),
                btf.resolve_chained_type(m).map_err(bad)?,
            )));
        }
        if name.is_empty() && m.get_type_id().is_some() {
            let inner = btf.resolve_chained_type(m).map_err(bad)?;
            if let Type::Struct(inner) | Type::Union(inner) = inner
                && let Some((off, t)) = find_member_typed(btf, &inner, want)?
            {
                return Ok(Some((m.bit_offset() + off, t)));
            }
        }
    }
    Ok(None)
}

fn find_member(btf: &Btf, s: &btf_rs::Struct, want: &str) -> Result<Option<u32>, KernelError> {
    for m in &s.members {
        let name = btf.resolve_name(m).unwrap_or_default();
        if name == want {
            return Ok(Some(m.bit_offset()));
        }
        if name.is_empty() && m.get_type_id().is_some() {
            let inner = btf.resolve_chained_type(m).map_err(bad)?;
            if let Type::Struct(inner) | Type::Union(inner) = inner
                && let Some(off) = find_member(btf, &inner, want)?
            {
                return Ok(Some(m.bit_offset() + off));
            }
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_from_prototype_arity() {
        assert_eq!(
            TracepointLayout::from_acquire_returned_params(4).unwrap(),
            TracepointLayout::Current
        );
        assert_eq!(
            TracepointLayout::from_acquire_returned_params(5).unwrap(),
            TracepointLayout::WithMemcgPath
        );
        assert!(TracepointLayout::from_acquire_returned_params(3).is_err());
        assert_eq!(
            TracepointLayout::WithMemcgPath.acquire_program(),
            "mmap_lock_acquire_returned_memcg"
        );
    }

    /// Against the running kernel, where it has BTF (every supported kernel does).
    #[test]
    fn running_kernel_offsets_are_plausible() {
        if !Path::new(VMLINUX_BTF).exists() {
            profiler_common::skip::skip_because(&format!("no {VMLINUX_BTF} on this kernel"));
            return;
        }
        let info = KernelInfo::detect().expect("detect");
        let l = info.layout;
        // task_struct is several KiB; these members are all well inside it and distinct.
        for off in [
            l.task_mm,
            l.task_tgid,
            l.task_group_leader,
            l.task_comm,
            l.task_flags,
            l.task_fsbase,
        ] {
            assert!(off < 16384, "{l:?}");
        }
        for off in [l.task_mm, l.task_tgid, l.task_group_leader, l.task_comm] {
            assert!(off > 0, "{l:?}");
        }
        // The running kernel's architecture, as its BTF tells it (under qemu-user, an arm64
        // build of these tests reads an x86_64 kernel's).
        let btf = super::super::vmlinux::open().unwrap();
        let arch = super::super::regs::ArchLayout::from_btf(&btf).unwrap().arch;
        assert_ne!(arch, super::super::regs::Arch::Other);
        if arch == super::super::regs::Arch::X86_64 {
            // pt_regs is fixed by the x86_64 ABI: orig_ax is its 16th u64.
            assert_eq!(l.regs_syscall, 15 * 8);
            assert_eq!((l.regs_ip, l.regs_sp, l.regs_bp), (16 * 8, 19 * 8, 4 * 8));
            assert_eq!(l.regs_lr, 0);
            assert!(l.task_fsbase > 0 && l.task_fsbase.is_multiple_of(8));
            // mm_struct.context (an mm_context_t typedef) and its first u64.
            assert!(l.mm_ctx_id > 0 && l.mm_ctx_id.is_multiple_of(8), "{l:?}");
        }
        if arch == super::super::regs::Arch::Aarch64 {
            // pt_regs is fixed by the arm64 ABI: regs[31], sp, pc, pstate, orig_x0, then
            // syscallno (an s32).
            assert_eq!(l.regs_syscall, 35 * 8, "{l:?}");
            assert_eq!((l.regs_ip, l.regs_sp), (32 * 8, 31 * 8), "{l:?}");
            assert_eq!((l.regs_bp, l.regs_lr), (29 * 8, 30 * 8), "{l:?}");
            assert!(l.task_fsbase > 0 && l.task_fsbase.is_multiple_of(8));
            assert_eq!(l.mm_ctx_id, 0, "{l:?}");
        }
        assert_eq!(l.task_mm % 8, 0);
        assert_eq!(l.task_group_leader % 8, 0);
        // mm_struct starts with its maple tree; the rwsem and its count word come later.
        assert!(
            l.mm_lock_count > 0 && l.mm_lock_count.is_multiple_of(8),
            "{l:?}"
        );
        assert!(
            l.task_cpu_ns > 0 && l.task_cpu_ns.is_multiple_of(8),
            "{l:?}"
        );
        // This machine kind runs Linux 6.x: bpf_loop and the task iterator are there.
        assert_eq!(l.has_bpf_loop, 1);
        assert!(info.iter_task_btf_id > 0);
        // mmap_lock follows mm_struct's maple tree; the rwsem's owner follows its count.
        assert!(l.mm_lock > 0 && l.mm_lock.is_multiple_of(8), "{l:?}");
        assert_eq!(l.rwsem_owner, 8, "{l:?}");
        assert!(l.task_stack > 0 && l.task_stack.is_multiple_of(8), "{l:?}");
        assert!(
            l.task_run_delay > 0 && l.task_run_delay.is_multiple_of(8),
            "{l:?}"
        );
    }
}
