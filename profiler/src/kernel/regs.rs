//! What differs between architectures in the kernel structures the programs read: where a
//! task keeps its thread pointer (glibc's `struct pthread` is found from it: thread roles),
//! and where the user registers saved at kernel entry keep the syscall number (write causes)
//! and the registers a stack is unwound from. All of it is read from the running kernel's
//! BTF, which also tells the architecture: x86_64's `pt_regs` has `orig_ax`, arm64's
//! `syscallno`. A kernel with neither (another architecture) gets zeros: no cause but
//! `other`, no stacks, roles by name, as the programs read a zero offset.

use btf_rs::Btf;

use super::btf::{KernelError, member_offset, path_offset};

/// The offsets of [`profiler_common::KernelLayout`] that depend on the architecture (0:
/// absent).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArchLayout {
    pub arch: Arch,
    pub task_fsbase: u32,
    pub regs_syscall: u32,
    pub regs_ip: u32,
    pub regs_sp: u32,
    pub regs_bp: u32,
    pub regs_lr: u32,
}

/// The architecture the kernel's `pt_regs` describes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Arch {
    X86_64,
    Aarch64,
    /// Neither: the offsets above are 0.
    #[default]
    Other,
}

impl Arch {
    /// The architecture a kernel's BTF describes, if the profiler finds both its saved
    /// registers and its thread pointer there (`--probe-kernel`'s line).
    pub fn of_kernel(btf: &Btf) -> Arch {
        match ArchLayout::from_btf(btf) {
            Ok(a) if a.task_fsbase != 0 => a.arch,
            _ => Arch::Other,
        }
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Arch::X86_64 => "x86_64",
            Arch::Aarch64 => "arm64",
            Arch::Other => "unknown (causes other, no stacks, roles by name)",
        })
    }
}

/// arm64 saves the frame pointer and the link register as general registers x29 and x30.
const ARM64_FP: u32 = 29;
const ARM64_LR: u32 = 30;

impl ArchLayout {
    pub fn from_btf(btf: &Btf) -> Result<Self, KernelError> {
        let regs = |m: &str| member_offset(btf, "pt_regs", m);
        if let Some(orig_ax) = regs("orig_ax")? {
            return Ok(ArchLayout {
                arch: Arch::X86_64,
                task_fsbase: path_offset(btf, "task_struct", &["thread", "fsbase"])?.unwrap_or(0),
                regs_syscall: orig_ax,
                regs_ip: regs("ip")?.unwrap_or(0),
                regs_sp: regs("sp")?.unwrap_or(0),
                regs_bp: regs("bp")?.unwrap_or(0),
                regs_lr: 0,
            });
        }
        if let Some(syscallno) = regs("syscallno")? {
            // `regs[31]`, `sp`, `pc` and `pstate` are the members of an anonymous struct in
            // an anonymous union (with `user_regs`); the general registers are u64s.
            let gpr = |n: u32| Ok::<_, KernelError>(regs("regs")?.map_or(0, |r| r + 8 * n));
            return Ok(ArchLayout {
                arch: Arch::Aarch64,
                task_fsbase: path_offset(btf, "task_struct", &["thread", "uw", "tp_value"])?
                    .unwrap_or(0),
                regs_syscall: syscallno,
                regs_ip: regs("pc")?.unwrap_or(0),
                regs_sp: regs("sp")?.unwrap_or(0),
                regs_bp: gpr(ARM64_FP)?,
                regs_lr: gpr(ARM64_LR)?,
            });
        }
        Ok(ArchLayout::default())
    }
}
