//! ROOT-ONLY: a run of 1,000 short-lived processes (issue 34, "output and memory bounded by
//! what matters"): every write counted, the processes that did not wait materially grouped
//! by command with exact totals, the summary's JSON and the HTML page at most 5 MB each, the
//! profiler's peak memory at most 100 MB, few findings and a text report that says in one
//! line what it grouped.

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::Duration,
};

use integration_tests::{
    Profiler, bpf_test, churn_bin, profiler_bin, read_lines, run_ok, wait_until,
};
use serde_json::Value;

/// The helpers' command name.
const NAME: &str = "manyling";
/// How many are run, one after the other.
const RUNS: u64 = 1000;
/// mmap/munmap pairs each makes in its thread.
const PAIRS: u64 = 20;
const MB: u64 = 1 << 20;

/// A copy of the churn helper named [`NAME`]: its command name at exec.
fn helper(dir: &Path) -> std::path::PathBuf {
    let bin = dir.join(NAME);
    std::fs::copy(churn_bin(), &bin).expect("copy the helper");
    bin
}

/// A shell running the helper `runs` times, one after the other, each told to go at once.
/// One malloc arena: a thread's own arena would be aligned by a second munmap only when its
/// first mapping happens not to be (see tests/tests/agent.rs).
fn run_helpers(bin: &Path, runs: u64) -> Child {
    Command::new("sh")
        .args([
            "-c",
            "i=0; while [ $i -lt $1 ]; do echo go | \"$0\" 1 $2 65536 >/dev/null || exit 1; i=$((i+1)); done",
        ])
        .arg(bin)
        .arg(runs.to_string())
        .arg(PAIRS.to_string())
        .env("MALLOC_ARENA_MAX", "1")
        .stdin(Stdio::null())
        .spawn()
        .expect("start the shell")
}

/// Waits (bounded) for a child to exit successfully.
fn wait_ok(mut c: Child, within: Duration) {
    let status = wait_until(within, Duration::from_millis(200), || {
        c.try_wait()
            .expect("try_wait")
            .ok_or_else(|| format!("{} still running", c.id()))
    });
    assert!(status.success(), "{status:?}");
}

/// Every write of the helpers' processes in a summary's listed processes, and how many.
fn listed_writes(summary: &Value) -> (u64, u64) {
    let procs = summary["processes"].as_array().expect("processes");
    let writes = procs
        .iter()
        .map(|p| p["write"]["count"].as_u64().unwrap())
        .sum();
    (procs.len() as u64, writes)
}

/// The profiler, started by hand so that its peak memory can be read when it is reaped
/// (wait4's rusage), with its JSON in `json` and its page in `html`; killed on drop unless
/// stopped.
struct Run {
    child: Child,
    reaped: bool,
}

impl Run {
    fn start(json: &Path, html: &Path) -> Run {
        let mut child = Command::new(profiler_bin())
            .args(["--comm", NAME, "-f", "json", "-o"])
            .arg(json)
            .arg("--html")
            .arg(html)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start mmaplock-prof");
        let (tx, rx) = mpsc::channel();
        let stderr = child.stderr.take().expect("stderr");
        std::thread::spawn(move || {
            for l in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("mmaplock-prof: {l}");
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let run = Run {
            child,
            reaped: false,
        };
        // It attaches or ends (stderr then closes): no bound on how long attaching takes.
        let mut seen = Vec::new();
        loop {
            match rx.recv() {
                Ok(l) if l.contains("attached in") => break,
                Ok(l) => seen.push(l),
                Err(_) => panic!("mmaplock-prof did not attach: {seen:?}"),
            }
        }
        run
    }

    /// Stops it (SIGINT) and reaps it: its wait status and peak resident memory in bytes.
    fn stop(mut self) -> (i32, u64) {
        let pid = self.child.id() as i32;
        // SAFETY: signalling our own child, not yet reaped.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
        let (status, rusage) =
            wait_until(Duration::from_secs(120), Duration::from_millis(100), || {
                let mut status = 0;
                // SAFETY: rusage is plain data, for wait4 to fill.
                let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
                // SAFETY: reaping our own child, with valid pointers to fill.
                match unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut ru) } {
                    0 => Err("mmaplock-prof is still writing its summary".to_string()),
                    p if p == pid => Ok((status, ru)),
                    e => panic!("wait4: {e} {}", std::io::Error::last_os_error()),
                }
            });
        self.reaped = true;
        // ru_maxrss is in KiB.
        (status, rusage.ru_maxrss as u64 * 1024)
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        if !self.reaped {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[test]
fn a_thousand_short_processes_are_counted_grouped_and_bounded() {
    let Some(dir) = bpf_test() else { return };
    let bin = helper(dir.path());
    // The ground truth of one: its writes, alone under the profiler (its image's loading
    // included: the same every run, with one arena).
    let one = Profiler::start(&["--comm", NAME, "-i", "0"]);
    wait_ok(run_helpers(&bin, 1), Duration::from_secs(60));
    one.signal(libc::SIGINT);
    let one = one.finish_ok();
    let (n, each) = listed_writes(one.summary());
    assert_eq!(n, 1, "{}", one.summary());
    let mmaps: u64 = one.summary()["processes"][0]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["cause"] == "mmap")
        .map(|c| c["write"]["count"].as_u64().unwrap())
        .sum();
    assert!(
        mmaps > PAIRS,
        "its {PAIRS} mmaps and its start-up's: {mmaps}"
    );

    // A thousand of them.
    let (json, html) = (dir.path().join("run.json"), dir.path().join("run.html"));
    let run = Run::start(&json, &html);
    wait_ok(run_helpers(&bin, RUNS), Duration::from_secs(900));
    let (status, peak) = run.stop();
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{status}"
    );
    let lines = read_lines(&json);
    let summary = lines.last().expect("a summary");
    assert_eq!(summary["type"], "summary");
    let raw = std::fs::read_to_string(&json).unwrap();
    let summary_bytes = raw.lines().last().unwrap().len() as u64;
    let html_bytes = std::fs::metadata(&html).unwrap().len();
    let findings = summary["findings"].as_array().expect("findings");
    let text = run_ok([
        "report".as_ref(),
        json.as_os_str(),
        "-f".as_ref(),
        "text".as_ref(),
    ]);
    let minor = &summary["minor_processes"];
    let (listed, listed_w) = listed_writes(summary);
    eprintln!(
        "{RUNS} processes of {each} writes: summary {:.2} MB, page {:.2} MB, peak RSS {:.1} MB, \
         {} findings, text {} lines; {listed} listed ({listed_w} writes), grouped: {minor}",
        summary_bytes as f64 / MB as f64,
        html_bytes as f64 / MB as f64,
        peak as f64 / MB as f64,
        findings.len(),
        text.lines().count(),
    );

    // Every process and every write, the grouped ones' included.
    let skipped = summary["lost"]["skipped"].as_u64().unwrap_or(0);
    let grouped = minor["processes"]
        .as_u64()
        .expect("minor_processes.processes");
    assert_eq!(listed + grouped, RUNS, "{minor}");
    let total = listed_w + minor["writes"].as_u64().unwrap();
    // Where the kernel skipped programs (Linux 7.x), short by no more than it skipped.
    assert!(
        total <= RUNS * each && RUNS * each - total <= skipped,
        "{total} writes, {RUNS} x {each} made; {skipped} program runs skipped"
    );
    // Grouped by command, with exact totals.
    let by_comm = minor["by_comm"].as_array().unwrap();
    let sum = |k: &str| -> u64 { by_comm.iter().map(|c| c[k].as_u64().unwrap()).sum() };
    assert_eq!(sum("processes"), grouped, "{minor}");
    assert_eq!(sum("writes"), minor["writes"].as_u64().unwrap(), "{minor}");
    assert_eq!(
        sum("wait_ns"),
        minor["wait_ns"].as_u64().unwrap(),
        "{minor}"
    );
    assert!(by_comm.iter().all(|c| c["comm"] == NAME), "{minor}");
    // The interval lines partition the run: their writes add up to the summary's, and none
    // carries a process that took no lock in it.
    let intervals = &lines[..lines.len() - 1];
    let mut per_line = 0;
    for l in intervals {
        for p in l["processes"].as_array().unwrap() {
            let n = |s: &str| p[s]["count"].as_u64().unwrap_or(0);
            let failed = p["write"]["failed_trylocks"].as_u64().unwrap_or(0)
                + p["read"]["failed_trylocks"].as_u64().unwrap_or(0);
            assert!(
                n("write") + n("read") + n("downgrade") + failed > 0,
                "an idle process in {}: {p}",
                l["end"]
            );
            per_line += n("write");
        }
    }
    assert_eq!(
        per_line, total,
        "the interval lines' writes against the summary's"
    );

    // Bounded by what matters.
    assert!(summary_bytes <= 5 * MB, "{summary_bytes} bytes of summary");
    assert!(html_bytes <= 5 * MB, "{html_bytes} bytes of page");
    assert!(peak <= 100 * MB, "peak RSS {peak} bytes");
    assert!(findings.len() <= 5, "{} findings", findings.len());
    // The text: one line for the grouped processes, and a length that does not follow them.
    let line = format!("{grouped} processes ({NAME})");
    assert!(
        text.lines()
            .any(|l| l.contains(&line) && l.contains("none waited materially")),
        "no line of the grouped processes in:\n{text}"
    );
    assert!(text.lines().count() <= 1000, "{text}");
    // The page names them too, and the findings first.
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("none waited materially"), "the page's line");
}
