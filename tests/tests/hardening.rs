//! ROOT-ONLY: issue 20, hostile files and connections, full disks, signals at any moment and
//! wrong values. Perf maps planted for someone else's node, linked, huge, a FIFO; signals
//! 10 to 400 ms into start-up; a 64 KiB tmpfs that fills under the profiler and the agent; an
//! agent restarted on a file cut mid-line; every refused value with its exit code.

use std::{
    fs,
    io::{BufRead, BufReader},
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc::{self, RecvTimeoutError},
    time::{Duration, Instant},
};

use integration_tests::{
    Profiler, Workload, bpf_objects, bpf_test, churn_bin, fixture, process, profiler_bin,
    require_root_and_tracepoints, run_profiler, scrape::metrics as scrape, wait_until,
};
use serde_json::Value;

/// A child killed on drop, its stderr lines on a channel (and echoed).
struct Running {
    child: Child,
    stderr: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Running {
    fn spawn(cmd: &mut Command) -> Self {
        let mut child = cmd
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        let err = child.stderr.take().unwrap();
        let (tx, stderr) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("child: {l}");
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Running {
            child,
            stderr,
            seen: Vec::new(),
        }
    }

    /// Waits for a stderr line containing `needle` that the child prints or else ends (its
    /// stderr then closes): its start-up's. No bound. Returns the line.
    fn wait_for(&mut self, needle: &str) -> String {
        self.line(needle, None)
    }

    /// Waits for a stderr line containing `needle` that a broken product might never print
    /// while it runs on (a warning, a recovery): fails once `within` on the reference machine
    /// has passed, scaled by the measured speed factor. Returns the line.
    fn expect_within(&mut self, needle: &str, within: Duration) -> String {
        self.line(needle, Some(integration_tests::scaled(within)))
    }

    /// A line already read that contains `needle` (said before one awaited).
    fn said(&self, needle: &str) -> &str {
        self.seen
            .iter()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no {needle:?} on stderr: {:?}", self.seen))
    }

    fn line(&mut self, needle: &str, within: Option<Duration>) -> String {
        if let Some(l) = self.seen.iter().find(|l| l.contains(needle)) {
            return l.clone();
        }
        let deadline = within.map(|w| Instant::now() + w);
        loop {
            let got = match deadline {
                None => self
                    .stderr
                    .recv()
                    .map_err(|_| "its stderr closed".to_string()),
                Some(d) => self
                    .stderr
                    .recv_timeout(d.saturating_duration_since(Instant::now()))
                    .map_err(|e| match e {
                        RecvTimeoutError::Timeout => format!(
                            "not within {:?} (speed factor {:.2})",
                            within.unwrap(),
                            integration_tests::speed::factor()
                        ),
                        RecvTimeoutError::Disconnected => "its stderr closed".to_string(),
                    }),
            };
            match got {
                Ok(l) => {
                    self.seen.push(l.clone());
                    if l.contains(needle) {
                        return l;
                    }
                }
                Err(why) => panic!(
                    "no {needle:?} on stderr: {why}; exit {:?}; it said {:?}",
                    self.child.try_wait(),
                    self.seen
                ),
            }
        }
    }

    fn signal(&self, sig: i32) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    /// Waits until the child has ended, leaving it unreaped: its /proc entry, a zombie's,
    /// still tells what it did in its life.
    fn wait_ended_unreaped(&self) {
        // SAFETY: a siginfo_t of our own for waitid to fill.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        loop {
            // SAFETY: waiting (WNOWAIT: not reaping) for our own child.
            let r = unsafe {
                libc::waitid(
                    libc::P_PID,
                    self.child.id(),
                    &mut info,
                    libc::WEXITED | libc::WNOWAIT,
                )
            };
            if r == 0 {
                return;
            }
            let e = std::io::Error::last_os_error();
            assert_eq!(e.kind(), std::io::ErrorKind::Interrupted, "waitid: {e}");
        }
    }

    /// Waits for the end, which comes by itself (the child was signalled or its target
    /// ended): no bound. Returns the exit code and every stderr line, all of them: the
    /// reader's channel closes when the pipe does, at the exit.
    fn finish(mut self) -> (Option<i32>, Vec<String>) {
        let status = self.child.wait().expect("wait for the child");
        self.seen.extend(self.stderr.iter());
        (status.code(), std::mem::take(&mut self.seen))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Files removed on drop.
struct Planted(Vec<PathBuf>);

impl Drop for Planted {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = fs::remove_file(p);
        }
    }
}

/// The whole lines (each ended by a newline: a line being written is not one yet) of a
/// JSON-lines file that a running child writes, parsed; none while it does not exist.
fn whole_lines(path: &Path) -> Vec<Value> {
    let text = fs::read_to_string(path).unwrap_or_default();
    text.split_inclusive('\n')
        .filter(|l| l.ends_with('\n'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn chown_nobody(p: &Path) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path; lchown changes no memory of ours.
    assert_eq!(unsafe { libc::lchown(c.as_ptr(), 65534, 65534) }, 0);
}

fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    let r = unsafe { libc::mkfifo(c.as_ptr(), 0o644) };
    assert_eq!(
        r,
        0,
        "mkfifo {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
}

#[test]
fn perf_maps_planted_linked_huge_or_a_fifo_are_ignored_with_one_warning_and_sigint_ends_promptly() {
    if !require_root_and_tracepoints() {
        return;
    }
    // Four node processes whose compiled function takes the lock for write, none writing a
    // perf map of its own: what is at /tmp/perf-PID.map is someone else's.
    let mut nodes: Vec<Workload> = (0..4)
        .map(|_| {
            let mut cmd = Command::new("node");
            cmd.env("MALLOC_MMAP_THRESHOLD_", "131072")
                .arg(fixture("jitloop.js"));
            Workload::spawn(cmd)
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let map = |w: &Workload| PathBuf::from(format!("/tmp/perf-{}.map", w.pid));
    let maps: Vec<PathBuf> = nodes.iter().map(map).collect();
    let _planted = Planted(maps.clone());
    // A map left by an earlier process of the same pid (V8 leaves its perf map when it exits)
    // is not part of this scenario.
    for m in &maps {
        let _ = fs::remove_file(m);
    }
    // Covers every address: if read, every JIT frame would be `planted`.
    let lie = "0 7fffffffffff JS:*planted /evil.js:1:1\n";
    // Another user's file (nobody's; the node runs as root).
    fs::write(&maps[0], lie).unwrap();
    chown_nobody(&maps[0]);
    // A link to a file of root's.
    let real = dir.path().join("real.map");
    fs::write(&real, lie).unwrap();
    symlink(&real, &maps[1]).unwrap();
    // Root's own, sparse, 4 GiB (the node runs as root: the owner passes, the size not).
    fs::File::create(&maps[2])
        .unwrap()
        .set_len(4 << 30)
        .unwrap();
    // A FIFO: a reader that opened it would wait forever.
    mkfifo(&maps[3]);
    let pids: Vec<String> = nodes.iter().map(|w| w.pid.to_string()).collect();
    let report = dir.path().join("run.json");
    let mut args = vec!["-f", "json", "--stack-sample", "4", "-i", "0.5"];
    for p in &pids {
        args.extend(["-p", p.as_str()]);
    }
    let mut prof = Running::spawn(
        Command::new(profiler_bin())
            .args(&args)
            .arg("-o")
            .arg(&report),
    );
    prof.wait_for("attached in");
    for n in &mut nodes {
        n.go();
    }
    // Each map is looked at when a sampled stack first goes through JIT code. A profiler that
    // blocked in the FIFO, or never looked, would not say so: a bound (scaled).
    for (path, why) in maps.iter().zip([
        "owned by uid 65534, neither the process's user (uid 0) nor root",
        "symbolic link",
        "4294967296 bytes, more than the",
        "not a regular file but a FIFO",
    ]) {
        let said = prof.expect_within(
            &format!("ignoring {}", path.display()),
            Duration::from_secs(60),
        );
        assert!(said.contains(why), "{said}");
    }
    // Looked at again and again while the run goes on: still said once. The run goes on for
    // four more of its own 0.5 s intervals (its clock: the scenario, not a bound), every node
    // writing in each, so its stacks are sampled through JIT code and its map looked at again
    // (at most every 250 ms). A run that wrote no more intervals: a bound (wait_until scales).
    let node_pids: Vec<u32> = nodes.iter().map(|w| w.pid).collect();
    let before = whole_lines(&report).len();
    wait_until(Duration::from_secs(30), Duration::from_millis(100), || {
        let busy = whole_lines(&report)
            .iter()
            .skip(before)
            .filter(|l| l["type"] == "interval")
            .filter(|l| {
                node_pids.iter().all(|&pid| {
                    process(l, pid).is_some_and(|p| p["write"]["count"].as_u64() > Some(0))
                })
            })
            .count();
        match busy {
            4.. => Ok(()),
            n => Err(format!(
                "{n} intervals with every node writing since the warnings"
            )),
        }
    });
    prof.signal(libc::SIGINT);
    // It ends after SIGINT: no bound on when (a hang is the per-test limit's).
    prof.wait_ended_unreaped();
    // Promptly, told by what was read, not by time: the old reader spent minutes reading a
    // 2 GB map, deaf to signals. In its whole life, start-up to exit, the profiler read (with
    // read(2) and the like: rchar, which counts a sparse file's holes) less than a quarter of
    // the planted 4 GiB map: it never read that map. (It reads about 23 MB here.)
    let rchar = fs::read_to_string(format!("/proc/{}/io", prof.child.id()))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("rchar: ")?.parse::<u64>().ok())
        .expect("rchar");
    assert!(rchar < 1 << 30, "the profiler read {rchar} bytes");
    let (code, stderr) = prof.finish();
    assert_eq!(code, Some(0), "{stderr:?}");
    let text = fs::read_to_string(&report).unwrap();
    assert!(!text.contains("planted"), "a planted name was used");
    let summary: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(summary["type"], "summary");
    assert_eq!(summary["schema_version"], 1);
    for (w, path) in nodes.iter().zip(&maps) {
        let p = process(&summary, w.pid).expect("every node is in the summary");
        assert!(p["write"]["count"].as_u64().unwrap() > 0, "{p}");
        let said = stderr
            .iter()
            .filter(|l| l.contains(&format!("ignoring {}", path.display())))
            .count();
        assert_eq!(said, 1, "one warning for {}: {stderr:?}", path.display());
    }
}

#[test]
fn a_signal_at_any_moment_of_start_up_ends_the_run_cleanly_and_leaves_no_program() {
    if !require_root_and_tracepoints() {
        return;
    }
    // Our programs, by name: those a running profiler holds.
    let prof = Profiler::start(&["--comm", "mlp-nothing-xyz", "-i", "0"]);
    let ours = bpf_objects::names_held_by(prof.pid());
    prof.signal(libc::SIGINT);
    assert!(prof.finish().status.success());
    assert!(ours.len() >= 4, "the profiler's programs: {ours:?}");
    let dir = tempfile::tempdir().unwrap();
    for (i, ms) in [10u64, 50, 100, 200, 400].into_iter().enumerate() {
        let sig = [libc::SIGINT, libc::SIGTERM][i % 2];
        let out = dir.path().join(format!("run-{ms}.json"));
        let run = Running::spawn(
            Command::new(profiler_bin())
                .args(["-f", "json", "-i", "0.1", "--comm", "mlp-nothing-xyz", "-o"])
                .arg(&out),
        );
        // Start-up counts from main's first instruction, where the handler goes in (exec and
        // the dynamic loader come before it: the default disposition, nothing written yet).
        caught_by(run.child.id(), sig);
        // The moment of the signal, the scenario's, not a bound: start-up takes longer on a
        // slower host, so the moments are scaled to fall in the same parts of it.
        std::thread::sleep(integration_tests::scaled(Duration::from_millis(ms)));
        run.signal(sig);
        // It ends after the signal: no bound.
        let (code, stderr) = run.finish();
        assert_eq!(
            code,
            Some(0),
            "signal {sig} at {ms} ms (scaled): {stderr:?}"
        );
        let text = fs::read_to_string(&out).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        let last = lines
            .last()
            .unwrap_or_else(|| panic!("no summary at {ms} ms"));
        assert_eq!(last["type"], "summary", "at {ms} ms");
        assert_eq!(last["schema_version"], 1);
    }
    // The kernel's freeing of what the runs released: 5 s on the reference machine, scaled
    // by `orphans`.
    let left = bpf_objects::orphans(&ours, Duration::from_secs(5));
    assert!(left.is_empty(), "programs left in the kernel: {left:?}");
}

/// Waits until process `pid` catches `sig` (`SigCgt` in its status); a profiler that never
/// installs its handler would not end the wait: a bound, scaled by `wait_until`.
fn caught_by(pid: u32, sig: i32) {
    wait_until(Duration::from_secs(30), Duration::from_millis(1), || {
        let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let caught = status
            .lines()
            .find_map(|l| l.strip_prefix("SigCgt:"))
            .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
            .unwrap_or(0);
        match caught & (1 << (sig - 1)) {
            0 => Err(format!("{pid} never caught signal {sig}")),
            _ => Ok(()),
        }
    });
}

/// A tmpfs of `size`, unmounted on drop.
struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    fn new(size: &str) -> Tmpfs {
        let d = tempfile::tempdir().unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(d.path())
            .status()
            .unwrap()
            .success();
        assert!(ok, "mount a tmpfs");
        Tmpfs(d)
    }

    fn path(&self) -> &Path {
        self.0.path()
    }

    /// Fills it up but `room` bytes (a file named filler).
    fn fill(&self, room: u64) {
        let free = {
            let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
            let c = std::ffi::CString::new(self.path().as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: a NUL-terminated path and a statvfs to fill.
            assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut s) }, 0);
            s.f_bavail * s.f_frsize
        };
        let n = free.saturating_sub(room) as usize;
        let _ = fs::write(self.path().join("filler"), vec![b'x'; n]);
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.0.path()).status();
    }
}

/// `mmap-churn T N 65536 - LINGER`: does its work on "go", says "done", then lingers (its
/// threads, and the process, alive: a profiler of its pid runs on for the test's next steps);
/// killed on drop.
struct Churn {
    child: Child,
    stdin: Option<std::process::ChildStdin>,
    lines: mpsc::Receiver<String>,
    pid: u32,
}

impl Churn {
    fn start(t: u32, n: u32) -> Churn {
        let mut child = Command::new(churn_bin())
            .args([
                t.to_string(),
                n.to_string(),
                "65536".into(),
                "-".into(),
                // Long past the few steps a test takes after "done" on the reference machine
                // (a bound on them, so scaled).
                integration_tests::scaled(Duration::from_secs(120))
                    .as_secs_f64()
                    .to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        // It says "ready" or ends (the channel then closes): no bound.
        let ready = lines.recv().expect("mmap-churn ended before it was ready");
        assert!(ready.starts_with("ready"), "{ready}");
        Churn {
            pid: child.id(),
            stdin: child.stdin.take(),
            child,
            lines,
        }
    }

    fn go(&mut self) {
        use std::io::Write as _;
        self.stdin.take().unwrap().write_all(b"go\n").unwrap();
    }

    /// Its work is finite: it says "done" or ends (the channel then closes). No bound.
    fn wait_done(&self) {
        let l = self
            .lines
            .recv()
            .expect("mmap-churn ended before it was done");
        assert_eq!(l, "done");
    }
}

impl Drop for Churn {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn mmap_writes(report: &Value, pid: u32) -> u64 {
    integration_tests::cause_stats(process(report, pid).expect("the process"), "mmap")
        .map_or(0, |s| s["count"].as_u64().unwrap())
}

#[test]
fn a_full_disk_is_said_once_the_run_goes_on_and_the_summary_is_exact() {
    if !require_root_and_tracepoints() {
        return;
    }
    let fs64 = Tmpfs::new("64k");
    let out = fs64.path().join("run.json");
    let (t, n) = (2u32, 20_000u32);
    let mut w = Churn::start(t, n);
    // Room for about one interval line.
    fs64.fill(4096);
    let mut prof = Running::spawn(
        Command::new(profiler_bin())
            .args(["-f", "json", "-i", "0.1", "-p", &w.pid.to_string(), "-o"])
            .arg(&out),
    );
    prof.wait_for("attached in");
    w.go();
    // A profiler that never noticed would run on: a bound (scaled), as for every such line.
    let said = prof.expect_within("cannot write", Duration::from_secs(60));
    assert!(
        said.contains(&out.display().to_string()) && said.contains("No space left"),
        "{said}"
    );
    w.wait_done();
    // Room again: the next reports and the summary are written.
    fs::remove_file(fs64.path().join("filler")).unwrap();
    prof.expect_within("is written again", Duration::from_secs(30));
    prof.signal(libc::SIGINT);
    let (code, stderr) = prof.finish();
    assert_eq!(code, Some(0), "{stderr:?}");
    let failures = stderr.iter().filter(|l| l.contains("cannot write")).count();
    assert_eq!(failures, 1, "said once: {stderr:?}");
    // Whole lines only, the summary last, its totals exact although intervals were lost.
    let text = fs::read_to_string(&out).unwrap();
    assert!(text.ends_with('\n'));
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let summary = lines.last().unwrap();
    assert_eq!(summary["type"], "summary");
    assert_eq!(mmap_writes(summary, w.pid), u64::from(t * n));
    let in_intervals: u64 = lines[..lines.len() - 1]
        .iter()
        .filter(|l| process(l, w.pid).is_some())
        .map(|l| mmap_writes(l, w.pid))
        .sum();
    assert!(
        in_intervals < u64::from(t * n),
        "some intervals could not be written: {in_intervals}"
    );
}

/// The agent's port, from its "serving http://ADDR:PORT/metrics" line.
fn serving_port(line: &str) -> u16 {
    let url = line.rsplit(' ').next().unwrap();
    let port = url.rsplit(':').next().unwrap().trim_end_matches("/metrics");
    port.parse().unwrap_or_else(|_| panic!("{line}"))
}

#[test]
fn the_agent_serves_metrics_on_a_full_disk_and_never_appends_after_a_partial_line() {
    if !require_root_and_tracepoints() {
        return;
    }
    let fs64 = Tmpfs::new("64k");
    fs64.fill(0);
    let out = fs64.path().join("agent.jsonl");
    let w = Churn::start(1, 10);
    let mut agent = Running::spawn(
        Command::new(profiler_bin())
            .args(["agent", "--listen", "127.0.0.1:0", "-i", "0.1"])
            .args(["--pid", &w.pid.to_string(), "-o"])
            .arg(&out),
    );
    let port = serving_port(&agent.wait_for("serving"));
    agent.expect_within("cannot write", Duration::from_secs(30));
    for _ in 0..3 {
        assert!(scrape(port).contains("mmaplock_tracked_processes 1"));
        // About three of the agent's own 0.1 s intervals (wall time on any host: the
        // scenario, not a bound), each one more failed write, between the pages.
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(agent.child.try_wait().unwrap().is_none(), "the agent lives");
    agent.signal(libc::SIGTERM);
    let (code, _) = agent.finish();
    assert_eq!(code, Some(0));

    // A file cut mid-line (a crash, a full disk): the restarted agent appends after the last
    // whole line, and `report` accepts the file.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("agent.jsonl");
    // The agent on `file` until it has written `lines` whole lines there (one an interval; an
    // agent that wrote none would run on: a bound, scaled by wait_until), then SIGINT.
    let run = |file: &Path, lines: usize| {
        let mut a = Running::spawn(
            Command::new(profiler_bin())
                .args(["agent", "--listen", "127.0.0.1:0", "-i", "0.1"])
                .args(["--pid", &w.pid.to_string(), "-o"])
                .arg(file),
        );
        a.wait_for("serving");
        wait_until(
            Duration::from_secs(30),
            Duration::from_millis(50),
            || match whole_lines(file).len() {
                n if n >= lines => Ok(()),
                n => Err(format!("{n} whole lines in {}", file.display())),
            },
        );
        a.signal(libc::SIGINT);
        a.finish()
    };
    assert_eq!(run(&file, 2).0, Some(0));
    let whole = fs::read_to_string(&file).unwrap();
    assert!(whole.lines().count() >= 2);
    fs::write(
        &file,
        format!("{whole}{{\"type\":\"interval\",\"schema_ver"),
    )
    .unwrap();
    // One interval more, appended after the last whole line.
    let (code, stderr) = run(&file, whole.lines().count() + 1);
    assert_eq!(code, Some(0));
    assert!(
        stderr.iter().any(|l| l.contains("partial line")),
        "{stderr:?}"
    );
    let text = fs::read_to_string(&file).unwrap();
    assert!(text.starts_with(&whole), "the whole lines are kept");
    for l in text.lines() {
        serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("{e}: {l}"));
    }
    let html = dir.path().join("agent.html");
    let r = run_profiler(&[
        "report",
        file.to_str().unwrap(),
        "--html",
        html.to_str().unwrap(),
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
}

#[test]
fn existing_outputs_survive_a_run_that_fails_before_attaching() {
    let Some(dir) = bpf_test() else { return };
    let files: Vec<PathBuf> = ["run.json", "run.html", "run.folded"]
        .iter()
        .map(|f| dir.path().join(f))
        .collect();
    for f in &files {
        fs::write(f, "an earlier run\n").unwrap();
    }
    let [o, html, stacks] = [0, 1, 2].map(|i| files[i].to_str().unwrap());
    // Nine --comm are one too many: refused after the outputs were opened.
    let mut args = vec!["-o", o, "--html", html, "--stacks", stacks];
    for _ in 0..9 {
        args.extend(["--comm", "x"]);
    }
    let r = run_profiler(&args);
    assert_eq!(
        r.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&r.stderr)
    );
    for f in &files {
        assert_eq!(
            fs::read_to_string(f).unwrap(),
            "an earlier run\n",
            "{}",
            f.display()
        );
    }
    // A file created for such a run is removed again; an unwritable one fails at once.
    let new = dir.path().join("new.json");
    args[1] = new.to_str().unwrap();
    assert_eq!(run_profiler(&args).status.code(), Some(2));
    assert!(!new.exists());
    let r = run_profiler(&["-o", "/no/such/dir/x.json", "-d", "1"]);
    assert_eq!(r.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&r.stderr).contains("cannot write /no/such/dir/x.json"));
}

/// A kernel thread's pid (kthreadd is 2 in the initial pid namespace).
fn kernel_thread() -> u32 {
    (2..100_000)
        .find(|pid| {
            fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                let rest = &s[s.rfind(')').unwrap() + 1..];
                let flags: u64 = rest.split_whitespace().nth(6).unwrap().parse().unwrap();
                flags & 0x0020_0000 != 0
            })
        })
        .expect("a kernel thread")
}

#[test]
fn every_bad_value_is_refused_alike_by_the_profiler_and_the_agent() {
    let dir = tempfile::tempdir().unwrap();
    let conf = |name: &str, text: &str| {
        let p = dir.path().join(name);
        fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    let long_comm = conf("long", "comm sixteen-bytes-xx\n");
    let relative = conf("relative", "# services\ncgroup system.slice/api.service\n");
    let kthread = kernel_thread().to_string();
    let kconf = conf("kthread", &format!("pid {kthread}\n"));
    let stacks = dir.path().join("stacks.folded");
    let s = stacks.to_str().unwrap();
    for (args, needle) in [
        (
            vec!["--max-threads", "0"],
            "invalid value '0' for '--max-threads <N>'",
        ),
        (
            vec!["agent", "--max-threads", "0"],
            "invalid value '0' for '--max-threads <N>'",
        ),
        (
            vec!["--comm", "sixteen-bytes-xx"],
            "is 16 bytes, longer than the 15 the kernel keeps",
        ),
        (vec!["agent", "--comm", "sixteen-bytes-xx"], "is 16 bytes"),
        (
            vec!["agent", "--config", &long_comm],
            "long:1: comm: \"sixteen-bytes-xx\" is 16 bytes",
        ),
        (
            vec!["agent", "--config", &relative],
            "relative:2: cgroup: \"system.slice/api.service\": a cgroup v2 path is absolute",
        ),
        (vec!["-i", "1e-400"], "too small to be a number of seconds"),
        (vec!["agent", "-i", "1e-400"], "too small"),
        (vec!["--pid", &kthread], "is a kernel thread"),
        (vec!["agent", "--pid", &kthread], "is a kernel thread"),
        (vec!["agent", "--config", &kconf], "is a kernel thread"),
        (vec!["compare", "before.json"], "not provided: <AFTER.json>"),
        (vec!["--children"], "not provided: --pid <PID>"),
        (
            vec!["--stacks", s, "--stack-sample", "0"],
            "--stack-sample 0 takes none",
        ),
    ] {
        let r = run_profiler(&args);
        let err = String::from_utf8_lossy(&r.stderr);
        assert_eq!(r.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: one line: {err}");
        assert!(
            err.starts_with("mmaplock-prof: ") && err.contains(needle),
            "{args:?}: {err}"
        );
        assert!(r.stdout.is_empty());
    }
    assert!(!stacks.exists());
}

#[test]
fn the_agent_says_its_real_port_warns_about_cgroup_paths_and_counts_each_selector() {
    if !require_root_and_tracepoints() {
        return;
    }
    let w = Churn::start(1, 10);
    let pid = w.pid.to_string();
    let mut agent = Running::spawn(Command::new(profiler_bin()).args([
        "agent",
        "--listen",
        "127.0.0.1:0",
        "-i",
        "0.2",
        "--pid",
        &pid,
        "--cgroup",
        "/sys/fs/cgroup/system.slice/mlp-test.service",
        "--cgroup",
        "/mlp-no-such-cgroup",
    ]));
    let line = agent.wait_for("serving");
    let port = serving_port(&line);
    assert_ne!(port, 0, "{line}");
    // Said before it serves (the selection is checked before the kernel is touched).
    let prefix = agent.said("mount point");
    assert!(
        prefix.ends_with("--cgroup /system.slice/mlp-test.service"),
        "{prefix}"
    );
    agent.said("--cgroup /mlp-no-such-cgroup: no such cgroup now");
    // Set at each reading (every 0.2 s); an agent that never set it would serve on without:
    // a bound, scaled by wait_until.
    let m = wait_until(Duration::from_secs(10), Duration::from_millis(200), || {
        let m = scrape(port);
        match m.contains("mmaplock_selector_matches") {
            true => Ok(m),
            false => Err(format!("no mmaplock_selector_matches:\n{m}")),
        }
    });
    assert!(
        m.contains(&format!(
            "mmaplock_selector_matches{{selector=\"pid {pid}\"}} 1"
        )),
        "{m}"
    );
    assert!(m.contains("mmaplock_selector_matches{selector=\"cgroup /mlp-no-such-cgroup\"} 0"));
}

/// `mmap-churn` run under the profiler with a kernel map too small for its threads: what is
/// lost is said on stderr while the run goes on.
#[test]
fn a_shortfall_is_said_on_stderr_when_it_first_happens() {
    if !require_root_and_tracepoints() {
        return;
    }
    let mut w = Churn::start(8, 2000);
    let mut prof = Running::spawn(
        Command::new(profiler_bin())
            .args([
                "-f",
                "json",
                "-i",
                "0.2",
                "--max-threads",
                "2",
                "-p",
                &w.pid.to_string(),
            ])
            .stdout(Stdio::null()),
    );
    prof.wait_for("attached in");
    w.go();
    let said = prof.expect_within("lost.map_full", Duration::from_secs(30));
    assert!(said.contains("raise --max-threads"), "{said}");
    prof.signal(libc::SIGINT);
    let (code, stderr) = prof.finish();
    assert_eq!(code, Some(0));
    assert_eq!(
        stderr
            .iter()
            .filter(|l| l.contains("lost.map_full"))
            .count(),
        1,
        "{stderr:?}"
    );
}
