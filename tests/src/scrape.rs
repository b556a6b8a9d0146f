//! The agent and a real Prometheus for the integration tests: the agent on a free loopback
//! port, Prometheus (the Debian package, which `cargo xtask test` installs when missing)
//! scraping it with storage of its own, each killed on drop; and the shipped dashboard's
//! queries, ready for Prometheus.

use std::{
    io::{BufRead, BufReader},
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::Duration,
};

use serde_json::Value;

use crate::{profiler_bin, wait_until};

/// A port free now on loopback.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// `GET /metrics` of an agent on this loopback port: the page (which must be served).
pub fn metrics(port: u16) -> String {
    // A bound, not a measure: a page that never comes fails the test instead of hanging it.
    let r = ureq::get(&format!("http://127.0.0.1:{port}/metrics"))
        .timeout(crate::scaled(Duration::from_secs(60)))
        .call()
        .expect("GET /metrics");
    // (Not `into_string`: with a series per pid the page passes its 10 MB cap.)
    let mut text = String::new();
    std::io::Read::read_to_string(&mut r.into_reader(), &mut text).expect("text");
    text
}

/// A child process killed on drop (a test that fails half-way leaves nothing running),
/// unless taken back.
pub struct ChildGuard(Option<Child>);

impl ChildGuard {
    pub fn new(c: Child) -> Self {
        ChildGuard(Some(c))
    }

    pub fn id(&self) -> u32 {
        self.0.as_ref().map_or(0, Child::id)
    }

    /// The child, no longer killed on drop.
    pub fn take(mut self) -> Child {
        self.0.take().expect("taken once")
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The agent, killed on drop.
pub struct Agent {
    pub child: Child,
    pub port: u16,
}

impl Agent {
    /// The agent in full mode (unless `args` name a `--mode`): the tests of exact counts are
    /// of every acquisition, which contention mode, the agent's default, does not count.
    pub fn start(args: &[&str]) -> Self {
        Self::start_with_limit(args, None)
    }

    /// The agent with no `--mode`: in the mode it picks itself.
    pub fn start_in_its_default_mode(args: &[&str]) -> Self {
        Self::spawn(args, None, false)
    }

    /// [`start`](Self::start) under an open-file limit (soft and hard) if given.
    pub fn start_with_limit(args: &[&str], nofile: Option<u64>) -> Self {
        Self::spawn(args, nofile, !args.contains(&"--mode"))
    }

    fn spawn(args: &[&str], nofile: Option<u64>, full: bool) -> Self {
        let port = free_port();
        let mut cmd = Command::new(profiler_bin());
        if let Some(n) = nofile {
            use std::os::unix::process::CommandExt as _;
            let lim = libc::rlimit {
                rlim_cur: n,
                rlim_max: n,
            };
            // SAFETY: setrlimit is async-signal-safe, and only changes the child.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                });
            }
        }
        cmd.args(["agent", "--listen", &format!("127.0.0.1:{port}")]);
        if full {
            cmd.args(["--mode", "full"]);
        }
        let mut child = cmd
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
        // It serves or ends (stderr then closes): no bound on how long attaching takes.
        loop {
            match rx.recv() {
                Ok(l) if l.contains("serving") => break,
                Ok(_) => {}
                Err(_) => panic!("the agent did not start: {:?}", child.wait()),
            }
        }
        Agent { child, port }
    }

    pub fn metrics(&self) -> String {
        metrics(self.port)
    }

    /// Stops the agent as a service manager does (SIGTERM): its last interval is written.
    pub fn stop(mut self) {
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = crate::workload::wait_child(&mut self.child);
        assert!(status.success(), "the agent ended with {status:?}");
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A Prometheus server scraping `targets` every second, with its own storage; killed on drop.
pub struct Prometheus {
    child: Child,
    pub port: u16,
    _dir: PathBuf,
}

pub fn prometheus_bin() -> Option<PathBuf> {
    ["/usr/bin/prometheus", "/usr/local/bin/prometheus"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

impl Prometheus {
    pub fn start(bin: &Path, target_port: u16) -> Self {
        Self::start_with(bin, target_port, &[])
    }

    pub fn start_with(bin: &Path, target_port: u16, flags: &[&str]) -> Self {
        Self::start_scraping(
            bin,
            &format!(
                "  - job_name: mmaplock\n    static_configs:\n      - targets: ['127.0.0.1:{target_port}']\n"
            ),
            flags,
        )
    }

    /// Prometheus with these `scrape_configs` entries (YAML, indented as list items).
    pub fn start_scraping(bin: &Path, scrape_configs: &str, flags: &[&str]) -> Self {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Its own directory: a test may run two at once.
        let dir = std::env::temp_dir().join(format!("mmaplock-prom-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n{scrape_configs}"
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
        // Ready or ended: no bound (a Prometheus that cannot start exits).
        let mut p = p;
        while ureq::get(&format!("http://127.0.0.1:{port}/-/ready"))
            .call()
            .is_err()
        {
            if let Ok(Some(s)) = p.child.try_wait() {
                panic!("prometheus ended before it was ready: {s}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        p
    }

    /// An instant query: its result vector (panics on a PromQL error).
    pub fn query(&self, q: &str) -> Vec<Value> {
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
    pub fn value(&self, q: &str) -> Option<f64> {
        let r = self.query(q);
        r.first()?["value"][1].as_str()?.parse().ok()
    }

    /// Waits (`within` at most on the reference machine, [`wait_until`]) until `q` has a value that `ok` accepts, and returns it;
    /// `what` says what was awaited.
    pub fn wait_for(&self, q: &str, within: Duration, ok: impl Fn(f64) -> bool, what: &str) -> f64 {
        wait_until(within, Duration::from_millis(500), || match self.value(q) {
            Some(v) if ok(v) => Ok(v),
            v => Err(format!("{what}: {q} = {v:?}")),
        })
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
pub fn dashboard_queries() -> Vec<(String, bool)> {
    dashboard_panels()
        .into_iter()
        .map(|q| (q.expr, q.optional))
        .collect()
}

/// A query of the shipped dashboard, its variables substituted.
pub struct PanelQuery {
    pub expr: String,
    /// Its panel "May show no data" (the kernel's BPF statistics off).
    pub optional: bool,
    /// Its panel is "Full mode only": contention mode measures no hold.
    pub full_mode_only: bool,
}

fn dashboard() -> Value {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/mmaplock-dashboard.json");
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// The dashboard's Prometheus annotations: (name, expr with its variables matching all).
pub fn dashboard_annotations() -> Vec<(String, String)> {
    let d = dashboard();
    (d["annotations"]["list"].as_array().into_iter().flatten())
        .filter_map(|a| {
            let e = a["expr"].as_str()?;
            let e = ["$instance", "$process", "$cgroup"]
                .iter()
                .fold(e.to_string(), |e, v| e.replace(v, ".*"));
            assert!(!e.contains('$'), "unsubstituted: {e}");
            Some((a["name"].as_str()?.to_string(), e))
        })
        .collect()
}

pub fn dashboard_panels() -> Vec<PanelQuery> {
    let d = dashboard();
    let mut out = Vec::new();
    fn walk(panels: &Value, out: &mut Vec<PanelQuery>) {
        for p in panels.as_array().into_iter().flatten() {
            walk(&p["panels"], out);
            let says = |prefix: &str| {
                p["description"]
                    .as_str()
                    .is_some_and(|d| d.starts_with(prefix))
            };
            let (optional, full_mode_only) = (says("May show no data:"), says("Full mode only:"));
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
                    out.push(PanelQuery {
                        expr: e,
                        optional,
                        full_mode_only,
                    });
                }
            }
        }
    }
    walk(&d["panels"], &mut out);
    out
}

/// The sum of a metric's samples in a Prometheus text exposition whose labels contain all of
/// `with` (e.g. `process="node"`), as a count.
pub fn metric_sum(text: &str, metric: &str, with: &[&str]) -> u64 {
    metric_f64(text, metric, with) as u64
}

/// The mmap calls' write acquisitions (`mmaplock_acquisitions_total{cause="mmap"}`) summed
/// over the series that have every label of `with`.
pub fn mmap_writes(text: &str, with: &[&str]) -> u64 {
    let with: Vec<&str> = with.iter().copied().chain(["cause=\"mmap\""]).collect();
    metric_sum(text, "mmaplock_acquisitions_total", &with)
}

/// The same, as a number (seconds and the like).
pub fn metric_f64(text: &str, metric: &str, with: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{metric}{{")))
        .filter(|l| with.iter().all(|w| l.contains(w)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The value of an unlabelled gauge in a Prometheus text exposition.
pub fn metric_gauge(text: &str, metric: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{metric} "))?.parse().ok())
        .unwrap_or_else(|| panic!("no {metric} in {text}"))
}
