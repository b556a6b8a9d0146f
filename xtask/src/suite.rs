//! `cargo xtask test`: the whole suite (layers, fmt, clippy on both targets, every test), and
//! its closing line, in which a BPF test that could not run counts as skipped, never as passed
//! (and fails the run under CI).

use std::{path::Path, process::Command};

use anyhow::{Result, bail};

use crate::{
    build, cargo, cross, dist, image, is_root, layers, matrix, pace, packages, path_with, run,
    workspace_root,
};

/// Runs the suite in its order (cheapest check first), then prints its closing line.
pub fn run_suite(linker_dir: &Path, args: &[String], slow_host: bool) -> Result<()> {
    let started = std::time::Instant::now();
    // Taken first: the whole run, the speed factor's measure included, gets half the machine.
    let _hog = slow_host.then(pace::CoreHog::start);
    // Imports against the layers of docs/architecture.md: no build needed, so first.
    layers::check(&workspace_root().join("profiler/src"))?;
    run(cargo(linker_dir)?.args(["fmt", "--all", "--check"]))?;
    run(cargo(linker_dir)?.args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    ebpf_clippy(linker_dir)?;
    // The integration tests run the built binaries (profiler and helpers), and the agent's
    // tests a real Prometheus.
    build(linker_dir, false)?;
    // Measured once, printed, and handed to every test (and to the matrix's guests' limits).
    let factor = pace::measure(&workspace_root().join("target"))?;
    println!("speed factor: {factor:.2} (this host; 1 is the reference machine)");
    // SAFETY: set before any thread of ours reads the environment (the hog reads none).
    unsafe { std::env::set_var(pace::SPEED_ENV, format!("{factor:.2}")) };
    // The arm64 guests' binaries, cross-built beside the host's tests on the CPU they leave
    // idle (not when the run is narrowed: the matrix does not run).
    let arm64_build = if args.is_empty() {
        Some(matrix::build_beside(
            linker_dir,
            matrix::Arch::Arm64,
            workspace_root().join("target/matrix/arm64-build.log"),
        )?)
    } else {
        None
    };
    packages::ensure_prometheus()?;
    packages::ensure_bpftrace()?;
    packages::ensure_tracefs()?;
    packages::ensure_chromium()?;
    packages::ensure_go()?;
    packages::ensure_push_servers()?;
    packages::ensure_jemalloc()?;
    packages::ensure_libc_debug()?;
    packages::ensure_nodes()?;
    packages::ensure_podman()?;
    packages::ensure_k8s_validator()?;
    packages::ensure_sharp()?;
    packages::ensure_vitest()?;
    // The project's own image, as `cargo xtask image` makes it, from this (debug) build: for
    // the test that runs it (tests/tests/image.rs).
    let test_image = test_image()?;
    if !is_root() {
        eprintln!(
            "xtask: the integration tests load eBPF programs and need root: run `sudo -E cargo xtask test`"
        );
    }
    // One test at a time: the integration tests measure lock waits, which concurrent tests
    // would distort, and every test filters events to its own processes.
    let skip_file = workspace_root()
        .join("target")
        .join(format!("xtask-test-skips-{}.txt", std::process::id()));
    let _ = std::fs::remove_file(&skip_file);
    let mut cmd = cargo(linker_dir)?;
    // Every test binary runs even when one fails: a run then tells all that is wrong.
    cmd.args([
        "test",
        "--workspace",
        "--no-fail-fast",
        "--",
        "--test-threads=1",
    ]);
    cmd.args(args);
    cmd.env(SKIP_FILE_ENV, &skip_file);
    if let Some(tag) = &test_image {
        cmd.env(TEST_IMAGE_ENV, tag);
    }
    let (mut tally, status) = run_counting_tests(&mut cmd, pace::hang_limit(factor))?;
    // What is architecture-specific in userspace, built for arm64 and run under qemu-user
    // (the arm64 guests of the kernel matrix run the rest, eBPF included).
    let mut arm = cross::qemu_unit_tests(linker_dir, cross::AARCH64, 26)?;
    arm.env(SKIP_FILE_ENV, &skip_file);
    println!(
        "arm64 unit tests under qemu-user: {}",
        cross::QEMU_UNIT_TESTS.join(" ")
    );
    let (arm_tally, arm_status) = run_counting_tests(&mut arm, pace::hang_limit(factor))?;
    tally.add(&arm_tally);
    let mut skips = parse_skips(&std::fs::read_to_string(&skip_file).unwrap_or_default());
    let _ = std::fs::remove_file(&skip_file);
    tally.apply_skips(&skips);
    // The kernel matrix, after the host's tests (its guests run the binaries they built);
    // not when the run was narrowed to some tests.
    if let Some(arm64_build) = arm64_build {
        let runs = kernel_matrix(linker_dir, &[], Some(arm64_build))?;
        tally.add_matrix(&runs, &mut skips);
    } else {
        println!("kernel matrix: not run (the run was narrowed to {args:?})");
    }
    for s in &skips {
        println!("skipped: {} ({})", s.test, s.reason);
    }
    println!(
        "suite: {:.0} s{}",
        started.elapsed().as_secs_f64(),
        if slow_host { " (--slow-host)" } else { "" }
    );
    // One closing line for the whole suite (cargo prints one per test binary).
    println!("{}", tally.closing_line());
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    if !arm_status.success() {
        bail!("{arm:?} failed: {arm_status}");
    }
    if tally.failed > 0 {
        bail!("{} kernel matrix test(s) failed", tally.failed);
    }
    ci_verdict(under_ci(), &skips)
}

/// `cargo xtask matrix [KERNEL...]`: the kernel matrix alone, on this build's test binaries,
/// with a closing line of its own.
pub fn run_matrix_alone(linker_dir: &Path, kernels: &[String]) -> Result<()> {
    // The x86_64 guests run the host's own build, and what their tests run comes from the
    // host's caches (they have no network); the arm64 guests' binaries and root file system
    // are the matrix's own.
    if matrix::select(kernels)?
        .iter()
        .any(|k| k.arch == matrix::Arch::X86_64)
    {
        build(linker_dir, false)?;
        packages::ensure_nodes()?;
        packages::ensure_bpftrace()?;
    }
    let mut tally = Tally::default();
    let mut skips = Vec::new();
    let runs = kernel_matrix(linker_dir, kernels, None)?;
    tally.add_matrix(&runs, &mut skips);
    println!("{}", tally.closing_line());
    if tally.failed > 0 {
        bail!("{} kernel matrix test(s) failed", tally.failed);
    }
    ci_verdict(under_ci(), &skips)
}

/// Runs the kernel matrix (root only: its guests load BPF) and prints each kernel's block;
/// `arm64_build`: the arm64 guests' binaries, when their build was begun before.
fn kernel_matrix(
    linker_dir: &Path,
    names: &[String],
    arm64_build: Option<std::thread::JoinHandle<Result<matrix::Build>>>,
) -> Result<Vec<matrix::KernelRun>> {
    let kernels = matrix::select(names)?;
    if !is_root() {
        let why = "not root (its guests load eBPF programs)".to_string();
        return Ok(kernels
            .iter()
            .map(|k| matrix::KernelRun::skipped(k, matrix::tests_of(k), why.clone()))
            .collect());
    }
    let mut arches: Vec<matrix::Arch> = kernels.iter().map(|k| k.arch).collect();
    arches.sort();
    arches.dedup();
    let started = std::time::Instant::now();
    let mut begun = arm64_build.map(|b| (matrix::Arch::Arm64, b));
    let builds = arches
        .into_iter()
        .map(|a| match begun.take_if(|(b, _)| *b == a) {
            Some((_, b)) => b.join().expect("the arm64 build's thread panicked"),
            None => matrix::build_for(linker_dir, a),
        })
        .collect::<Result<Vec<_>>>()?;
    let built = started.elapsed();
    let runs = matrix::run(&kernels, &builds)?;
    for r in &runs {
        print!("{}", r.render());
    }
    let each: Vec<String> = runs
        .iter()
        .map(|r| format!("{} {:.0} s", r.kernel.name, r.wall.as_secs_f64()))
        .collect();
    println!(
        "kernel matrix: {:.0} s ({:.0} s building its binaries; {})",
        started.elapsed().as_secs_f64(),
        built.as_secs_f64(),
        each.join(", ")
    );
    Ok(runs)
}

/// The variable naming the project's image for the tests (built from the debug binary).
const TEST_IMAGE_ENV: &str = "MMAPLOCK_PROF_TEST_IMAGE";

/// The image of this build's (debug) binary, packed as `cargo xtask dist` packs a release one;
/// None where podman cannot be had (not root: the test then says so).
fn test_image() -> Result<Option<String>> {
    if !is_root() || !Path::new("/usr/bin/podman").exists() {
        return Ok(None);
    }
    let root = workspace_root();
    let tarball = dist::pack(
        &root.join("target/debug/mmaplock-prof"),
        &root.join("target/dist-test"),
        crate::cross::Target::host(),
    )?;
    image::build(
        &tarball,
        Some(image::TEST_TAG),
        crate::cross::Target::host(),
    )
    .map(Some)
}

/// Clippy on the eBPF crate for its own target (it is never built for the host, so the
/// workspace's clippy does not see its code), with the flags aya-build gives it, for each
/// architecture it is built for (`bpf_target_arch`: `arch.rs` differs).
fn ebpf_clippy(linker_dir: &Path) -> Result<()> {
    for target in cross::TARGETS {
        ebpf_clippy_for(linker_dir, target.arch)?;
    }
    Ok(())
}

fn ebpf_clippy_for(linker_dir: &Path, arch: &str) -> Result<()> {
    let mut cmd = Command::new("rustup");
    // Inside `cargo xtask` this would pin the call to the stable toolchain.
    cmd.env_remove("RUSTUP_TOOLCHAIN")
        .current_dir(workspace_root().join("profiler-ebpf"))
        .env("PATH", path_with(linker_dir)?)
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            format!("--cfg=bpf_target_arch=\"{arch}\"\x1f-Cdebuginfo=2\x1f-Clink-arg=--btf"),
        )
        .args([
            "run",
            "nightly",
            "cargo",
            "clippy",
            "--release",
            "--target",
            "bpfel-unknown-none",
            "-Z",
            "build-std=core",
            "--bin",
            "mmaplock",
            "--target-dir",
        ])
        // One directory per architecture: the flags differ, and would rebuild core.
        .arg(workspace_root().join(if arch == "x86_64" {
            "target/ebpf-clippy".to_string()
        } else {
            format!("target/ebpf-clippy-{arch}")
        }))
        .args(["--", "-D", "warnings"]);
    run(&mut cmd)
}

/// The environment variable naming the file where the integration tests record the tests they
/// skip (`tests/src/lib.rs`: `SKIP_FILE_ENV`, `skip_because`), one line each: `name<TAB>reason`.
const SKIP_FILE_ENV: &str = "MMAPLOCK_PROF_TEST_SKIP_FILE";

/// `CI` set (CI services set `CI=true`), as the integration tests decide it too.
pub fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && v != "false")
}

/// A test that could not run, as it recorded itself.
#[derive(Debug, PartialEq)]
struct Skip {
    test: String,
    reason: String,
}

fn parse_skips(text: &str) -> Vec<Skip> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let (test, reason) = l.split_once('\t').unwrap_or((l, "no reason given"));
            Skip {
                test: test.to_string(),
                reason: reason.to_string(),
            }
        })
        .collect()
}

/// Test outcomes over every test binary.
#[derive(Debug, Default, PartialEq)]
struct Tally {
    passed: u64,
    failed: u64,
    skipped: u64,
}

impl Tally {
    /// Adds a libtest `test result:` line; false for any other line.
    fn add_result_line(&mut self, line: &str) -> bool {
        let Some((p, f, i)) = parse_test_result(line) else {
            return false;
        };
        self.passed += p;
        self.failed += f;
        self.skipped += i;
        true
    }

    /// Another run's counts added to these.
    fn add(&mut self, other: &Tally) {
        self.passed += other.passed;
        self.failed += other.failed;
        self.skipped += other.skipped;
    }

    /// A skipped test returns early, which libtest counts as passed: count it as skipped.
    fn apply_skips(&mut self, skips: &[Skip]) {
        let n = skips.len() as u64;
        let moved = n.min(self.passed);
        self.passed -= moved;
        self.skipped += moved;
    }

    /// The kernel matrix's tests, each kernel's apart (`matrix[6.1]::file::test`); its skips
    /// join the suite's (under CI, a failure).
    fn add_matrix(&mut self, runs: &[matrix::KernelRun], skips: &mut Vec<Skip>) {
        for r in runs {
            let (p, f, s) = r.counts();
            self.passed += p;
            self.failed += f;
            self.skipped += s;
            for t in &r.tests {
                let test = format!("matrix[{}]::{}", r.kernel.name, t.name);
                match &t.outcome {
                    matrix::Outcome::Skipped(why) => skips.push(Skip {
                        test,
                        reason: why.clone(),
                    }),
                    // Not a skip for want of a tool: what it waits for is code (under CI,
                    // not a failure). Said beside the skips.
                    matrix::Outcome::Pending(why) => {
                        println!("pending: {test} ({why})");
                    }
                    _ => {}
                }
            }
        }
    }

    fn closing_line(&self) -> String {
        format!(
            "tests: {} passed, {} failed, {} skipped",
            self.passed, self.failed, self.skipped
        )
    }
}

/// Under CI (root, BPF available) a test that could not run is a failure: whatever skipped it
/// is something CI must have.
fn ci_verdict(ci: bool, skips: &[Skip]) -> Result<()> {
    if !ci || skips.is_empty() {
        return Ok(());
    }
    let names: Vec<String> = skips
        .iter()
        .map(|s| format!("{} ({})", s.test, s.reason))
        .collect();
    bail!(
        "{} BPF test(s) skipped under CI (CI is set), where every test must run: {}",
        skips.len(),
        names.join("; ")
    )
}

/// `test result: ok. 27 passed; 0 failed; 1 ignored; ...` -> (27, 0, 1).
fn parse_test_result(line: &str) -> Option<(u64, u64, u64)> {
    let rest = line.strip_prefix("test result: ")?;
    let count = |what: &str| -> u64 {
        rest.split(';')
            .find_map(|part| part.trim().strip_suffix(what))
            .and_then(|n| n.trim().rsplit(' ').next()?.parse().ok())
            .unwrap_or(0)
    };
    Some((count(" passed"), count(" failed"), count(" ignored")))
}

/// Runs `cargo test`, echoing its output, and adds up its `test result:` lines; a test that
/// runs past `limit` is taken for hung and named ([`pace::run_watched`]).
fn run_counting_tests(
    cmd: &mut Command,
    limit: std::time::Duration,
) -> Result<(Tally, std::process::ExitStatus)> {
    let mut tally = Tally::default();
    let status = pace::run_watched(cmd, limit, |line| {
        println!("{line}");
        tally.add_result_line(line);
    })?;
    Ok((tally, status))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_result_lines_are_counted() {
        assert_eq!(
            parse_test_result(
                "test result: ok. 27 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.09s"
            ),
            Some((27, 0, 1))
        );
        assert_eq!(
            parse_test_result("test result: FAILED. 9 passed; 1 failed; 0 ignored; 0 measured"),
            Some((9, 1, 0))
        );
        assert_eq!(parse_test_result("running 3 tests"), None);
    }

    #[test]
    fn skipped_tests_move_from_passed_to_skipped() {
        let mut t = Tally::default();
        for l in [
            "running 12 tests",
            "test result: ok. 10 passed; 0 failed; 2 ignored; 0 measured; 0 filtered out",
            "test result: FAILED. 3 passed; 1 failed; 0 ignored; 0 measured",
            "test a ... ok",
        ] {
            t.add_result_line(l);
        }
        assert_eq!(
            t,
            Tally {
                passed: 13,
                failed: 1,
                skipped: 2
            }
        );
        let skips = parse_skips(
            "duration_ends_the_run\tthis kernel has no mmap_lock tracepoints in its BTF\n\
             fork_is_charged_to_the_parents_own_lock\tno tracepoints\n\n",
        );
        assert_eq!(skips.len(), 2);
        assert_eq!(skips[0].test, "duration_ends_the_run");
        assert_eq!(skips[1].reason, "no tracepoints");
        t.apply_skips(&skips);
        assert_eq!(t.closing_line(), "tests: 11 passed, 1 failed, 4 skipped");
        // Never below zero, whatever the file says.
        let mut few = Tally {
            passed: 1,
            ..Tally::default()
        };
        few.apply_skips(&skips);
        assert_eq!(few.closing_line(), "tests: 0 passed, 0 failed, 1 skipped");
    }

    #[test]
    fn no_skip_file_means_no_skips() {
        assert!(parse_skips("").is_empty());
        let skips = parse_skips("a test without a reason\n");
        assert_eq!(skips[0].reason, "no reason given");
    }

    /// A matrix test waiting for a feature of the profiler counts as skipped, but is not a
    /// skip for CI's verdict; a kernel that could not be had is.
    #[test]
    fn pending_matrix_tests_do_not_fail_ci() {
        let k = matrix::select(&["arm64-6.1".to_string()]).unwrap()[0];
        let mut r = matrix::KernelRun::skipped(&k, &[("a", "b")], "no kernel".into());
        let mut t = Tally::default();
        let mut skips = Vec::new();
        t.add_matrix(std::slice::from_ref(&r), &mut skips);
        assert_eq!(skips.len(), 1);
        r.tests[0].outcome = matrix::Outcome::Passed;
        r.add_pending(&[("c", "d", "stacks on arm64")]);
        let (mut t, mut skips) = (Tally::default(), Vec::new());
        t.add_matrix(&[r], &mut skips);
        assert_eq!(t.closing_line(), "tests: 1 passed, 0 failed, 1 skipped");
        assert!(skips.is_empty());
        assert!(ci_verdict(true, &skips).is_ok());
    }

    #[test]
    fn a_skip_fails_the_run_under_ci_only() {
        let skips = parse_skips("every_json_line_follows_the_contract\tno tracepoints\n");
        assert!(ci_verdict(false, &skips).is_ok());
        assert!(ci_verdict(true, &[]).is_ok());
        let e = ci_verdict(true, &skips).unwrap_err().to_string();
        assert!(e.contains("1 BPF test(s) skipped under CI"), "{e}");
        assert!(
            e.contains("every_json_line_follows_the_contract (no tracepoints)"),
            "{e}"
        );
    }
}
