//! The binaries each kernel's guest runs: for x86_64 kernels the host's own build (the
//! suite's `cargo test` built it); for arm64 ones a cross build of the profiler, its
//! ground-truth helpers and the integration tests' executables (`--target
//! aarch64-unknown-linux-gnu`, linked with Debian's cross gcc), which nothing else in the
//! suite builds.

use std::{
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, bail};

use super::Arch;

/// What a guest of `arch` runs: the directory of the profiler and the helpers (`mmaplock-prof`,
/// `speed-factor`...), the integration tests' executables (test file -> path), and a tarball
/// as a host installs the profiler (arm64: this build's binary packed as `cargo xtask dist`
/// packs a release one, or the tarball [`TARBALL_ENV`] names).
#[derive(Clone, Debug)]
pub struct Build {
    pub arch: Arch,
    pub bin_dir: PathBuf,
    pub tests: Vec<(String, PathBuf)>,
    pub tarball: Option<PathBuf>,
}

/// A tarball of `cargo xtask dist` for the arm64 guests to unpack and probe with, in place
/// of this build's packed binary (docs/kernels.md).
pub const TARBALL_ENV: &str = "MMAPLOCK_PROF_MATRIX_TARBALL";

/// The binaries for `arch`'s guests, built if needed (cargo's own fingerprints decide), in
/// the foreground.
pub fn build_for(linker_dir: &Path, arch: Arch) -> Result<Build> {
    let Some(target) = arch.rust_target() else {
        return Ok(Build {
            arch,
            bin_dir: crate::target_dir().join("debug"),
            tests: test_binaries(
                crate::cargo(linker_dir)?
                    // The whole workspace, as the suite's `cargo test` builds it: with `-p`
                    // alone, cargo unifies the dependencies' features for that package only
                    // and builds many of them again (70 s on 2 cores); built so, every unit
                    // is fresh.
                    .args(["test", "--workspace", "--tests", "--no-run"])
                    .stderr(Stdio::inherit()),
            )?,
            tarball: None,
        });
    };
    ensure_cross_toolchain()?;
    cross_build(linker_dir, arch, target, None)
}

/// A cross build of `arch`'s guests' binaries begun beside the host's tests, with only the
/// CPU they leave idle (`SCHED_IDLE`: the host's tests are not slowed), its output in
/// `log`; joined by the kernel matrix. (The x86_64 guests' binaries are the host's own.)
pub fn build_beside(
    linker_dir: &Path,
    arch: Arch,
    log: PathBuf,
) -> Result<std::thread::JoinHandle<Result<Build>>> {
    let target = arch
        .rust_target()
        .with_context(|| format!("{arch:?} is the host's own build"))?;
    // Here, not in the thread: apt installs one package at a time.
    ensure_cross_toolchain()?;
    let linker_dir = linker_dir.to_path_buf();
    Ok(std::thread::spawn(move || {
        cross_build(&linker_dir, arch, target, Some(&log))
    }))
}

/// Where the cross builds are: a target directory of their own, since cargo locks its
/// target directory for the whole of a `cargo test` run, the host's tests' included.
pub fn cross_target_dir() -> PathBuf {
    crate::target_dir().join("matrix-cross")
}

/// `cargo build` of the profiler, the helpers and the integration tests for `target`; in the
/// background (idle CPU only, its output in the log) when `log` is given.
fn cross_build(linker_dir: &Path, arch: Arch, target: &str, log: Option<&Path>) -> Result<Build> {
    let dir = cross_target_dir();
    let mut cmd = crate::cargo(linker_dir)?;
    cmd.env("CARGO_TARGET_DIR", &dir)
        .env(linker_env(target), CROSS_GCC)
        .env(format!("CC_{}", target.replace('-', "_")), CROSS_GCC)
        // One invocation, so that the helpers, the profiler and the tests share one set of
        // dependency features; `--test '*'`: the integration tests, not every unit test.
        .args([
            "build",
            "--target",
            target,
            "-p",
            "profiler",
            "-p",
            "integration-tests",
            "--bins",
            "--test",
            "*",
        ]);
    if let Some(log) = log {
        if let Some(d) = log.parent() {
            std::fs::create_dir_all(d)?;
        }
        cmd.stderr(std::fs::File::create(log)?);
        // SAFETY: only sched_setscheduler, async-signal-safe, between fork and exec; cargo
        // and the compilers it starts inherit the policy.
        unsafe {
            cmd.pre_exec(|| {
                let param = libc::sched_param { sched_priority: 0 };
                if libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    } else {
        cmd.stderr(Stdio::inherit());
    }
    let tests = test_binaries(&mut cmd).with_context(|| match log {
        Some(l) => format!("the arm64 guests' build (its output: {})", l.display()),
        None => "the arm64 guests' build".into(),
    })?;
    let bin_dir = dir.join(target).join("debug");
    let tarball = match std::env::var_os(TARBALL_ENV) {
        Some(t) => PathBuf::from(t),
        None => crate::dist::pack(
            &bin_dir.join("mmaplock-prof"),
            &crate::target_dir().join("dist-test"),
            crate::cross::AARCH64,
        )?,
    };
    Ok(Build {
        arch,
        bin_dir,
        tests,
        tarball: Some(tarball),
    })
}

/// Debian's cross compiler for aarch64 (package `gcc-aarch64-linux-gnu`): the linker, and
/// the C compiler of the crates that build C.
const CROSS_GCC: &str = "aarch64-linux-gnu-gcc";

/// Cargo's variable naming a target's linker.
fn linker_env(target: &str) -> String {
    format!(
        "CARGO_TARGET_{}_LINKER",
        target.to_uppercase().replace('-', "_")
    )
}

/// The cross toolchain (Rust's aarch64 standard library, Debian's cross gcc, binutils and C
/// library, qemu-user for the packed binary's check), installed when missing.
fn ensure_cross_toolchain() -> Result<()> {
    crate::cross::AARCH64.ensure_toolchain()
}

/// Runs a cargo build or `test --no-run` with JSON messages: the integration tests'
/// executables it reports, as (test file, path).
fn test_binaries(cmd: &mut Command) -> Result<Vec<(String, PathBuf)>> {
    let out = cmd.arg("--message-format=json").output()?;
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", out.status);
    }
    Ok(integration_tests(&String::from_utf8_lossy(&out.stdout)))
}

/// The integration tests' executables among cargo's JSON messages.
fn integration_tests(messages: &str) -> Vec<(String, PathBuf)> {
    let mut bins = Vec::new();
    for line in messages.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v["reason"] == "compiler-artifact"
            && v["target"]["kind"][0] == "test"
            && v["package_id"]
                .as_str()
                .is_some_and(|id| id.contains("integration-tests"))
            && let (Some(name), Some(exe)) =
                (v["target"]["name"].as_str(), v["executable"].as_str())
        {
            bins.push((name.to_string(), PathBuf::from(exe)));
        }
    }
    bins
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_linker_variable_is_cargos() {
        assert_eq!(
            linker_env("aarch64-unknown-linux-gnu"),
            "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER"
        );
    }

    #[test]
    fn only_the_integration_tests_executables_are_taken() {
        let msgs = r#"{"reason":"compiler-artifact","package_id":"path+file:///w/tests#integration-tests@0.1.0","target":{"kind":["test"],"name":"profiler"},"executable":"/w/target/aarch64-unknown-linux-gnu/debug/deps/profiler-1"}
{"reason":"compiler-artifact","package_id":"path+file:///w/tests#integration-tests@0.1.0","target":{"kind":["bin"],"name":"mmap-churn"},"executable":"/w/target/debug/mmap-churn"}
{"reason":"compiler-artifact","package_id":"path+file:///w/profiler#mmaplock-prof@0.1.0","target":{"kind":["test"],"name":"x"},"executable":"/x"}
not json
{"reason":"build-finished","success":true}"#;
        assert_eq!(
            integration_tests(msgs),
            [(
                "profiler".to_string(),
                PathBuf::from("/w/target/aarch64-unknown-linux-gnu/debug/deps/profiler-1")
            )]
        );
    }
}
