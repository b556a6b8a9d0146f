//! The kernel matrix: a subset of the integration tests, chosen to touch every kernel
//! interface the profiler reads, run inside the kernels production Node hosts run (Debian's
//! packages, booted with virtme-ng), with the test binaries already built on the host (no
//! cargo in the guest). Each kernel's probes (`mmaplock-prof --probe-kernel`) are recorded
//! beside its results. docs/kernels.md says how to add a kernel or a test, and how to run
//! one kernel alone (`cargo xtask matrix 6.1`).

mod apt_sources;
mod binaries;
mod fetch;
mod guest;
mod initramfs;
mod qemu;
mod report;
mod rootfs;
mod script;
mod watch;

use std::{
    path::{Path, PathBuf},
    sync::Mutex,
    time::Instant,
};

use anyhow::{Context as _, Result};

pub use binaries::{Build, build_beside, build_for};
pub use report::{KernelRun, Outcome};

/// The machine a kernel of the matrix runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Arch {
    /// The host's own: booted with virtme-ng on the host's root file system.
    X86_64,
    /// Emulated on any host (`qemu-system-aarch64 -M virt -cpu max`, TCG), on a root file
    /// system of Debian's arm64 packages (`rootfs`), running cross-built test binaries.
    Arm64,
}

impl Arch {
    /// Debian's name for it (`linux-image-NAME`, `PKG:NAME`).
    pub fn debian(self) -> &'static str {
        match self {
            Arch::X86_64 => "amd64",
            Arch::Arm64 => "arm64",
        }
    }

    /// The Rust target its binaries are built for; None: the host's own build.
    pub fn rust_target(self) -> Option<&'static str> {
        match self {
            Arch::X86_64 => None,
            Arch::Arm64 => Some("aarch64-unknown-linux-gnu"),
        }
    }
}

/// A kernel of the matrix.
#[derive(Clone, Copy, Debug)]
pub struct Kernel {
    /// What `cargo xtask matrix NAME` and the results call it.
    pub name: &'static str,
    /// The Debian suite whose `linux-image-ARCH` it is.
    pub suite: &'static str,
    pub arch: Arch,
    /// Whether the profiler runs there, or must refuse in one line.
    pub profiles: bool,
    /// Its guest's vCPUs (`guest::run`).
    pub cpus: u32,
}

/// The kernels, in the order they run: Debian 12's, Debian 13's, the newest Debian ships
/// (trixie-backports), one the profiler must refuse, and Debian 12's and 13's for arm64.
pub const KERNELS: [Kernel; 6] = [
    Kernel {
        name: "6.1",
        arch: Arch::X86_64,
        suite: "bookworm",
        cpus: 1,
        profiles: true,
    },
    Kernel {
        name: "6.12",
        arch: Arch::X86_64,
        suite: "trixie",
        cpus: 1,
        profiles: true,
    },
    Kernel {
        name: "newest",
        arch: Arch::X86_64,
        suite: "trixie-backports",
        cpus: 2,
        profiles: true,
    },
    Kernel {
        name: "5.10",
        arch: Arch::X86_64,
        suite: "bullseye",
        cpus: 1,
        profiles: false,
    },
    Kernel {
        name: "arm64-6.1",
        arch: Arch::Arm64,
        suite: "bookworm",
        cpus: 1,
        profiles: true,
    },
    Kernel {
        name: "arm64-6.12",
        arch: Arch::Arm64,
        suite: "trixie",
        cpus: 1,
        profiles: true,
    },
];

/// The tests run in each kernel that profiles, as (test file, test name): one line adds a
/// test to every kernel. Together they read every kernel interface the profiler uses, each
/// test starting the profiler once or twice (an attach takes 10-15 s under TCG: the subset is
/// what fits the suite's budget): the probes and the refusal; exact counts against the
/// ground-truth helper (the tracepoints' layout, task storage, the task iterator, exits, the
/// syscall causes from `bpf_task_pt_regs`); a page fault's write (`orig_ax` -1); munmap's
/// downgrade; fork; thread churn; Node 20's JS names with no flags (user stacks and memory,
/// the thread roles' fs base); the agent's selection at exec (comm matching, exec and exit
/// notices); and `--blockers` (`bpf_loop`: loaded, attached and run by the first test; the
/// long holder's charging test is calibrated on real cores and failed under TCG on every
/// kernel, docs/kernels.md).
pub const SUBSET: &[(&str, &str)] = &[
    ("kernel", "the_probes_decide_every_mode"),
    (
        "profiler",
        "write_count_matches_ground_truth_exactly_up_to_exit",
    ),
    ("fidelity", "stack_growth_is_a_page_fault_write"),
    ("fidelity", "munmap_downgrades_are_not_reads"),
    ("fidelity", "fork_is_charged_to_the_parents_own_lock"),
    ("fidelity", "thread_churn_polled_every_100ms_loses_no_write"),
    ("jsnames", "node26_names_with_no_flags"),
    (
        "agent",
        "short_processes_are_counted_from_their_first_instruction",
    ),
    // Contention mode: its programs on lock:contention_begin/end, against bpftrace's count
    // of the same events; and full mode's word on kernels that format memcg paths.
    (
        "contention",
        "contended_waits_match_bpftrace_per_thread_on_the_write_heavy_helper",
    ),
    (
        "contention_views",
        "full_mode_says_when_the_kernel_formats_memcg_paths",
    ),
];

/// In a kernel the profiler must refuse: the probes, and every mode's one-line refusal.
pub const REFUSAL: &[(&str, &str)] = &[("kernel", "the_probes_decide_every_mode")];

/// The tests run in each arm64 kernel: the checks of [`SUBSET`] that fit an arm64 guest,
/// emulated instruction by instruction beside the x86 ones: the probes and every mode's
/// start (`--blockers` included); exact counts against the ground-truth helper; a page
/// fault's write; Node 26's thread roles (TPIDR_EL0) and JavaScript names with no flag
/// (aarch64 unwinding, V8's frames); contention mode against bpftrace with its causes
/// (`syscallno`); a native holder's stack; the agent's selection of a node from its first
/// instruction (one node: the x86 subset's 40 short processes take 430-560 s under TCG on
/// arm64, docs/kernels.md).
pub const ARM64_SUBSET: &[(&str, &str)] = &[
    ("kernel", "the_probes_decide_every_mode"),
    (
        "profiler",
        "write_count_matches_ground_truth_exactly_up_to_exit",
    ),
    ("fidelity", "stack_growth_is_a_page_fault_write"),
    (
        "profiler",
        "node26_thread_roles_are_recognised_on_a_running_process",
    ),
    (
        "contention",
        "contended_waits_match_bpftrace_per_thread_on_the_write_heavy_helper",
    ),
    ("jsnames", "node26_names_with_no_flags"),
    ("holders", "a_native_holder_is_named_by_its_function"),
    (
        "agent",
        "a_node_started_after_the_agent_is_profiled_from_its_start",
    ),
];

/// The arm64 kernels' tests that wait for the profiler's aarch64 support (issue 47): not
/// run, each reported skipped with what it waits for, until its feature lands and the test
/// moves to [`ARM64_SUBSET`]. Under CI they do not fail the run, as a skip for want of a tool
/// would: what they wait for is code, not the machine.
pub const ARM64_PENDING: &[(&str, &str, &str)] = &[];

/// The tests a kernel runs.
pub fn tests_of(k: &Kernel) -> &'static [(&'static str, &'static str)] {
    match (k.profiles, k.arch) {
        (false, _) => REFUSAL,
        (true, Arch::X86_64) => SUBSET,
        (true, Arch::Arm64) => ARM64_SUBSET,
    }
}

/// The variable that narrows each kernel's tests to those named (comma-separated, each a test
/// function's name or `file::name`): for looking at one test in the guests, never under CI.
pub const TESTS_ENV: &str = "MMAPLOCK_PROF_MATRIX_TESTS";

/// `tests` narrowed by `TESTS_ENV` (all of them when it is unset or empty, or under CI).
fn narrowed(tests: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
    let wanted = match crate::suite::under_ci() {
        true => String::new(),
        false => std::env::var(TESTS_ENV).unwrap_or_default(),
    };
    let wanted: Vec<&str> = wanted.split(',').filter(|w| !w.is_empty()).collect();
    tests
        .iter()
        .filter(|(file, name)| {
            wanted.is_empty()
                || wanted
                    .iter()
                    .any(|w| w == name || *w == format!("{file}::{name}"))
        })
        .copied()
        .collect()
}

/// The tests a kernel reports as waiting for a feature of the profiler, with what they wait
/// for.
pub fn pending_of(k: &Kernel) -> &'static [(&'static str, &'static str, &'static str)] {
    match (k.profiles, k.arch) {
        (true, Arch::Arm64) => ARM64_PENDING,
        _ => &[],
    }
}

/// How many times a kernel whose guest crashed (`guest::crash_line`) is booted again.
const CRASH_REBOOTS: usize = 1;

/// The variable that sets how many guests run at once (default: every kernel's).
pub const GUESTS_ENV: &str = "MMAPLOCK_PROF_MATRIX_GUESTS";

/// The kernels named (all when none is), or an error naming the unknown one.
pub fn select(names: &[String]) -> Result<Vec<Kernel>> {
    if names.is_empty() {
        return Ok(KERNELS.to_vec());
    }
    names
        .iter()
        .map(|n| {
            KERNELS
                .iter()
                .find(|k| k.name == n)
                .copied()
                .with_context(|| {
                    let known: Vec<&str> = KERNELS.iter().map(|k| k.name).collect();
                    format!(
                        "no kernel {n:?} in the matrix (known: {})",
                        known.join(", ")
                    )
                })
        })
        .collect()
}

/// A kernel fetched, with what its guest boots besides.
struct Ready {
    fetched: fetch::Fetched,
    boot: Boot,
}

/// How a kernel's guest is booted.
enum Boot {
    /// With virtme-ng, on the host's root file system.
    Vng { accel: guest::Accel },
    /// With QEMU alone, on a root file system of the guest's architecture.
    Qemu { rootfs: PathBuf, busybox: PathBuf },
}

/// Runs the matrix on `kernels`; `builds` has the binaries of each kernel's architecture
/// (`binaries::build_for`). A kernel that cannot be fetched or booted has its tests skipped,
/// with the reason. The kernels (and the arm64 guests' root file system) are fetched one
/// after another (one apt), then their guests run side by side, one vCPU each (`guests()`
/// at once); the runs come back in `kernels`' order.
pub fn run(kernels: &[Kernel], builds: &[binaries::Build]) -> Result<Vec<KernelRun>> {
    let venv_bin = if kernels.iter().any(|k| k.arch == Arch::X86_64) {
        Some(guest::ensure_virtme_ng()?)
    } else {
        None
    };
    if kernels.iter().any(|k| k.arch != Arch::X86_64) {
        qemu::ensure()?;
    }
    let work = crate::workspace_root().join("target/matrix");
    let mut accel = None;
    let mut rootfs: Vec<(Arch, Result<PathBuf, String>)> = Vec::new();
    let mut runs: Vec<Option<KernelRun>> = vec![None; kernels.len()];
    let mut ready = Vec::new();
    for (i, k) in kernels.iter().enumerate() {
        let started = Instant::now();
        let skip = |why: String| Some(KernelRun::skipped(k, tests_of(k), why));
        let f = match fetch::fetch(k) {
            Ok(f) => f,
            Err(e) => {
                runs[i] = skip(format!("cannot fetch it: {e:#}"));
                continue;
            }
        };
        let boot = match k.arch {
            Arch::X86_64 => {
                let venv_bin = venv_bin.as_deref().expect("virtme-ng for x86_64 kernels");
                let a = match accel {
                    Some(a) => a,
                    None => {
                        let a = guest::choose_accel(venv_bin, &f, &work.join("kvm-probe"))?;
                        eprintln!("xtask: kernel matrix guests run under {a}");
                        *accel.insert(a)
                    }
                };
                Boot::Vng { accel: a }
            }
            arch => {
                if !rootfs.iter().any(|(a, _)| *a == arch) {
                    rootfs.push((arch, rootfs::ensure(arch).map_err(|e| format!("{e:#}"))));
                }
                match &rootfs.iter().find(|(a, _)| *a == arch).expect("pushed").1 {
                    Ok(root) => Boot::Qemu {
                        rootfs: root.clone(),
                        busybox: root.join("usr/bin/busybox"),
                    },
                    Err(e) => {
                        runs[i] = skip(format!("cannot assemble its root file system: {e}"));
                        continue;
                    }
                }
            }
        };
        ready.push((i, Ready { fetched: f, boot }, started.elapsed()));
    }
    let host = watch::host_factor();
    let queue = Mutex::new(ready.into_iter());
    let done = Mutex::new(runs);
    std::thread::scope(|scope| -> Result<()> {
        let workers: Vec<_> = (0..guests(kernels.len()))
            .map(|_| {
                scope.spawn(|| -> Result<()> {
                    loop {
                        let Some((i, r, fetching)) = queue.lock().unwrap().next() else {
                            return Ok(());
                        };
                        let k = &kernels[i];
                        let started = Instant::now();
                        let build = builds
                            .iter()
                            .find(|b| b.arch == k.arch)
                            .with_context(|| format!("no {:?} build for {}", k.arch, k.name))?;
                        let mut run =
                            run_kernel(k, &r, host, venv_bin.as_deref(), &work, build)?;
                        run.wall = fetching + started.elapsed();
                        let (p, fl, s) = run.counts();
                        eprintln!(
                            "xtask: kernel matrix [{}]: {p} passed, {fl} failed, {s} skipped in {:.0} s",
                            k.name,
                            run.wall.as_secs_f64()
                        );
                        done.lock().unwrap()[i] = Some(run);
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().expect("a kernel matrix worker panicked")?;
        }
        Ok(())
    })?;
    Ok(done.into_inner().unwrap().into_iter().flatten().collect())
}

/// How many guests run at once: every kernel's unless `GUESTS_ENV` says fewer (the times
/// of each are in docs/kernels.md, "Cost").
fn guests(kernels: usize) -> usize {
    std::env::var(GUESTS_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(kernels)
        .clamp(1, kernels.max(1))
}

/// One kernel's guest, booted again if its kernel crashed (`CRASH_REBOOTS`).
fn run_kernel(
    k: &Kernel,
    ready: &Ready,
    host: f64,
    venv_bin: Option<&Path>,
    work: &Path,
    build: &binaries::Build,
) -> Result<KernelRun> {
    let fetched = &ready.fetched;
    let tests = &narrowed(tests_of(k))[..];
    let rwdir = work.join(k.name);
    let _ = std::fs::remove_dir_all(&rwdir);
    std::fs::create_dir_all(rwdir.join("logs"))?;
    let script = rwdir.join("run.sh");
    let accel = match ready.boot {
        Boot::Vng { accel } => accel,
        // No KVM runs another architecture's kernel.
        Boot::Qemu { .. } => guest::Accel::Tcg,
    };
    let default_factor = watch::default_factor(accel, host);
    std::fs::write(
        &script,
        script::guest_script(
            &rwdir,
            tests,
            &build.tests,
            &build.bin_dir,
            build.tarball.as_deref(),
            default_factor,
            watch::test_most_s(host),
        )?,
    )?;
    eprintln!(
        "xtask: kernel matrix [{}]: Linux {} ({} {}), {} test(s)",
        k.name,
        fetched.release,
        k.suite,
        k.arch.debian(),
        tests.len()
    );
    let mut notes = Vec::new();
    loop {
        for stale in [
            "results.tsv",
            "skips.txt",
            "probe.txt",
            "release.txt",
            "speed.txt",
            "tarball.txt",
            "tarball.status",
            "current",
            "done",
        ] {
            let _ = std::fs::remove_file(rwdir.join(stale));
        }
        let _ = std::fs::remove_dir_all(rwdir.join("tarball"));
        let mut w = watch::Watch::new(&rwdir, host);
        let ended = match &ready.boot {
            Boot::Vng { accel } => guest::run(
                venv_bin.expect("virtme-ng for x86_64 kernels"),
                fetched,
                *accel,
                k.cpus,
                &rwdir,
                &format!("sh {}", script.display()),
                &mut |now| w.check(now),
            )?,
            Boot::Qemu { rootfs, busybox } => {
                let initramfs = rwdir.join("initramfs.cpio");
                initramfs::write(&fetched.modules, busybox, &initramfs)?;
                let machine = qemu::Machine {
                    kernel: fetched,
                    initramfs: &initramfs,
                    rootfs,
                    shares: &qemu::shares()?,
                    cpus: k.cpus,
                };
                qemu::run(&machine, &rwdir, &script, &mut |now| w.check(now))?
            }
        };
        let killed = match ended {
            guest::Ended::Exited => None,
            guest::Ended::Killed(k) => Some(k),
        };
        let mut run = KernelRun::read(k, tests, &fetched.release, accel, &rwdir, killed);
        if build.tarball.is_some() {
            run.tests.push(report::tarball_probe(&rwdir, &run.probe));
        }
        run.add_pending(pending_of(k));
        run.default_factor = default_factor;
        let console = std::fs::read_to_string(rwdir.join("console.log")).unwrap_or_default();
        let Some(crash) = guest::crash_line(&console) else {
            run.notes = notes;
            return Ok(run);
        };
        // A guest kernel that crashed under emulation is booted once more, and says so:
        // a test's own failure on a kernel that did not crash is never retried.
        let (p, f, _) = run.counts();
        notes.push(format!(
            "boot {}: the guest kernel crashed after {p} passed and {f} failed or not run: {crash}",
            notes.len() + 1
        ));
        let kept = rwdir.join(format!("console-{}.log", notes.len()));
        let _ = std::fs::rename(rwdir.join("console.log"), &kept);
        if notes.len() > CRASH_REBOOTS || f == 0 {
            run.notes = notes;
            return Ok(run);
        }
        eprintln!(
            "xtask: kernel matrix [{}]: Linux {} crashed under emulation ({}), booting it again",
            k.name,
            fetched.release,
            kept.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_are_selected_by_name() {
        assert_eq!(select(&[]).unwrap().len(), KERNELS.len());
        let one = select(&["6.12".to_string()]).unwrap();
        assert_eq!(one[0].suite, "trixie");
        let e = select(&["4.19".to_string()]).unwrap_err().to_string();
        assert!(
            e.contains("no kernel \"4.19\"")
                && e.contains("6.1, 6.12, newest, 5.10, arm64-6.1, arm64-6.12"),
            "{e}"
        );
    }

    /// Every test of the subset exists in its file: a renamed test would otherwise be
    /// "filtered out" in every guest.
    #[test]
    fn every_subset_test_is_a_test() {
        let root = crate::workspace_root();
        let pending = ARM64_PENDING.iter().map(|(f, t, _)| (*f, *t));
        for (file, test) in SUBSET
            .iter()
            .chain(REFUSAL)
            .chain(ARM64_SUBSET)
            .copied()
            .chain(pending)
        {
            let src = std::fs::read_to_string(root.join(format!("tests/tests/{file}.rs")))
                .unwrap_or_else(|e| panic!("tests/tests/{file}.rs: {e}"));
            assert!(src.contains(&format!("fn {test}()")), "{file}::{test}");
        }
    }
}
