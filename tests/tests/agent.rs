//! ROOT-ONLY: `mmaplock-prof agent` scraped by a real Prometheus (the Debian package, which
//! `cargo xtask test` installs when missing), the shipped dashboard's queries, process churn
//! and pid reuse, each against counts the workload knows.

use std::{
    io::{BufRead, BufReader},
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use integration_tests::{
    Workload, churn_bin, metric_gauge, metric_sum, profiler_bin, require_root_and_tracepoints,
};
use serde_json::Value;

/// A port free now on loopback.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The agent, killed on drop.
struct Agent {
    child: Child,
    port: u16,
}

impl Agent {
    fn start(args: &[&str]) -> Self {
        let port = free_port();
        let mut child = Command::new(profiler_bin())
            .args(["agent", "--listen", &format!("127.0.0.1:{port}")])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the agent");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("agent: {l}");
                let _ = tx.send(l);
            }
        });
        loop {
            match rx.recv_timeout(Duration::from_secs(30)) {
                Ok(l) if l.contains("serving") => break,
                Ok(_) => {}
                Err(_) => panic!("the agent did not start"),
            }
        }
        Agent { child, port }
    }

    fn metrics(&self) -> String {
        ureq::get(&format!("http://127.0.0.1:{}/metrics", self.port))
            .call()
            .expect("GET /metrics")
            .into_string()
            .expect("text")
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A Prometheus server scraping `targets` every second, with its own storage; killed on drop.
struct Prometheus {
    child: Child,
    port: u16,
    _dir: PathBuf,
}

fn prometheus_bin() -> Option<PathBuf> {
    ["/usr/bin/prometheus", "/usr/local/bin/prometheus"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

impl Prometheus {
    fn start(bin: &Path, target_port: u16) -> Self {
        Self::start_with(bin, target_port, &[])
    }

    fn start_with(bin: &Path, target_port: u16, flags: &[&str]) -> Self {
        let dir = std::env::temp_dir().join(format!("mmaplock-prom-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: mmaplock\n    static_configs:\n      - targets: ['127.0.0.1:{target_port}']\n"
            ),
        )
        .unwrap();
        let port = free_port();
        let child = Command::new(bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .args(flags)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start prometheus");
        let p = Prometheus {
            child,
            port,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while ureq::get(&format!("http://127.0.0.1:{port}/-/ready"))
            .call()
            .is_err()
        {
            assert!(Instant::now() < deadline, "prometheus did not get ready");
            std::thread::sleep(Duration::from_millis(200));
        }
        p
    }

    /// An instant query: its result vector (panics on a PromQL error).
    fn query(&self, q: &str) -> Vec<Value> {
        let body: Value = ureq::get(&format!("http://127.0.0.1:{}/api/v1/query", self.port))
            .query("query", q)
            .call()
            .unwrap_or_else(|e| panic!("query {q}: {e}"))
            .into_json()
            .expect("json");
        assert_eq!(body["status"], "success", "{q}: {body}");
        body["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// The single value of a query's result (None while it has none).
    fn value(&self, q: &str) -> Option<f64> {
        let r = self.query(q);
        r.first()?["value"][1].as_str()?.parse().ok()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self._dir);
    }
}

/// Every `targets[].expr` of the dashboard (rows' nested panels included), with Grafana's
/// macros and template variables replaced as deploy/README.md says, and whether its panel
/// may show no data.
fn dashboard_queries() -> Vec<(String, bool)> {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/mmaplock-dashboard.json");
    let d: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut out = Vec::new();
    fn walk(panels: &Value, out: &mut Vec<(String, bool)>) {
        for p in panels.as_array().into_iter().flatten() {
            walk(&p["panels"], out);
            let optional = p["description"]
                .as_str()
                .is_some_and(|d| d.starts_with("May show no data:"));
            for t in p["targets"].as_array().into_iter().flatten() {
                if let Some(e) = t["expr"].as_str() {
                    let e = e
                        .replace("$__rate_interval", "1m")
                        .replace("$__range", "1m")
                        .replace("$__interval", "1m")
                        .replace("$instance", ".*")
                        .replace("$process", ".*")
                        .replace("$cgroup", ".*");
                    assert!(!e.contains('$'), "unsubstituted: {e}");
                    out.push((e, optional));
                }
            }
        }
    }
    walk(&d["panels"], &mut out);
    out
}

#[test]
fn prometheus_scrapes_the_exact_write_count_and_every_dashboard_query_has_data() {
    if !require_root_and_tracepoints() {
        return;
    }
    let Some(prom_bin) = prometheus_bin() else {
        assert!(
            !integration_tests::under_ci(),
            "prometheus is not installed (cargo xtask test installs it)"
        );
        integration_tests::skip_because("prometheus is not installed");
        return;
    };
    let (t, n) = (2u64, 20_000u64);
    let mut w = Workload::churn(t as u32, n as u32, None);
    let pid = w.pid.to_string();
    // With blockers: the dashboard's "who made whom wait" panel needs them.
    let agent = Agent::start(&["--pid", &pid, "-i", "0.5", "--bpf-stats", "--blockers"]);
    let prom = Prometheus::start(&prom_bin, agent.port);
    // Selected at once (the agent scans before its first reading).
    w.go();
    assert!(w.wait().success());
    let mmap = "sum(mmaplock_acquisitions_total{op=\"write\",cause=\"mmap\"})";
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if prom.value(mmap) == Some((t * n) as f64) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "PromQL {mmap} = {:?}, expected {}\n{}",
            prom.value(mmap),
            t * n,
            agent.metrics()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // munmap: the workload's, plus its threads' signal stacks (at most one each, and one
    // for the main thread).
    let munmap = prom
        .value("sum(mmaplock_acquisitions_total{op=\"write\",cause=\"munmap\"})")
        .expect("munmap writes") as u64;
    assert!(
        (t * n..=t * n + t + 1).contains(&munmap),
        "munmap {munmap} for {}",
        t * n
    );
    let p99 = prom
        .value("histogram_quantile(0.99, sum by (le) (mmaplock_wait_seconds_bucket{op=\"write\"}))")
        .expect("a write-wait percentile");
    assert!(p99.is_finite() && p99 > 0.0, "p99 {p99}");
    // The buckets add up to the count.
    let count = prom
        .value("sum(mmaplock_wait_seconds_count{op=\"write\"})")
        .unwrap();
    let inf = prom
        .value("sum(mmaplock_wait_seconds_bucket{op=\"write\",le=\"+Inf\"})")
        .unwrap();
    assert_eq!(count, inf);
    // Let a few more scrapes land, so that every rate() has two samples after the work.
    std::thread::sleep(Duration::from_secs(3));
    let queries = dashboard_queries();
    assert!(queries.len() >= 20, "{} dashboard queries", queries.len());
    for (q, optional) in &queries {
        let r = prom.query(q);
        if !optional {
            assert!(!r.is_empty(), "dashboard query returned no data: {q}");
        }
    }
}

#[test]
fn native_histograms_through_the_protobuf_exposition_keep_exact_counts() {
    if !require_root_and_tracepoints() {
        return;
    }
    let Some(prom_bin) = prometheus_bin() else {
        assert!(
            !integration_tests::under_ci(),
            "prometheus is not installed"
        );
        integration_tests::skip_because("prometheus is not installed");
        return;
    };
    let (t, n) = (2u64, 5_000u64);
    let mut w = Workload::churn(t as u32, n as u32, None);
    let pid = w.pid.to_string();
    let agent = Agent::start(&["--pid", &pid, "-i", "0.5"]);
    // With the feature, Prometheus asks for protobuf and keeps native histograms.
    let prom = Prometheus::start_with(
        &prom_bin,
        agent.port,
        &["--enable-feature=native-histograms"],
    );
    w.go();
    assert!(w.wait().success());
    let count_q = "histogram_count(sum(mmaplock_wait_seconds{op=\"write\"}))";
    let writes_q = "sum(mmaplock_acquisitions_total{op=\"write\"})";
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (count, writes) = (prom.value(count_q), prom.value(writes_q));
        // The native histogram counts every write the counters do, exactly.
        if writes.is_some_and(|w| w >= (2 * t * n) as f64) && count == writes {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "native count {count:?}, writes {writes:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let p99 = prom
        .value("histogram_quantile(0.99, sum(mmaplock_wait_seconds{op=\"write\"}))")
        .expect("a native write-wait percentile");
    assert!(p99.is_finite() && p99 > 0.0, "p99 {p99}");
    let sum = prom
        .value("histogram_sum(sum(mmaplock_wait_seconds{op=\"write\"}))")
        .expect("sum");
    assert!(sum > 0.0);
}

#[test]
fn hundreds_of_short_processes_are_all_counted_and_leave_nothing_behind() {
    if !require_root_and_tracepoints() {
        return;
    }
    let (batches, per_batch, n) = (4, 50, 25u64);
    let agent = Agent::start(&["--comm", "churnling", "-i", "0.2"]);
    std::thread::sleep(Duration::from_millis(500));
    let before = agent.metrics();
    let base_threads = metric_gauge(&before, "mmaplock_tracked_threads");
    let base_entries = metric_gauge(&before, "mmaplock_map_entries");
    for _ in 0..batches {
        let mut ws: Vec<Workload> = (0..per_batch)
            .map(|_| {
                let mut cmd = Command::new(churn_bin());
                cmd.args(["1", &n.to_string(), "65536", "churnling"]);
                Workload::spawn(cmd)
            })
            .collect();
        // Picked up within an interval or so (a scan of /proc): wait until the agent says
        // it has selected them all before they start.
        let deadline = Instant::now() + Duration::from_secs(10);
        while metric_gauge(&agent.metrics(), "mmaplock_tracked_processes") < per_batch as u64 {
            assert!(
                Instant::now() < deadline,
                "the batch was not selected in 10 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        for w in &mut ws {
            w.go();
        }
        for w in &mut ws {
            assert!(w.wait().success());
        }
        // Dropped within an interval or so, before the next batch is counted on.
        let deadline = Instant::now() + Duration::from_secs(10);
        while metric_gauge(&agent.metrics(), "mmaplock_tracked_processes") > 0 {
            assert!(
                Instant::now() < deadline,
                "the batch was not dropped in 10 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let total = (batches * per_batch) as u64;
    let deadline = Instant::now() + Duration::from_secs(20);
    let text = loop {
        let text = agent.metrics();
        let mmap = metric_sum(
            &text,
            "mmaplock_acquisitions_total",
            &["process=\"churnling\"", "cause=\"mmap\""],
        );
        if mmap == total * n
            && metric_gauge(&text, "mmaplock_tracked_processes") == 0
            && metric_gauge(&text, "mmaplock_tracked_threads") <= base_threads
        {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "mmap writes {mmap} of {}, tracked {} processes {} threads\n{text}",
            total * n,
            metric_gauge(&text, "mmaplock_tracked_processes"),
            metric_gauge(&text, "mmaplock_tracked_threads"),
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    assert!(
        metric_gauge(&text, "mmaplock_map_entries") <= base_entries,
        "kernel entries back to baseline\n{text}"
    );
    assert_eq!(
        metric_sum(&text, "mmaplock_lost_total", &["reason=\"events\""]),
        0
    );
}

/// Puts the next pid the kernel gives out at `pid` (root; `ns_last_pid`).
fn set_next_pid(pid: u32) -> bool {
    std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string()).is_ok()
}

#[test]
fn a_recycled_pid_is_a_new_process_with_its_own_name() {
    if !require_root_and_tracepoints() {
        return;
    }
    let agent = Agent::start(&[
        "--comm",
        "reuse-alpha",
        "--comm",
        "reuse-beta",
        "--pid-label",
        "-i",
        "0.2",
    ]);
    let spawn = |name: &str| {
        let mut cmd = Command::new(churn_bin());
        cmd.args(["1", "100", "65536", name]);
        Workload::spawn(cmd)
    };
    let mut a = spawn("reuse-alpha");
    let pid = a.pid;
    std::thread::sleep(Duration::from_millis(600));
    a.go();
    assert!(a.wait().success());
    drop(a);
    // Another process gets the same pid (retried: something else may take it first).
    let mut b = None;
    for _ in 0..20 {
        if !set_next_pid(pid) {
            break;
        }
        let w = spawn("reuse-beta");
        if w.pid == pid {
            b = Some(w);
            break;
        }
    }
    let Some(mut b) = b else {
        panic!("could not recycle pid {pid} through /proc/sys/kernel/ns_last_pid");
    };
    std::thread::sleep(Duration::from_millis(600));
    b.go();
    assert!(b.wait().success());
    let pid_l = format!("pid=\"{pid}\"");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = agent.metrics();
        let of = |name: &str| {
            metric_sum(
                &text,
                "mmaplock_acquisitions_total",
                &[&format!("process=\"{name}\""), &pid_l, "cause=\"mmap\""],
            )
        };
        if of("reuse-alpha") == 100 && of("reuse-beta") == 100 {
            // Each with its own roles: the main thread is `main` in both.
            for name in ["reuse-alpha", "reuse-beta"] {
                assert!(
                    text.lines()
                        .any(|l| l.contains(&format!("process=\"{name}\""))
                            && l.contains(&pid_l)
                            && l.contains("role=\"main\"")),
                    "{name}: no main thread\n{text}"
                );
            }
            break;
        }
        assert!(
            Instant::now() < deadline,
            "alpha {} beta {} (100 each)\n{text}",
            of("reuse-alpha"),
            of("reuse-beta")
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// `--js-functions N`: the agent names the JavaScript functions that take the lock for write,
/// with no node flag, in at most N series per process (then `(other)`).
#[test]
fn the_agent_exports_js_functions_of_processes_without_node_flags() {
    if !require_root_and_tracepoints() {
        return;
    }
    let rounds = 16u64;
    let mut cmd = Command::new("node");
    cmd.env("MALLOC_MMAP_THRESHOLD_", "131072")
        .arg(integration_tests::fixture("jsapis.js"))
        .arg(rounds.to_string())
        .arg("viaBufferAlloc,viaArrayBuffer");
    let mut w = Workload::spawn(cmd);
    let pid = w.pid.to_string();
    let agent = Agent::start(&[
        "--pid",
        &pid,
        "-i",
        "0.5",
        "--js-functions",
        "2",
        "--stack-sample",
        "1",
    ]);
    w.send("go");
    assert_eq!(w.read_line(), "done");
    let metric = "mmaplock_js_function_sampled_writes_total";
    let series = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with(&format!("{metric}{{")))
            .map(str::to_string)
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let text = loop {
        let text = agent.metrics();
        let named = metric_sum(&text, metric, &["function=\"viaBufferAlloc ("]);
        if named * 10 >= rounds * 9 {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "viaBufferAlloc: {named} sampled writes of {rounds}: {:?}",
            series(&text)
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    w.send("exit");
    assert!(w.wait().success());
    let node: Vec<String> = series(&text)
        .into_iter()
        .filter(|l| l.contains("process=\"node\""))
        .collect();
    assert!(
        node.iter().filter(|l| !l.contains("(other)")).count() <= 2,
        "at most 2 functions per process: {node:?}"
    );
}
