//! `cargo xtask`: everything beyond a plain `cargo build`, so that a fresh machine needs no
//! manual step. It installs what building eBPF needs (nightly's rust-src, a bpf-linker built
//! against nightly's own LLVM, cached), then builds, tests, runs the demo or benchmarks.

mod bench;
mod cross;
mod dist;
mod image;
mod layers;
mod ldd;
mod matrix;
mod pace;
mod packages;
mod soak;
mod suite;
mod toolchain;

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    about = "Bootstrap, build, test, demo and bench mmaplock-prof"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what building the eBPF programs needs (rust-src, bpf-linker), if missing.
    Bootstrap,
    /// Build the profiler (and the test helpers).
    Build {
        #[arg(long)]
        release: bool,
        /// Build for another architecture (`aarch64-unknown-linux-gnu`, or `arm64`): the cross
        /// toolchain is installed when missing; binaries in `target/TRIPLE/PROFILE/`.
        #[arg(long, value_parser = cross::Target::parse)]
        target: Option<cross::Target>,
    },
    /// Lint (rustfmt, clippy -D warnings) and run every test, the root-only integration tests
    /// that load the real eBPF programs included.
    Test {
        /// Take one core with a busy loop for the whole run: the suite then gets half of
        /// this machine, as on a slower one (what it must pass on too).
        #[arg(long)]
        slow_host: bool,
        /// Extra arguments for the test binaries, e.g. a test name filter.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run the kernel matrix alone (root): the integration tests' subset inside each named
    /// kernel (6.1, 6.12, newest, 5.10; all when none is named), booted with virtme-ng.
    Matrix {
        /// The kernels, by their names in the matrix.
        kernels: Vec<String>,
    },
    /// Build in release mode and run `mmaplock-prof demo` (as root, through sudo if needed).
    Demo {
        /// Arguments for `mmaplock-prof demo`, e.g. `-k 8`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Measure the profiler's cost side by side with no tracing and with a bpftrace script
    /// (root; installs bpftrace if missing). Writes target/bench/results.{json,md}.
    Bench(bench::BenchArgs),
    /// Run the agent on every node process for a long time under a churning Node workload
    /// (root): its CPU, RSS drift and losses, and the workload's slowdown. Writes
    /// target/bench/soak.{json,md}.
    Soak(soak::SoakArgs),
    /// Build the release binary and pack it with the systemd unit, dashboards, rules, docs and
    /// an install.sh: target/dist/mmaplock-prof-VERSION-ARCH-linux.tar.gz, for x86_64 and
    /// aarch64 (cross-built; the cross toolchain is installed when missing).
    Dist {
        /// Only this architecture (`x86_64`, `aarch64`, or a target triple).
        #[arg(long, value_parser = cross::Target::parse)]
        target: Option<cross::Target>,
    },
    /// Build the dist tarballs, then an OCI image of the agent from each with podman (`FROM
    /// scratch`: the binary and the C library it links, nothing else): mmaplock-prof:VERSION-amd64
    /// and -arm64, and the manifest list mmaplock-prof:VERSION naming both.
    Image {
        /// The image's name (default localhost/mmaplock-prof:VERSION).
        #[arg(long)]
        tag: Option<String>,
        /// Only this architecture's image, named TAG itself (no manifest list).
        #[arg(long, value_parser = cross::Target::parse)]
        target: Option<cross::Target>,
    },
}

/// The workspace root (xtask lives one level below it).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask is inside the workspace")
        .to_path_buf()
}

/// Where cargo builds: `CARGO_TARGET_DIR` if set (relative to the workspace root), else the
/// workspace's `target`.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) => workspace_root().join(d),
        None => workspace_root().join("target"),
    }
}

/// A cargo command in the workspace root with bpf-linker on PATH.
pub fn cargo(linker_dir: &Path) -> Result<Command> {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(workspace_root());
    cmd.env("PATH", path_with(linker_dir)?);
    Ok(cmd)
}

fn path_with(dir: &Path) -> Result<OsString> {
    let mut paths = vec![dir.to_path_buf()];
    if let Some(p) = std::env::var_os("PATH") {
        paths.extend(std::env::split_paths(&p));
    }
    std::env::join_paths(paths).context("PATH")
}

pub fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

pub fn build(linker_dir: &Path, release: bool) -> Result<()> {
    let mut cmd = cargo(linker_dir)?;
    cmd.args(["build", "--workspace", "--bins"]);
    if release {
        cmd.arg("--release");
    }
    run(&mut cmd)
}

fn demo(linker_dir: &Path, args: &[String]) -> Result<()> {
    build(linker_dir, true)?;
    let bin = target_dir().join("release/mmaplock-prof");
    let mut cmd = if is_root() {
        Command::new(&bin)
    } else {
        eprintln!("xtask: the demo loads eBPF programs; running it through sudo");
        let mut c = Command::new("sudo");
        c.arg(&bin);
        c
    };
    cmd.arg("demo");
    // The demo is for people: text, even when our output is piped, unless asked otherwise.
    if !args
        .iter()
        .any(|a| a == "-f" || a.starts_with("--format") || a.starts_with("-f"))
    {
        cmd.args(["--format", "text"]);
    }
    cmd.args(args);
    run(&mut cmd)
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let linker_dir = toolchain::bootstrap()?;
    match cli.cmd {
        Cmd::Bootstrap => {
            println!("bpf-linker: {}", linker_dir.join("bpf-linker").display());
            Ok(())
        }
        Cmd::Build { release, target } => match target {
            Some(t) => cross::build(&linker_dir, t, release),
            None => build(&linker_dir, release),
        },
        Cmd::Test { slow_host, args } => suite::run_suite(&linker_dir, &args, slow_host),
        Cmd::Matrix { kernels } => suite::run_matrix_alone(&linker_dir, &kernels),
        Cmd::Demo { args } => demo(&linker_dir, &args),
        Cmd::Bench(args) => bench::run(&linker_dir, args),
        Cmd::Soak(args) => soak::run(&linker_dir, args),
        Cmd::Dist { target } => dist::dist_all(
            &linker_dir,
            &target.map_or(cross::TARGETS.to_vec(), |t| vec![t]),
        )
        .map(|_| ()),
        Cmd::Image { tag, target } => {
            packages::ensure_podman()?;
            match target {
                Some(t) => {
                    let tarball = dist::dist(&linker_dir, t)?;
                    image::build(&tarball, tag.as_deref(), t).map(|_| ())
                }
                None => {
                    let tarballs = (cross::TARGETS.iter())
                        .map(|t| Ok((*t, dist::dist(&linker_dir, *t)?)))
                        .collect::<Result<Vec<_>>>()?;
                    image::build_multi(&tarballs, tag.as_deref()).map(|_| ())
                }
            }
        }
    }
}
