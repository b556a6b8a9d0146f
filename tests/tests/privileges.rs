//! ROOT-ONLY: least privilege (issue 8, docs/privileges.md). The profiler, run as an
//! unprivileged user (`nobody`) holding exactly the four capabilities the systemd unit grants
//! (CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH; nothing else, not even in its
//! bounding set, and no new privileges), still profiles another user's (root's) processes:
//! exact write counts, stacks symbolized from a binary in a directory only root may enter,
//! thread roles read from the target's memory; the agent selects it by executable and serves
//! its exact count. One capability fewer is one clear line and exit status 1.
//!
//! The capabilities are set with `setpriv` (util-linux, on every Debian); without it the tests
//! are skipped, which under CI is a failure (`skip_because`).

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use integration_tests::{
    Profiler, Workload, assert_churn_total, assert_main_and_workers, check_churn_writes, churn_bin,
    metric_gauge, metric_sum, process, profiler_bin, require_root_and_tracepoints, roles_workload,
    scrape::{free_port, metrics as scrape},
    skip_because, wait_until,
};

/// The capabilities of the systemd unit (deploy/systemd/mmaplock-prof.service), as setpriv
/// names them.
const CAPS: [&str; 4] = ["bpf", "perfmon", "sys_ptrace", "dac_read_search"];

/// Their bits (capability.h: DAC_READ_SEARCH 2, SYS_PTRACE 19, PERFMON 38, BPF 39), as
/// /proc/PID/status shows them.
const CAPS_MASK: u64 = 1 << 2 | 1 << 19 | 1 << 38 | 1 << 39;

/// `nobody`, by number: setpriv needs no passwd entry.
const NOBODY: u32 = 65534;

/// `setpriv`, if installed.
fn setpriv() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/bin", "/bin", "/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join("setpriv"))
        .find(|p| p.is_file())
}

/// A directory of the test's own, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str, mode: u32) -> Self {
        let d = std::env::temp_dir().join(format!("mlp-priv-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode)).unwrap();
        TempDir(d)
    }

    /// Copies `file` in, executable by everyone.
    fn copy(&self, file: &Path) -> PathBuf {
        let to = self.0.join(file.file_name().unwrap());
        std::fs::copy(file, &to).unwrap_or_else(|e| panic!("copy {}: {e}", file.display()));
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755)).unwrap();
        to
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What the tests need to run the profiler as `nobody`: setpriv, and a copy of the profiler
/// that `nobody` can reach (the workspace may be under /root, which it cannot enter).
struct Unprivileged {
    setpriv: PathBuf,
    profiler: PathBuf,
    _dir: TempDir,
}

impl Unprivileged {
    /// None (the test skipped) without setpriv, or without the tracepoints (root is a must).
    fn new() -> Option<Self> {
        if !require_root_and_tracepoints() {
            return None;
        }
        let Some(setpriv) = setpriv() else {
            skip_because("setpriv (util-linux) is not installed");
            return None;
        };
        let dir = TempDir::new("bin", 0o755);
        let profiler = dir.copy(&profiler_bin());
        Some(Unprivileged {
            setpriv,
            profiler,
            _dir: dir,
        })
    }

    /// `mmaplock-prof ARGS` as `nobody` with exactly `caps`: permitted,
    /// effective, inheritable, ambient and bounding sets alike, no supplementary groups, no
    /// new privileges (as the unit's NoNewPrivileges=yes).
    fn command(&self, caps: &[&str], args: &[&str]) -> Command {
        let set: String = caps.iter().map(|c| format!(",+{c}")).collect();
        let mut cmd = Command::new(&self.setpriv);
        cmd.arg(format!("--reuid={NOBODY}"))
            .arg(format!("--regid={NOBODY}"))
            .arg("--clear-groups")
            .arg(format!("--inh-caps=-all{set}"))
            .arg(format!("--ambient-caps=-all{set}"))
            .arg(format!("--bounding-set=-all{set}"))
            .arg("--no-new-privs")
            .arg("--")
            .arg(&self.profiler)
            .args(args)
            // As under the unit (DynamicUser=yes): HOME=/, our log level.
            .env("HOME", "/")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null());
        cmd
    }

    /// Starts the profiler (JSON output) with the four capabilities and waits until it is
    /// attached.
    fn start(&self, args: &[&str]) -> Profiler {
        let mut all = vec!["--format", "json"];
        all.extend_from_slice(args);
        Profiler::start_command(self.command(&CAPS, &all))
    }
}

/// What it takes to profile as `nobody`, and root's mmap-churn of `t` threads x `n`
/// iterations, ready, started from a copy in a directory only root may enter (`tag`): the
/// directory, the copy and the workload. None: the test is skipped ([`Unprivileged::new`]).
fn nobody_and_private_churn(
    tag: &str,
    t: u64,
    n: u64,
) -> Option<(Unprivileged, TempDir, PathBuf, Workload)> {
    let unpriv = Unprivileged::new()?;
    let private = TempDir::new(tag, 0o700);
    let helper = private.copy(&churn_bin());
    let mut cmd = Command::new(&helper);
    cmd.args([t.to_string(), n.to_string(), "65536".into()]);
    Some((unpriv, private, helper, Workload::spawn(cmd)))
}

/// A field of /proc/PID/status (`Uid`, `CapEff`, ...).
fn status_field(pid: u32, name: &str) -> String {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
        .trim()
        .to_string()
}

/// The running profiler is `nobody` with the four capabilities and nothing else.
fn assert_runs_with_exactly_the_four(pid: u32) {
    assert_eq!(
        status_field(pid, "Uid"),
        format!("{NOBODY}\t{NOBODY}\t{NOBODY}\t{NOBODY}")
    );
    assert_eq!(
        status_field(pid, "Gid"),
        format!("{NOBODY}\t{NOBODY}\t{NOBODY}\t{NOBODY}")
    );
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        let v = u64::from_str_radix(&status_field(pid, set), 16).unwrap();
        assert_eq!(v, CAPS_MASK, "{set} {v:#x}, expected {CAPS_MASK:#x}");
    }
    assert_eq!(status_field(pid, "NoNewPrivs"), "1");
}

/// Root's mmap-churn, started from a directory that only root may enter, profiled by `nobody`
/// with the four capabilities: the exact write count (CAP_BPF, CAP_PERFMON), the roles, and
/// every sample charged to the helper's binary (its /proc/PID/maps: CAP_SYS_PTRACE) and
/// symbolized from it (a 0700 directory: CAP_DAC_READ_SEARCH).
#[test]
fn four_capabilities_profile_another_users_process_exactly() {
    let (t, n) = (4u64, 2000u64);
    let Some((unpriv, _private, helper, mut w)) = nobody_and_private_churn("private", t, n) else {
        return;
    };
    let pid = w.pid.to_string();
    let prof = unpriv.start(&["--pid", &pid, "--interval", "0", "--stack-sample", "1"]);
    assert_runs_with_exactly_the_four(prof.pid());
    // The target is root's.
    assert!(status_field(w.pid, "Uid").starts_with("0\t"));
    w.go();
    assert!(w.wait().success());
    let out = prof.finish_ok();
    let p = process(out.summary(), w.pid).expect("the target is in the summary");
    check_churn_writes(p, w.pid, t, n, "as nobody");
    // Code attribution needs the target's maps and binary.
    let dsos = p["dsos"].as_array().expect("dsos with --stack-sample");
    let top = dsos
        .iter()
        .max_by_key(|d| d["write"]["count"].as_u64().unwrap())
        .expect("a sampled write");
    assert_eq!(top["dso"], helper.to_str().unwrap(), "{dsos:?}");
    let frames: Vec<&str> = p["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .flat_map(|s| s["frames"].as_array().unwrap())
        .map(|f| f.as_str().unwrap())
        .collect();
    assert!(
        frames.iter().any(|f| f.contains("map_touch_unmap")),
        "the helper's functions are named: {frames:?}"
    );
}

/// Root's Node.js process, profiled by `nobody` with the four capabilities: Node names none
/// of its threads, so Worker, libuv and V8 roles come only from each thread's start routine,
/// read from the target's memory (process_vm_readv: CAP_SYS_PTRACE) and symbolized from node.
#[test]
fn four_capabilities_read_another_users_node_thread_roles() {
    let Some(unpriv) = Unprivileged::new() else {
        return;
    };
    if Command::new("node").arg("--version").output().is_err() {
        skip_because("node is not installed");
        return;
    }
    let dir = TempDir::new("node", 0o755);
    let (mut w, workers) = roles_workload(&dir.0);
    let pid = w.pid.to_string();
    let prof = unpriv.start(&["-p", &pid, "-i", "0"]);
    assert_runs_with_exactly_the_four(prof.pid());
    w.go();
    assert!(w.wait().success());
    let out = prof.finish_ok();
    let p = process(out.summary(), w.pid).expect("node is in the summary");
    assert_main_and_workers(p, w.pid, &workers);
    let threads = p["threads"].as_array().unwrap();
    let count = |role: &str| threads.iter().filter(|t| t["role"] == role).count();
    assert_eq!(count("libuv"), 2, "UV_THREADPOOL_SIZE=2: {threads:?}");
    assert!(count("v8") >= 1, "{threads:?}");
}

/// Without CAP_BPF or CAP_PERFMON nothing can be loaded: exit status 1 and one line naming
/// the capability, before any output.
#[test]
fn one_capability_fewer_is_one_clear_line_and_exit_1() {
    let Some(unpriv) = Unprivileged::new() else {
        return;
    };
    let me = std::process::id().to_string();
    for missing in ["bpf", "perfmon"] {
        let caps: Vec<&str> = CAPS.into_iter().filter(|c| *c != missing).collect();
        let out = unpriv
            .command(&caps, &["--format", "json", "--pid", &me, "-d", "1"])
            .output()
            .expect("run setpriv");
        let err = String::from_utf8_lossy(&out.stderr);
        let what = format!("CAP_{}", missing.to_uppercase());
        assert_eq!(out.status.code(), Some(1), "without {what}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err:?}");
        assert!(err.starts_with("mmaplock-prof: "), "{err:?}");
        assert!(err.contains(&what), "{err:?} should name {what}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(out.stdout.is_empty(), "without {what}: no report");
    }
}

/// `--bpf-stats` refused (the four capabilities, no CAP_SYS_ADMIN) leaves the outputs of an
/// earlier run as they were: exit 1, one line, nothing emptied.
#[test]
fn a_refused_bpf_stats_leaves_existing_outputs_untouched() {
    let Some(unpriv) = Unprivileged::new() else {
        return;
    };
    // Files nobody may write (so that the run gets as far as --bpf-stats).
    let dir = TempDir::new("outputs", 0o755);
    let files: Vec<PathBuf> = ["run.json", "run.html", "run.folded"]
        .iter()
        .map(|f| dir.0.join(f))
        .collect();
    for f in &files {
        std::fs::write(f, "an earlier run\n").unwrap();
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o666)).unwrap();
    }
    let [o, html, stacks] = [0, 1, 2].map(|i| files[i].to_str().unwrap());
    let me = std::process::id().to_string();
    let out = unpriv
        .command(
            &CAPS,
            &[
                "--pid",
                &me,
                "--bpf-stats",
                "-o",
                o,
                "--html",
                html,
                "--stacks",
                stacks,
            ],
        )
        .output()
        .expect("run setpriv");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("CAP_SYS_ADMIN"), "{err}");
    for f in &files {
        assert_eq!(
            std::fs::read_to_string(f).unwrap(),
            "an earlier run\n",
            "{}",
            f.display()
        );
    }
}

/// The agent (issue 8's test list: "runs as a non-root user with exactly the documented
/// capabilities and still profiles another user's process"): as `nobody` with the four, it
/// selects root's helper by its executable (/proc/PID/exe: CAP_SYS_PTRACE) in a directory only
/// root may enter, and serves the helper's exact write count, by role.
#[test]
fn the_agent_with_the_four_selects_and_counts_another_users_process() {
    let (t, n) = (2u64, 5000u64);
    let Some((unpriv, _private, helper, mut w)) = nobody_and_private_churn("agent", t, n) else {
        return;
    };
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let agent = Profiler::start_command(unpriv.command(
        &CAPS,
        &[
            "agent",
            "--listen",
            &listen,
            "--exe",
            helper.to_str().unwrap(),
            "-i",
            "0.2",
            "--mode",
            "full",
        ],
    ));
    assert_runs_with_exactly_the_four(agent.pid());
    // Selected within an interval of the agent's start (its executable read from /proc/PID/exe);
    // an agent that never selected it would serve on: a bound, scaled by wait_until.
    wait_until(Duration::from_secs(10), Duration::from_millis(50), || {
        let text = scrape(port);
        match metric_gauge(&text, "mmaplock_tracked_processes") {
            0 => Err(format!("the helper was not selected: {text}")),
            _ => Ok(()),
        }
    });
    w.go();
    assert!(w.wait().success());
    let expected = 2 * t * n;
    let writes = |text: &str, role: &str| {
        metric_sum(
            text,
            "mmaplock_acquisitions_total",
            &["process=\"mmap-churn\"", "op=\"write\"", role],
        )
    };
    // The helper's writes are all in once its exit has been read (a few intervals): it is no
    // longer tracked, and what it did before is counted. (A bound on values a broken agent
    // might never serve, scaled by wait_until.)
    let text = wait_until(Duration::from_secs(15), Duration::from_millis(200), || {
        let text = scrape(port);
        match (
            writes(&text, "role="),
            metric_gauge(&text, "mmaplock_tracked_processes"),
        ) {
            (w, 0) if w > expected => Ok(text),
            (w, tracked) => Err(format!(
                "{w} writes of {expected} served, {tracked} processes tracked:\n{text}"
            )),
        }
    });
    let total = writes(&text, "role=");
    assert_churn_total(total, t, n, "agent as nobody", &format!(":\n{text}"));
    // The helper's threads (role read from its memory) made the 2*T*N; its main thread exited.
    let other = writes(&text, "role=\"other\"");
    assert!(
        (expected..=expected + 2 * t).contains(&other),
        "{other} writes by role other:\n{text}"
    );
    assert!(writes(&text, "role=\"main\"") >= 1, "{text}");
    // SIGTERM ends it cleanly.
    agent.signal(libc::SIGTERM);
    agent.finish_ok();
}

/// The agent as the systemd unit runs it: `nobody`, the four capabilities, its default mode.
/// That is contention mode on this kernel, whose programs read the rwsem's owner and the
/// holder's registers with nothing more: it counts root's helper's contended writes.
#[test]
fn the_agent_with_the_four_runs_its_default_contention_mode() {
    let (t, n) = (4u64, 20_000u64);
    let Some((unpriv, _private, helper, mut w)) = nobody_and_private_churn("agent-c", t, n) else {
        return;
    };
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let agent = Profiler::start_command(unpriv.command(
        &CAPS,
        &[
            "agent",
            "--listen",
            &listen,
            "--exe",
            helper.to_str().unwrap(),
            "-i",
            "0.2",
        ],
    ));
    assert_runs_with_exactly_the_four(agent.pid());
    // (Bounds on what a broken agent might never serve, scaled by wait_until.)
    wait_until(Duration::from_secs(10), Duration::from_millis(50), || {
        let text = scrape(port);
        match metric_gauge(&text, "mmaplock_tracked_processes") {
            0 => Err(format!("the helper was not selected: {text}")),
            _ => Ok(()),
        }
    });
    w.go();
    assert!(w.wait().success());
    let text = wait_until(Duration::from_secs(15), Duration::from_millis(200), || {
        let text = scrape(port);
        let writes = metric_sum(
            &text,
            "mmaplock_acquisitions_total",
            &[
                "process=\"mmap-churn\"",
                "op=\"write\"",
                "mode=\"contention\"",
            ],
        );
        if writes > 0 && metric_gauge(&text, "mmaplock_tracked_processes") == 0 {
            Ok(text)
        } else {
            Err(format!("{writes} contended writes served:\n{text}"))
        }
    });
    assert!(
        text.lines()
            .any(|l| l.starts_with("mmaplock_build_info{") && l.contains("mode=\"contention\"")),
        "{text}"
    );
    // Who made whom wait, with no --blockers: the helper's writers behind one another.
    assert!(
        integration_tests::metric_f64(
            &text,
            "mmaplock_blocked_seconds_total",
            &["holder_role=\"other\""]
        ) > 0.0
            || text.contains("holder_role=\"readers\""),
        "{text}"
    );
    assert_eq!(
        metric_sum(&text, "mmaplock_lost_total", &["reason=\"events\""]),
        0
    );
    agent.signal(libc::SIGTERM);
    agent.finish_ok();
}
