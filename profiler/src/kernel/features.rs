//! What the running kernel offers the eBPF programs, probed at start instead of inferred from
//! its version: a distribution's kernel may carry a newer BPF than its number says (RHEL 9 is
//! "5.14" with the BPF of 6.12), and a number says nothing of how it was configured. Each
//! feature the programs use is asked of the kernel itself: its BTF for the tracepoints (and
//! their prototype) and the task iterator, a minimal program or map for the rest (aya's
//! probes, as libbpf and bpftool do).
//!
//! The decision ([`decide`]) is a pure function of the probes, unit-tested on the probes of
//! real kernels (`features_tests.rs`, recorded by the kernel matrix of `cargo xtask test`);
//! `mmaplock-prof --probe-kernel` prints them in the same form ([`Features`]' Display).

use std::{fmt, path::Path, sync::OnceLock};

use aya::{
    maps::MapType,
    programs::ProgramType,
    sys::{BpfHelper, is_helper_supported, is_map_supported, is_program_supported},
};
use btf_rs::Type;

use super::btf::{KernelError, TracepointLayout, VMLINUX_BTF, tracepoint_layout};
use super::regs::Arch;

/// One probe's answer. A probe that could not be made (no privilege to load a program, say)
/// is `Unknown`: the kernel is given the benefit, and loading says what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Probe {
    Yes,
    No,
    Unknown(String),
}

impl Probe {
    fn of<E: fmt::Display>(r: Result<bool, E>) -> Probe {
        match r {
            Ok(true) => Probe::Yes,
            Ok(false) => Probe::No,
            Err(e) => Probe::Unknown(e.to_string().replace('\n', " ")),
        }
    }

    fn from_bool(b: bool) -> Probe {
        if b { Probe::Yes } else { Probe::No }
    }

    /// Not known to be missing.
    pub fn usable(&self) -> bool {
        !matches!(self, Probe::No)
    }
}

/// The mmap_lock tracepoints as the kernel's BTF describes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tracepoints {
    Layout(TracepointLayout),
    /// There, with a prototype of this many arguments that no program reads.
    Unrecognised(usize),
    Absent,
}

/// Everything probed, in the order `--probe-kernel` prints it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Features {
    /// `uname -r`: said in messages, never decided on.
    pub release: String,
    pub btf: bool,
    pub mmap_lock_tracepoints: Tracepoints,
    pub raw_tracepoints: Probe,
    pub ring_buffer: Probe,
    /// Task local storage maps, and their helper from a tracepoint program.
    pub task_storage: Probe,
    pub current_task_btf: Probe,
    /// `bpf_task_pt_regs`: a write's cause (the syscall) and its user stack.
    pub task_pt_regs: Probe,
    /// The BPF task iterator (`bpf_iter_task`), which hands idle threads' counts over.
    pub task_iterator: bool,
    /// `bpf_loop`: `--blockers` walks the holders' slots with it.
    pub bpf_loop: Probe,
    /// `lock:contention_begin` / `contention_end` (contention mode).
    pub contention_tracepoints: bool,
    /// Per-VMA locks: most user page faults no longer take mmap_lock (so far fewer reads).
    pub per_vma_locks: bool,
    /// Tracepoint programs run with preemption on (Linux 7.x): the kernel may skip one, and
    /// full mode attaches second copies of its lock programs (`kernel::skipped`).
    pub preemptible_tracepoints: bool,
    /// `PROCMAP_QUERY` (6.11+): a mapping the profiler does not know is looked up alone,
    /// not by reading the whole map again (`procmap_query`).
    pub procmap_query: bool,
    /// Reading a process's memory map takes its lock no more (6.17+: the map is walked
    /// under per-VMA locks, `lock_next_vma`, as are queries): its executable mappings are
    /// then asked for one by one, not formatted whole (`procmaps::Maps::read_executable`).
    pub unlocked_map_reads: bool,
    /// The architecture whose saved user registers and thread pointer the kernel's BTF
    /// describes (`kernel::regs`): write causes, stacks and roles by start routine need one
    /// the profiler knows; elsewhere they are degraded, not refused.
    pub registers: Arch,
}

/// A feature the programs need, named as a user can look it up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Feature {
    Btf,
    MmapLockTracepoints,
    TracepointPrototype,
    RawTracepoints,
    RingBuffer,
    TaskStorage,
    CurrentTaskBtf,
    TaskPtRegs,
    TaskIterator,
    BpfLoop,
}

impl fmt::Display for Feature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Feature::Btf => "BTF at /sys/kernel/btf/vmlinux (CONFIG_DEBUG_INFO_BTF)",
            Feature::MmapLockTracepoints => "the mmap_lock tracepoints (Linux 5.11+)",
            Feature::TracepointPrototype => "a known prototype of the mmap_lock tracepoints",
            Feature::RawTracepoints => "raw tracepoint programs (Linux 4.17+)",
            Feature::RingBuffer => "BPF ring buffers (Linux 5.8+)",
            Feature::TaskStorage => "task local storage from tracepoint programs (Linux 5.13+)",
            Feature::CurrentTaskBtf => "bpf_get_current_task_btf (Linux 5.11+)",
            Feature::TaskPtRegs => "bpf_task_pt_regs (Linux 5.15+)",
            Feature::TaskIterator => "the BPF task iterator (Linux 5.8+)",
            Feature::BpfLoop => "bpf_loop (Linux 5.17+)",
        })
    }
}

/// What a command asks of the kernel beyond what every mode needs.
#[derive(Clone, Copy, Debug, Default)]
pub struct Needs {
    /// Full mode's `--blockers` (contention mode names its holders without `bpf_loop`).
    pub blockers: bool,
    /// `--mode contention`, asked for.
    pub contention: bool,
}

/// Why this kernel cannot run what was asked: one line.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unsupported {
    #[error("this kernel (Linux {release}) lacks what mmaplock-prof needs: {}", list(.missing))]
    Missing {
        release: String,
        missing: Vec<Feature>,
    },
    #[error(
        "--blockers needs {}, which this kernel (Linux {release}) lacks: leave --blockers out",
        Feature::BpfLoop
    )]
    Blockers { release: String },
    #[error(
        "--mode contention needs {CONTENTION} (lock:contention_begin/end, Linux 5.19+), which this kernel (Linux {release}) lacks: use --mode full"
    )]
    Contention { release: String },
}

fn list(missing: &[Feature]) -> String {
    let names: Vec<String> = missing.iter().map(Feature::to_string).collect();
    names.join(", ")
}

/// Whether the kernel whose probes are `f` can run what `needs` asks: every mode needs the
/// first list; an option needs its own feature (refused alone, the rest would run).
pub fn decide(f: &Features, needs: Needs) -> Result<(), Unsupported> {
    let missing = f.missing();
    if !missing.is_empty() {
        return Err(Unsupported::Missing {
            release: f.release.clone(),
            missing,
        });
    }
    if needs.blockers && !f.bpf_loop.usable() {
        return Err(Unsupported::Blockers {
            release: f.release.clone(),
        });
    }
    if needs.contention && !f.contention_tracepoints {
        return Err(Unsupported::Contention {
            release: f.release.clone(),
        });
    }
    Ok(())
}

impl Features {
    /// The features every mode needs that this kernel is known to lack.
    pub fn missing(&self) -> Vec<Feature> {
        let tracepoints = match self.mmap_lock_tracepoints {
            Tracepoints::Layout(_) => None,
            Tracepoints::Unrecognised(_) => Some(Feature::TracepointPrototype),
            Tracepoints::Absent => Some(Feature::MmapLockTracepoints),
        };
        [
            (!self.btf).then_some(Feature::Btf),
            tracepoints.filter(|_| self.btf),
            (!self.raw_tracepoints.usable()).then_some(Feature::RawTracepoints),
            (!self.ring_buffer.usable()).then_some(Feature::RingBuffer),
            (!self.task_storage.usable()).then_some(Feature::TaskStorage),
            (!self.current_task_btf.usable()).then_some(Feature::CurrentTaskBtf),
            (!self.task_pt_regs.usable()).then_some(Feature::TaskPtRegs),
            (!self.task_iterator && self.btf).then_some(Feature::TaskIterator),
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    /// `--blockers` can run here.
    pub fn blockers(&self) -> bool {
        self.bpf_loop.usable()
    }

    /// The running kernel's, probed once.
    pub fn running() -> &'static Features {
        static FEATURES: OnceLock<Features> = OnceLock::new();
        FEATURES.get_or_init(Features::probe)
    }

    /// Asks the running kernel (a few milliseconds: a BTF lookup by name for each
    /// tracepoint, one tiny map or program per feature).
    fn probe() -> Features {
        let btf = super::vmlinux::open().ok();
        let has = |name: &str| {
            btf.as_ref()
                .is_some_and(|b| b.resolve_ids_by_name(name).is_ok_and(|ids| !ids.is_empty()))
        };
        let is_func = |name: &str| {
            btf.as_ref().is_some_and(|b| {
                b.resolve_types_by_name(name)
                    .is_ok_and(|ts| ts.iter().any(|t| matches!(t, Type::Func(_))))
            })
        };
        let mmap_lock_tracepoints = match btf.as_ref().map(tracepoint_layout) {
            Some(Ok(layout))
                if has("btf_trace_mmap_lock_start_locking")
                    && has("btf_trace_mmap_lock_released") =>
            {
                Tracepoints::Layout(layout)
            }
            Some(Err(KernelError::UnknownLayout(n))) => Tracepoints::Unrecognised(n),
            _ => Tracepoints::Absent,
        };
        let raw_tp = ProgramType::RawTracePoint;
        let helper = |h: BpfHelper| Probe::of(is_helper_supported(raw_tp, h));
        let task_storage = match Probe::of(is_map_supported(MapType::TaskStorage)) {
            Probe::Yes => helper(BpfHelper::BPF_FUNC_task_storage_get),
            other => other,
        };
        Features {
            release: running_release().unwrap_or_else(|| "?".into()),
            btf: Path::new(VMLINUX_BTF).exists() && btf.is_some(),
            mmap_lock_tracepoints,
            raw_tracepoints: Probe::of(is_program_supported(raw_tp)),
            ring_buffer: Probe::of(is_map_supported(MapType::RingBuf)),
            task_storage,
            current_task_btf: helper(BpfHelper::BPF_FUNC_get_current_task_btf),
            task_pt_regs: helper(BpfHelper::BPF_FUNC_task_pt_regs),
            task_iterator: is_func("bpf_iter_task"),
            bpf_loop: helper(BpfHelper::BPF_FUNC_loop),
            contention_tracepoints: has("btf_trace_contention_begin")
                && has("btf_trace_contention_end"),
            // Only a kernel built with CONFIG_PER_VMA_LOCK (6.4+) has this function.
            per_vma_locks: is_func("lock_vma_under_rcu"),
            preemptible_tracepoints: btf
                .as_ref()
                .is_some_and(super::btf::preemptible_tracepoints),
            procmap_query: super::procmap_query::supported(),
            unlocked_map_reads: is_func("lock_next_vma"),
            registers: btf.as_ref().map_or(Arch::Other, Arch::of_kernel),
        }
    }

    /// Reads back what [`Features`]' Display printed (`--probe-kernel`, as recorded by the
    /// kernel matrix); None if a line is missing or unreadable.
    #[cfg(test)]
    pub fn parse(text: &str) -> Option<Features> {
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(": "))
                .map(str::trim)
        };
        let probe = |name: &str| -> Option<Probe> {
            let v = field(name)?;
            Some(match v {
                "yes" => Probe::Yes,
                "no" => Probe::No,
                _ => Probe::Unknown(v.strip_prefix("unknown (")?.strip_suffix(')')?.to_string()),
            })
        };
        let flag = |name: &str| -> Option<bool> {
            match probe(name)? {
                Probe::Yes => Some(true),
                Probe::No => Some(false),
                Probe::Unknown(_) => None,
            }
        };
        let tp = field(TRACEPOINTS)?;
        let mmap_lock_tracepoints = if tp == "no" {
            Tracepoints::Absent
        } else if let Some(n) = tp.strip_prefix("unrecognised (") {
            Tracepoints::Unrecognised(n.split(' ').next()?.parse().ok()?)
        } else if tp.starts_with(&format!("yes {}", TracepointLayout::Current)) {
            Tracepoints::Layout(TracepointLayout::Current)
        } else if tp.starts_with(&format!("yes {}", TracepointLayout::WithMemcgPath)) {
            Tracepoints::Layout(TracepointLayout::WithMemcgPath)
        } else {
            return None;
        };
        Some(Features {
            release: field(KERNEL)?.strip_prefix("Linux ")?.to_string(),
            btf: flag(BTF)?,
            mmap_lock_tracepoints,
            raw_tracepoints: probe(RAW_TP)?,
            ring_buffer: probe(RINGBUF)?,
            task_storage: probe(TASK_STORAGE)?,
            current_task_btf: probe(CURRENT_TASK_BTF)?,
            task_pt_regs: probe(TASK_PT_REGS)?,
            task_iterator: flag(TASK_ITER)?,
            bpf_loop: probe(BPF_LOOP)?,
            contention_tracepoints: flag(CONTENTION)?,
            per_vma_locks: flag(PER_VMA)?,
            // Recorded before this probe existed: the kernels that lack it (before 7.x).
            preemptible_tracepoints: flag(PREEMPTIBLE).unwrap_or(false),
            // Recorded before this probe existed: no decision rests on it.
            procmap_query: flag(PROCMAP_QUERY).unwrap_or(false),
            // Recorded before this probe existed: the map reads of the kernels before 6.17.
            unlocked_map_reads: flag(UNLOCKED_MAPS).unwrap_or(false),
            // Recorded before this probe existed: the matrix's kernels were all x86_64.
            registers: match field(REGISTERS) {
                None | Some("x86_64") => Arch::X86_64,
                Some("arm64") => Arch::Aarch64,
                Some(_) => Arch::Other,
            },
        })
    }
}

const KERNEL: &str = "kernel";
const BTF: &str = "btf";
const TRACEPOINTS: &str = "mmap_lock tracepoints";
const RAW_TP: &str = "raw tracepoint programs";
const RINGBUF: &str = "ring buffer";
const TASK_STORAGE: &str = "task storage";
const CURRENT_TASK_BTF: &str = "bpf_get_current_task_btf";
const TASK_PT_REGS: &str = "bpf_task_pt_regs";
const TASK_ITER: &str = "task iterator";
const BPF_LOOP: &str = "bpf_loop (--blockers)";
const CONTENTION: &str = "contention tracepoints";
const PER_VMA: &str = "per-VMA locks (few page faults take mmap_lock)";
const PREEMPTIBLE: &str = "preemptible tracepoint programs (second copies)";
const PROCMAP_QUERY: &str = "PROCMAP_QUERY (a mapping looked up alone)";
const UNLOCKED_MAPS: &str = "memory maps read without mmap_lock";
const REGISTERS: &str = "architecture (causes, stacks, roles by start routine)";

impl fmt::Display for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Probe::Yes => f.write_str("yes"),
            Probe::No => f.write_str("no"),
            Probe::Unknown(why) => write!(f, "unknown ({why})"),
        }
    }
}

/// One `name: value` line per feature, then the verdict; read back by [`Features::parse`].
impl fmt::Display for Features {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let yn = |b: bool| Probe::from_bool(b);
        let tp = match self.mmap_lock_tracepoints {
            Tracepoints::Layout(l) => format!("yes {l}"),
            Tracepoints::Unrecognised(n) => format!("unrecognised ({n} arguments)"),
            Tracepoints::Absent => "no".into(),
        };
        writeln!(f, "{KERNEL}: Linux {}", self.release)?;
        writeln!(f, "{BTF}: {}", yn(self.btf))?;
        writeln!(f, "{TRACEPOINTS}: {tp}")?;
        writeln!(f, "{RAW_TP}: {}", self.raw_tracepoints)?;
        writeln!(f, "{RINGBUF}: {}", self.ring_buffer)?;
        writeln!(f, "{TASK_STORAGE}: {}", self.task_storage)?;
        writeln!(f, "{CURRENT_TASK_BTF}: {}", self.current_task_btf)?;
        writeln!(f, "{TASK_PT_REGS}: {}", self.task_pt_regs)?;
        writeln!(f, "{TASK_ITER}: {}", yn(self.task_iterator))?;
        writeln!(f, "{BPF_LOOP}: {}", self.bpf_loop)?;
        writeln!(f, "{CONTENTION}: {}", yn(self.contention_tracepoints))?;
        writeln!(f, "{PER_VMA}: {}", yn(self.per_vma_locks))?;
        writeln!(f, "{PREEMPTIBLE}: {}", yn(self.preemptible_tracepoints))?;
        writeln!(f, "{PROCMAP_QUERY}: {}", yn(self.procmap_query))?;
        writeln!(f, "{UNLOCKED_MAPS}: {}", yn(self.unlocked_map_reads))?;
        writeln!(f, "{REGISTERS}: {}", self.registers)?;
        match decide(
            self,
            Needs {
                blockers: true,
                contention: false,
            },
        ) {
            Ok(()) => write!(f, "verdict: every mode runs"),
            Err(Unsupported::Blockers { .. }) => {
                write!(f, "verdict: every mode runs but --blockers")
            }
            Err(e) => write!(f, "verdict: {e}"),
        }
    }
}

/// This machine's kernel release (`uname -r`), if it can be read.
pub fn running_release() -> Option<String> {
    // SAFETY: uname fills the zeroed struct; its fields are NUL-terminated strings.
    unsafe {
        let mut u: libc::utsname = std::mem::zeroed();
        if libc::uname(&mut u) != 0 {
            return None;
        }
        let s = std::ffi::CStr::from_ptr(u.release.as_ptr());
        Some(s.to_string_lossy().into_owned())
    }
}

#[cfg(test)]
#[path = "features_tests.rs"]
mod tests;
