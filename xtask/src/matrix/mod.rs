//! The kernel matrix: a subset of the integration tests, chosen to touch every kernel
//! interface the profiler reads, run inside the kernels production Node hosts run (Debian's
//! packages, booted with virtme-ng), with the test binaries already built on the host (no
//! cargo in the guest). Each kernel's probes (`mmaplock-prof --probe-kernel`) are recorded
//! beside its results. docs/kernels.md says how to add a kernel or a test, and how to run
//! one kernel alone (`cargo xtask matrix 6.1`).

mod apt_sources;
mod fetch;
mod guest;
mod report;
mod script;
mod watch;

use std::{
    path::{Path, PathBuf},
    sync::Mutex,
    time::Instant,
};

use anyhow::{Context as _, Result, bail};

pub use report::{KernelRun, Outcome};

/// A kernel of the matrix.
#[derive(Clone, Copy, Debug)]
pub struct Kernel {
    /// What `cargo xtask matrix NAME` and the results call it.
    pub name: &'static str,
    /// The Debian suite whose `linux-image-amd64` it is.
    pub suite: &'static str,
    /// Whether the profiler runs there, or must refuse in one line.
    pub profiles: bool,
    /// Its guest's vCPUs (`guest::run`).
    pub cpus: u32,
}

/// The kernels, in the order they run: Debian 12's, Debian 13's, the newest Debian ships
/// (trixie-backports), and one the profiler must refuse.
pub const KERNELS: [Kernel; 4] = [
    Kernel {
        name: "6.1",
        suite: "bookworm",
        cpus: 1,
        profiles: true,
    },
    Kernel {
        name: "6.12",
        suite: "trixie",
        cpus: 1,
        profiles: true,
    },
    Kernel {
        name: "newest",
        suite: "trixie-backports",
        cpus: 2,
        profiles: true,
    },
    Kernel {
        name: "5.10",
        suite: "bullseye",
        cpus: 1,
        profiles: false,
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

/// The tests a kernel runs.
pub fn tests_of(k: &Kernel) -> &'static [(&'static str, &'static str)] {
    if k.profiles { SUBSET } else { REFUSAL }
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

/// Runs the matrix on `kernels`; the test binaries are those of the last `cargo test` build
/// (`binaries`: test file -> executable). A kernel that cannot be fetched or booted has its
/// tests skipped, with the reason. The kernels are fetched one after another (one apt), then
/// their guests run side by side, one vCPU each (`guests()` at once); the runs come back in
/// `kernels`' order.
pub fn run(kernels: &[Kernel], binaries: &[(String, PathBuf)]) -> Result<Vec<KernelRun>> {
    let venv_bin = guest::ensure_virtme_ng()?;
    let work = crate::workspace_root().join("target/matrix");
    let mut accel = None;
    let mut runs: Vec<Option<KernelRun>> = vec![None; kernels.len()];
    let mut ready = Vec::new();
    for (i, k) in kernels.iter().enumerate() {
        let started = Instant::now();
        match fetch::fetch(k) {
            Ok(f) => {
                if accel.is_none() {
                    let a = guest::choose_accel(&venv_bin, &f, &work.join("kvm-probe"))?;
                    eprintln!("xtask: kernel matrix guests run under {a}");
                    accel = Some(a);
                }
                ready.push((i, f, started.elapsed()));
            }
            Err(e) => {
                runs[i] = Some(KernelRun::skipped(
                    k,
                    tests_of(k),
                    format!("cannot fetch it: {e:#}"),
                ));
            }
        }
    }
    let Some(accel) = accel else {
        return Ok(runs.into_iter().flatten().collect());
    };
    let host = watch::host_factor();
    let queue = Mutex::new(ready.into_iter());
    let done = Mutex::new(runs);
    std::thread::scope(|scope| -> Result<()> {
        let workers: Vec<_> = (0..guests(kernels.len()))
            .map(|_| {
                scope.spawn(|| -> Result<()> {
                    loop {
                        let Some((i, f, fetching)) = queue.lock().unwrap().next() else {
                            return Ok(());
                        };
                        let k = &kernels[i];
                        let started = Instant::now();
                        let mut run = run_kernel(k, &f, accel, host, &venv_bin, &work, binaries)?;
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
    fetched: &fetch::Fetched,
    accel: guest::Accel,
    host: f64,
    venv_bin: &Path,
    work: &Path,
    binaries: &[(String, PathBuf)],
) -> Result<KernelRun> {
    let tests = tests_of(k);
    let rwdir = work.join(k.name);
    let _ = std::fs::remove_dir_all(&rwdir);
    std::fs::create_dir_all(rwdir.join("logs"))?;
    let script = rwdir.join("run.sh");
    let default_factor = watch::default_factor(accel, host);
    std::fs::write(
        &script,
        script::guest_script(
            &rwdir,
            tests,
            binaries,
            default_factor,
            watch::test_most_s(host),
        )?,
    )?;
    eprintln!(
        "xtask: kernel matrix [{}]: Linux {} ({}), {} test(s)",
        k.name,
        fetched.release,
        k.suite,
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
            "current",
            "done",
        ] {
            let _ = std::fs::remove_file(rwdir.join(stale));
        }
        let mut w = watch::Watch::new(&rwdir, host);
        let ended = guest::run(
            venv_bin,
            fetched,
            accel,
            k.cpus,
            &rwdir,
            &format!("sh {}", script.display()),
            &mut |now| w.check(now),
        )?;
        let killed = match ended {
            guest::Ended::Exited => None,
            guest::Ended::Killed(k) => Some(k),
        };
        let mut run = KernelRun::read(k, tests, &fetched.release, accel, &rwdir, killed);
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

/// The integration tests' executables, as cargo built them: (test file, path).
pub fn test_binaries(linker_dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    let out = crate::cargo(linker_dir)?
        // The whole workspace, as the suite's `cargo test` builds it: with `-p` alone, cargo
        // unifies the dependencies' features for that package only and builds many of them
        // again (70 s on 2 cores); built so, every unit is fresh.
        .args([
            "test",
            "--workspace",
            "--tests",
            "--no-run",
            "--message-format=json",
        ])
        .stderr(std::process::Stdio::inherit())
        .output()?;
    if !out.status.success() {
        bail!("cargo test --no-run failed: {}", out.status);
    }
    let mut bins = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
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
    Ok(bins)
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
            e.contains("no kernel \"4.19\"") && e.contains("6.1, 6.12, newest, 5.10"),
            "{e}"
        );
    }

    /// Every test of the subset exists in its file: a renamed test would otherwise be
    /// "filtered out" in every guest.
    #[test]
    fn every_subset_test_is_a_test() {
        let root = crate::workspace_root();
        for (file, test) in SUBSET.iter().chain(REFUSAL) {
            let src = std::fs::read_to_string(root.join(format!("tests/tests/{file}.rs")))
                .unwrap_or_else(|e| panic!("tests/tests/{file}.rs: {e}"));
            assert!(src.contains(&format!("fn {test}()")), "{file}::{test}");
        }
    }
}
