//! The agent's triggered capture (`--escalate-dir`): a process whose threads' wait for its
//! lock crosses the threshold gets one bounded full profile, with its diagnosis, written under
//! the directory; a quiet process, a process outside the selection and a process in its
//! cooldown get none; two processes crossing at once are captured one after the other; the
//! directory's budget holds, and a full disk loses the capture, not the agent. Every capture
//! carries its verdict (`trigger`): the share that crossed and over how long, the window's
//! sampled functions and findings, and whether the contention went on or had passed; a
//! burst as a process starts is judged over a full window of its life, so that it does not
//! take the capture from a process that stays contended.
//!
//! The contended process is `phases.js`: Workers that `fs.readFileSync` a 64 KiB file in a
//! named function (`readChunks`) when told to, under `MALLOC_MMAP_THRESHOLD_=65536`, which
//! keeps glibc from raising its mmap threshold: every read is an mmap and a munmap on the
//! Workers' one address space, as long as the phase lasts (without it the contention is
//! glibc's warm-up alone, gone in seconds).

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use integration_tests::{
    Workload, bpf_test, fixture, installed_or_skip, metric_sum,
    nodes::{Node, node_or_skip},
    pprof::{go_bin, top_total},
    rendered_dom,
    scrape::{Agent, Prometheus, dashboard_annotations, prometheus_bin},
    wait_until,
};
use serde_json::Value;

/// The threshold the tests use: the contended phase waits a quarter of its threads' time or
/// more on this machine kind, the quiet one nothing (the default, 5%, is crossed as well).
const AT: &str = "5";
/// Short windows and captures, so that a test takes a minute, not ten.
const WINDOW: &str = "5";
const LENGTH: &str = "5";

/// `phases.js` with 4 Workers reading `chunk` (idle until "go").
fn phases(node: &Node, chunk: &Path) -> Workload {
    phases_as(node.command(), chunk)
}

/// `phases.js` run by `node` exec'd under the name `name` (a link to it in `dir`): its
/// command name, which an agent's `--comm` selects at its exec, from its first instruction.
fn phases_named(node: &Node, dir: &Path, name: &str, chunk: &Path) -> Workload {
    let link = dir.join(name);
    if !link.exists() {
        std::os::unix::fs::symlink(&node.bin, &link).unwrap();
    }
    phases_as(Command::new(link), chunk)
}

fn phases_as(mut cmd: Command, chunk: &Path) -> Workload {
    cmd.env("MALLOC_MMAP_THRESHOLD_", "65536")
        .arg(fixture("phases.js"))
        .arg("4")
        .arg(chunk);
    Workload::spawn(cmd)
}

/// Starts the contended phase; returns when it began (the fixture's clock, as the reports
/// write times: RFC 3339 UTC with milliseconds, which sort as text).
fn go(w: &mut Workload) -> String {
    w.send("go");
    let l = w.read_line();
    l.strip_prefix("going ").expect("going TIME").to_string()
}

fn stop(w: &mut Workload) {
    w.send("stop");
    assert!(w.read_line().starts_with("stopped"));
}

fn chunk(dir: &Path) -> PathBuf {
    let p = dir.join("chunk");
    fs::write(&p, vec![7u8; 64 << 10]).unwrap();
    p
}

/// A BPF test's directory, Node 22 and the 64 KiB file in that directory (None: skipped,
/// which fails the run under CI).
fn setup() -> Option<(tempfile::TempDir, Node, PathBuf)> {
    let dir = bpf_test()?;
    let node = node_or_skip(22)?;
    let chunk = chunk(dir.path());
    Some((dir, node, chunk))
}

fn escalations(agent: &Agent, reason: &str) -> u64 {
    metric_sum(
        &agent.metrics(),
        "mmaplock_escalations_total",
        &[&format!("reason=\"{reason}\"")],
    )
}

/// Waits until the agent has counted `n` crossings for `reason`.
fn wait_escalations(agent: &Agent, reason: &str, n: u64) {
    wait_until(
        Duration::from_secs(240),
        Duration::from_millis(250),
        || match escalations(agent, reason) {
            got if got >= n => Ok(()),
            got => Err(format!("{got} escalations {reason}, waiting for {n}")),
        },
    );
}

/// The capture directories under `root` of process `pid`, oldest first.
fn captures_of(root: &Path, pid: u32) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(root)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(&format!("-{pid}")))
        })
        .collect();
    v.sort();
    v
}

/// A capture's summary (the last line of its report.ndjson).
fn summary(capture: &Path) -> Value {
    let text = fs::read_to_string(capture.join("report.ndjson")).unwrap();
    let last = text.lines().last().expect("a report");
    let v: Value = serde_json::from_str(last).unwrap();
    assert_eq!(v["type"], "summary", "{}", capture.display());
    v
}

/// Starts the agent with escalation on, watching `pids`, with the tests' settings unless
/// `extra` (flag, value pairs) gives its own.
fn agent(dir: &Path, pids: &[u32], cooldown: &str, extra: &[&str]) -> Agent {
    agent_of(dir, pids, &[], cooldown, extra)
}

/// [`agent`], selecting the processes named `comms` too.
fn agent_of(dir: &Path, pids: &[u32], comms: &[&str], cooldown: &str, extra: &[&str]) -> Agent {
    let defaults = [
        ("--escalate-dir", dir.to_str().unwrap()),
        ("--escalate-at", AT),
        ("--escalate-window", WINDOW),
        ("--escalate-for", LENGTH),
        ("--escalate-cooldown", cooldown),
        ("--stack-sample", "16"),
    ];
    let mut args: Vec<String> = Vec::new();
    for (flag, value) in defaults {
        if !extra.contains(&flag) {
            args.extend([flag.to_string(), value.to_string()]);
        }
    }
    for p in pids {
        args.extend(["--pid".to_string(), p.to_string()]);
    }
    for c in comms {
        args.extend(["--comm".to_string(), c.to_string()]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Agent::start_in_its_default_mode(&args)
}

/// The capture's diagnosis: the malloc finding with the Workers' JavaScript function, the
/// holders, a page Chromium opens and pprof files `go tool pprof` reads.
fn check_diagnosis(capture: &Path, pid: u32) {
    for f in [
        "report.ndjson",
        "report.html",
        "profile.pb.gz",
        "before.pb.gz",
    ] {
        assert!(
            capture.join(f).is_file(),
            "{} has no {f}",
            capture.display()
        );
    }
    let s = summary(capture);
    let p = (s["processes"].as_array().unwrap().iter())
        .find(|p| p["pid"] == pid)
        .unwrap_or_else(|| panic!("the capture profiles {pid}: {s}"));
    let findings = s["findings"].as_array().unwrap();
    let ids: Vec<&str> = findings.iter().filter_map(|f| f["id"].as_str()).collect();
    let threshold = (findings.iter())
        .find(|f| f["id"] == "mmap-threshold" && f["pid"] == pid)
        .unwrap_or_else(|| panic!("the malloc finding is there: {ids:?}"));
    let named = threshold["evidence"]["js_functions"].as_array().unwrap();
    assert!(
        named
            .iter()
            .any(|f| f.as_str().unwrap().starts_with("readChunks")),
        "the finding names the Workers' function: {threshold}"
    );
    // Who made whom wait: the holders, by code where their stacks were taken.
    let holders = p["holder_functions"].as_array().map_or(0, Vec::len);
    let blockers = p["blockers"].as_array().map_or(0, Vec::len);
    assert!(holders + blockers > 0, "the holders are named: {p}");
    eprintln!(
        "capture {}: findings {ids:?}, {holders} holder functions, {blockers} blockers",
        capture.display()
    );
    if let Some(go) = installed_or_skip(go_bin(), "go (Debian's golang-go)") {
        let file = capture.join("profile.pb.gz");
        assert!(top_total(&go, "contentions", file.to_str().unwrap()) > 0);
        let before = capture.join("before.pb.gz");
        assert!(
            top_total(&go, "contentions", before.to_str().unwrap()) > 0,
            "the window before the trigger"
        );
    }
    if let Some(dom) = rendered_dom(&capture.join("report.html"), None) {
        assert!(
            dom.contains("data-finding=\"mmap-threshold\""),
            "the page shows the finding"
        );
    }
}

#[test]
fn a_contended_process_is_captured_once_with_its_diagnosis_and_its_cooldown_holds() {
    let Some((dir, node, chunk)) = setup() else {
        return;
    };
    let root = dir.path().join("captures");
    let mut busy = phases(&node, &chunk);
    let quiet = phases(&node, &chunk);
    // A cooldown that ends within the test, long enough to hold through the first capture
    // and a second phase on a slower host (scaled by the speed factor).
    let cooldown = integration_tests::scaled(Duration::from_secs(40)).as_secs();
    let agent = agent(&root, &[busy.pid, quiet.pid], &cooldown.to_string(), &[]);
    // Quiet first: several windows of it give no capture.
    std::thread::sleep(Duration::from_secs(8));
    assert_eq!(escalations(&agent, "captured"), 0);
    assert!(
        fs::read_dir(&root).unwrap().next().is_none(),
        "nothing captured while quiet"
    );

    let began = go(&mut busy);
    wait_escalations(&agent, "captured", 1);
    let first = captures_of(&root, busy.pid);
    assert_eq!(first.len(), 1, "{first:?}");
    let s = summary(&first[0]);
    assert!(
        s["start"].as_str().unwrap() >= began.as_str(),
        "captured in the contended phase: {} < {began}",
        s["start"]
    );

    // A second contended phase inside the cooldown: counted as held back, not captured. (It
    // starts at once: the first capture's diagnosis is checked at the end, as Chromium and
    // `go tool pprof` take many seconds on a slow host, which the cooldown is not scaled
    // for.)
    stop(&mut busy);
    // A window of quiet intervals and two more (scaled, as the cooldown is): below again.
    std::thread::sleep(integration_tests::scaled(Duration::from_secs(7)));
    go(&mut busy);
    wait_escalations(&agent, "cooldown", 1);
    assert_eq!(escalations(&agent, "captured"), 1);
    // Still contended when the cooldown ends: a second capture, after it.
    wait_escalations(&agent, "captured", 2);
    let both = captures_of(&root, busy.pid);
    assert_eq!(both.len(), 2, "{both:?}");
    let (a, b) = (summary(&both[0]), summary(&both[1]));
    let secs = |v: &Value| {
        let t = v.as_str().unwrap();
        // Seconds of the day are enough here: both captures are minutes apart at most.
        let hms = &t[11..19];
        let p: Vec<u64> = hms.split(':').map(|x| x.parse().unwrap()).collect();
        p[0] * 3600 + p[1] * 60 + p[2]
    };
    let apart = (secs(&b["start"]) + 86_400 - secs(&a["start"])) % 86_400;
    assert!(
        apart + 1 >= cooldown,
        "the second capture began {apart} s after the first"
    );
    stop(&mut busy);
    assert!(
        captures_of(&root, quiet.pid).is_empty(),
        "the quiet process is never captured"
    );
    agent.stop();
    check_diagnosis(&first[0], busy.pid);
    // Contended from its crossing to its end: the capture says the contention went on.
    check_verdict(&first[0], busy.pid, false);
}

/// Text as the page escapes it.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

/// A capture's verdict (`trigger`): why it was taken and whether the contention had
/// `passed` by the capture; the window's findings among its own, and its page beginning
/// with it.
fn check_verdict(capture: &Path, pid: u32, passed: bool) -> Value {
    let s = summary(capture);
    let t = &s["trigger"];
    assert_eq!(t["pid"], pid, "{t}");
    let share = t["share"].as_f64().unwrap();
    let threshold = t["threshold"].as_f64().unwrap();
    assert_eq!(threshold, AT.parse::<f64>().unwrap() / 100.0);
    assert!(share >= threshold, "it crossed: {t}");
    // Measured over a full window of the agent's intervals (a second each, give or take
    // one), on enough waits.
    let window: f64 = WINDOW.parse().unwrap();
    let span = t["window_s"].as_f64().unwrap();
    assert!((window - 1.5..=window + 1.5).contains(&span), "{t}");
    assert!(t["waits"].as_u64().unwrap() >= 20, "{t}");
    let (w, a) = (
        t["wait_ns"].as_f64().unwrap(),
        t["alive_ns"].as_f64().unwrap(),
    );
    assert!(
        (share - w / a).abs() < 1e-9,
        "the share is the wait over the time: {t}"
    );
    assert!(
        t["at"].as_str().unwrap() <= s["start"].as_str().unwrap(),
        "it crossed before the capture began: {t}"
    );
    // The window's samples: before.pb.gz is not empty, and the functions it names.
    assert!(t["sampled"].as_u64().unwrap() > 0, "{t}");
    assert!(!t["waiting"].as_array().unwrap().is_empty(), "{t}");
    // The capture's own share, as the agent measured the crossing, and its verdict.
    let during = t["capture"]["share"].as_f64().unwrap();
    assert_eq!(t["passed"], passed, "{during} during the capture: {t}");
    assert_eq!(during < threshold, passed);
    let verdict = t["verdict"].as_str().unwrap();
    let said = if passed {
        "the contention had passed: "
    } else {
        "the contention went on: "
    };
    assert!(verdict.starts_with(said), "{verdict}");
    // Every finding says its window; the crossing window's are there, first when the
    // contention had passed.
    let findings = s["findings"].as_array().unwrap();
    assert!(
        findings
            .iter()
            .all(|f| f["window"] == "capture" || f["window"] == "crossing"),
        "{findings:?}"
    );
    let crossing: Vec<&Value> = findings
        .iter()
        .filter(|f| f["window"] == "crossing")
        .collect();
    assert!(!crossing.is_empty(), "the window's findings: {findings:?}");
    assert_eq!(crossing.len(), t["findings"].as_array().unwrap().len());
    if passed {
        assert_eq!(findings[0]["window"], "crossing", "{findings:?}");
    }
    // The page says why first, then the findings; the trigger file is gone.
    let page = fs::read_to_string(capture.join("report.html")).unwrap();
    let (why, found) = (page.find(r#"id="trigger""#), page.find(r#"id="findings""#));
    assert!(why.is_some() && why < found, "the page begins with why");
    assert!(page.contains(&esc(verdict)), "the page says the verdict");
    assert!(page.contains(r#"data-window="crossing""#));
    assert!(!capture.join("trigger.json").exists());
    // `report` recomputes the findings with the window's.
    let text = integration_tests::run_ok([
        "report",
        capture.join("report.ndjson").to_str().unwrap(),
        "-f",
        "text",
    ]);
    assert!(text.starts_with("═══") && text.contains(verdict), "{text}");
    assert!(text.contains("in the window that crossed"), "{text}");
    eprintln!(
        "capture {}: {verdict}; waiting {}",
        capture.display(),
        t["waiting"][0]["function"]
    );
    t.clone()
}

/// A burst as a process starts does not take the host's one capture from a process that
/// stays contended: the bursting process is judged once the agent has measured it a full
/// window, by then behind the contended one's capture.
#[test]
fn a_start_up_burst_does_not_take_the_capture_from_steady_contention() {
    let Some((dir, node, chunk)) = setup() else {
        return;
    };
    let root = dir.path().join("captures");
    let agent = agent_of(&root, &[], &["mlp-steady", "mlp-burst"], "600", &[]);
    // Steady: contended from its start on.
    let mut steady = phases_named(&node, dir.path(), "mlp-steady", &chunk);
    go(&mut steady);
    // Halfway through the steady one's first window, a process whose Workers are
    // contended for half a second as it starts (without the rule, it crossed at its first
    // interval and took the capture).
    std::thread::sleep(Duration::from_millis(2500));
    let mut burst = phases_named(&node, dir.path(), "mlp-burst", &chunk);
    go(&mut burst);
    std::thread::sleep(Duration::from_millis(500));
    stop(&mut burst);
    wait_escalations(&agent, "captured", 1);
    // Its capture and a window more: the burst is not captured.
    std::thread::sleep(integration_tests::scaled(Duration::from_secs(8)));
    stop(&mut steady);
    agent.stop();
    let (s, b) = (
        captures_of(&root, steady.pid),
        captures_of(&root, burst.pid),
    );
    assert_eq!((s.len(), b.len()), (1, 0), "{s:?} {b:?}");
    check_verdict(&s[0], steady.pid, false);
}

/// A burst that does hold over a full window of its process's life is captured, and the
/// capture, which finds the process quiet, says the contention had passed and what it was.
#[test]
fn a_start_up_burst_that_holds_a_window_is_captured_with_its_verdict() {
    let Some((dir, node, chunk)) = setup() else {
        return;
    };
    let root = dir.path().join("captures");
    let agent = agent_of(&root, &[], &["mlp-startup"], "600", &[]);
    let mut w = phases_named(&node, dir.path(), "mlp-startup", &chunk);
    go(&mut w);
    // Contended for its first three seconds (over half its first window), then quiet.
    std::thread::sleep(Duration::from_secs(3));
    stop(&mut w);
    wait_escalations(&agent, "captured", 1);
    agent.stop();
    let c = captures_of(&root, w.pid);
    assert_eq!(c.len(), 1, "{c:?}");
    let t = check_verdict(&c[0], w.pid, true);
    // What crossed: the Workers' reads (their writes waited behind each other's).
    let named = |list: &Value| {
        list.as_array()
            .unwrap()
            .iter()
            .any(|f| f["function"].as_str().unwrap_or("").contains("readChunks"))
    };
    assert!(named(&t["waiting"]) || named(&t["holding"]), "{t}");
    if let Some(go) = installed_or_skip(go_bin(), "go (Debian's golang-go)") {
        let before = c[0].join("before.pb.gz");
        assert!(top_total(&go, "contentions", before.to_str().unwrap()) > 0);
    }
    if let Some(dom) = rendered_dom(&c[0].join("report.html"), None) {
        assert!(
            dom.contains("Why this capture was taken"),
            "the page opens with its verdict"
        );
    }
}

#[test]
fn processes_crossing_at_once_are_captured_in_turn_within_the_selection_and_the_budget() {
    let Some((dir, node, chunk)) = setup() else {
        return;
    };
    let root = dir.path().join("captures");
    fs::create_dir(&root).unwrap();
    // Two older captures of 700 KiB each, and something that is not a capture.
    for (i, name) in ["20200101T000000Z-node-1", "20200101T000001Z-node-2"]
        .iter()
        .enumerate()
    {
        let d = root.join(name);
        fs::create_dir(&d).unwrap();
        fs::write(d.join("report.html"), vec![i as u8; 700 << 10]).unwrap();
    }
    fs::write(root.join("notes"), b"kept").unwrap();
    let mut a = phases(&node, &chunk);
    let mut b = phases(&node, &chunk);
    // Contended too, but not selected: never captured.
    let mut outside = phases(&node, &chunk);
    let agent = agent(
        &root,
        &[a.pid, b.pid],
        "600",
        &["--escalate-budget-mib", "2"],
    );
    // The dashboard's annotation of captures, on what Prometheus scraped.
    let prom = installed_or_skip(prometheus_bin(), "prometheus (Debian's package)")
        .map(|bin| Prometheus::start(&bin, agent.port));
    go(&mut a);
    go(&mut b);
    go(&mut outside);
    if let Some(prom) = &prom {
        let (name, expr) = (dashboard_annotations().into_iter())
            .find(|(n, _)| n.starts_with("Escalations"))
            .expect("the dashboard annotates captures");
        prom.wait_for(&expr, Duration::from_secs(120), |v| v == 1.0, &name);
    }
    wait_escalations(&agent, "captured", 2);
    let (ca, cb) = (captures_of(&root, a.pid), captures_of(&root, b.pid));
    assert_eq!((ca.len(), cb.len()), (1, 1), "{ca:?} {cb:?}");
    let (sa, sb) = (summary(&ca[0]), summary(&cb[0]));
    let (first, second) = if sa["start"].as_str() < sb["start"].as_str() {
        (&sa, &sb)
    } else {
        (&sb, &sa)
    };
    assert!(
        second["start"].as_str().unwrap() >= first["end"].as_str().unwrap(),
        "one capture at a time: {} began before {} ended",
        second["start"],
        first["end"]
    );
    assert!(
        captures_of(&root, outside.pid).is_empty(),
        "a process outside the selection"
    );
    // The budget: 2 MiB, so the oldest capture went first; what is not a capture stays.
    let held: u64 = fs::read_dir(&root)
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .flat_map(|e| fs::read_dir(e.path()).unwrap().flatten())
        .map(|f| f.metadata().unwrap().len())
        .sum();
    assert!(held <= 2 << 20, "{held} bytes held");
    assert!(
        !root.join("20200101T000000Z-node-1").exists(),
        "the oldest went first"
    );
    assert!(root.join("notes").exists());
    for w in [&mut a, &mut b, &mut outside] {
        stop(w);
    }
    agent.stop();
}

#[test]
fn a_full_disk_loses_the_capture_with_its_reason_not_the_agent() {
    let Some((dir, node, chunk)) = setup() else {
        return;
    };
    // A file system of 256 KiB: room for the directory, not for a capture.
    let root = dir.path().join("small");
    fs::create_dir(&root).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=256k", "tmpfs"])
        .arg(&root)
        .status()
        .expect("run mount");
    assert!(mounted.success(), "mount a tmpfs");
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(root.clone());
    let mut w = phases(&node, &chunk);
    let agent = agent(&root, &[w.pid], "600", &[]);
    go(&mut w);
    wait_escalations(&agent, "no_space", 1);
    assert!(
        captures_of(&root, w.pid).is_empty(),
        "a capture that could not be written is removed"
    );
    // The agent goes on serving its metrics.
    assert!(
        agent
            .metrics()
            .contains("mmaplock_escalation_in_progress 0")
    );
    stop(&mut w);
    agent.stop();
}

/// Waits until a capture is running.
fn wait_capturing(agent: &Agent) {
    wait_until(Duration::from_secs(240), Duration::from_millis(250), || {
        let m = agent.metrics();
        match m
            .lines()
            .any(|l| l.starts_with("mmaplock_escalation_in_progress{"))
        {
            true => Ok(()),
            false => Err("no capture running".to_string()),
        }
    });
}

/// Waits until the capture of `pid` has written an interval line of it.
fn wait_profiled(root: &Path, pid: u32) {
    wait_until(Duration::from_secs(120), Duration::from_millis(250), || {
        let lines = (captures_of(root, pid).first())
            .and_then(|d| fs::read_to_string(d.join("report.ndjson")).ok())
            .unwrap_or_default();
        match lines.contains(&format!("\"pid\":{pid},")) {
            true => Ok(()),
            false => Err(format!("no interval line of {pid} yet")),
        }
    });
}

#[test]
fn a_capture_ends_complete_when_its_process_exits_or_the_agent_stops() {
    let Some((dir, node, chunk)) = setup() else {
        return;
    };
    let root = dir.path().join("captures");
    let mut a = phases(&node, &chunk);
    let mut b = phases(&node, &chunk);
    let (pa, pb) = (a.pid, b.pid);
    // Captures far longer than the test: they end by the process's exit, then the agent's.
    let agent = agent(&root, &[pa, pb], "600", &["--escalate-for", "600"]);
    go(&mut a);
    wait_capturing(&agent);
    // The capture has profiled it for an interval: then it exits.
    wait_profiled(&root, pa);
    a.send("exit");
    a.wait();
    wait_escalations(&agent, "captured", 1);
    let ca = captures_of(&root, pa);
    assert_eq!(ca.len(), 1, "{ca:?}");
    let s = summary(&ca[0]);
    assert!(
        s["duration_s"].as_f64().unwrap() < 600.0,
        "{}",
        s["duration_s"]
    );
    assert!(
        s["processes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["pid"] == pa)
    );

    go(&mut b);
    wait_capturing(&agent);
    wait_profiled(&root, pb);
    // SIGTERM to the agent mid-capture: the capture ends with its summary, then the agent.
    agent.stop();
    let cb = captures_of(&root, pb);
    assert_eq!(cb.len(), 1, "{cb:?}");
    let s = summary(&cb[0]);
    assert!(
        s["processes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["pid"] == pb)
    );
    stop(&mut b);
}

/// The capture's profiler is given the process's start time: a pid that has become another
/// process's since the agent decided is refused (exit 2, one line), not profiled. Checked
/// before anything is attached.
#[test]
fn a_capture_refuses_a_pid_that_is_another_process_now() {
    let mut sleeper = Command::new("sleep").arg("60").spawn().unwrap();
    let pid = sleeper.id().to_string();
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Field 22, counted after the command name's closing parenthesis.
    let ticks: u64 = stat
        .rsplit_once(") ")
        .unwrap()
        .1
        .split(' ')
        .nth(19)
        .unwrap()
        .parse()
        .unwrap();
    let other = (ticks + 1).to_string();
    let out =
        integration_tests::run_profiler(&["--pid", &pid, "--pid-start-ticks", &other, "-d", "1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("is not the process it was") && err.trim().lines().count() == 1,
        "{err}"
    );
    let _ = sleeper.kill();
    let _ = sleeper.wait();
}
