//! What contention mode captures: both modes on the same run at once (two profilers, or two
//! agents), on the cases users meet: the write-heavy helper, Node Workers at 4 and 8, Workers
//! whose reads fault in fresh 1 MiB buffers, the blockers' long holder, and short processes
//! under the agent. The share is contention mode's wait over what full mode measured in
//! acquisitions that waited over 2 us (at most: a log2 bucket's waits are taken at their
//! lower bound), the process's own threads (the other profiler's reads apart).

use std::{
    io::{BufRead, BufReader, Write},
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};

use super::{procfs::Guard, stats::Spread};
use crate::workspace_root;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Case {
    Helper,
    Node4,
    Node8,
    NodeFaults,
    LongHolder,
    ShortProcesses,
}

impl Case {
    pub const ALL: [Case; 6] = [
        Case::Helper,
        Case::Node4,
        Case::Node8,
        Case::NodeFaults,
        Case::LongHolder,
        Case::ShortProcesses,
    ];

    fn name(self) -> &'static str {
        match self {
            Case::Helper => "mmap/munmap helper, 4 threads x 40000",
            Case::Node4 => "node, 4 Workers x 4000 readFileSync 64 KiB",
            Case::Node8 => "node, 8 Workers x 2000 readFileSync 64 KiB",
            Case::NodeFaults => "node, 4 Workers x 300 readFileSync 1 MiB (page faults)",
            Case::LongHolder => "blockers' long holder (40 mprotects of 256 MiB, 3 churners)",
            Case::ShortProcesses => "100 short processes under two agents (4 threads x 300)",
        }
    }

    /// The workload's command (a one-shot case), printing "ready" and waiting for "go".
    fn command(self, bin: &Path, dir: &Path) -> Command {
        let node = |k: u32, file: &str, n: u32| {
            let mut c = Command::new("node");
            c.arg(workspace_root().join("profiler/demo/workload.js"))
                .args(["workers", &k.to_string()])
                .arg(dir.join(file))
                .arg(n.to_string());
            c
        };
        match self {
            Case::Helper => {
                let mut c = Command::new(bin.join("mmap-churn"));
                c.args(["4", "40000"]);
                c
            }
            Case::Node4 => node(4, "data.bin", 4000),
            Case::Node8 => node(8, "data.bin", 2000),
            Case::NodeFaults => node(4, "data-1m.bin", 300),
            Case::LongHolder => {
                let mut c = Command::new(bin.join("long-holder"));
                c.args(["40", "3"]);
                c
            }
            Case::ShortProcesses => unreachable!("run by `short_processes`"),
        }
    }
}

/// One round of one case: what each mode measured of the process's own threads.
#[derive(Clone, Debug)]
pub struct Capture {
    pub case: Case,
    /// Full mode: acquisitions, and the most wait in those that waited over 2 us.
    pub acquisitions: u64,
    pub over_2us_ns: u64,
    /// Contention mode: contended waits, and their wait.
    pub waits: u64,
    pub wait_ns: u64,
}

impl Capture {
    fn share(&self) -> f64 {
        self.wait_ns as f64 / self.over_2us_ns as f64
    }
}

/// The most wait, in ns, a STATS's acquisitions that waited over 2 us can hold: its sum less
/// the least its buckets under 2.048 us hold.
fn over_2us(s: &Value) -> u64 {
    let under: u64 = s["wait_ns"]["buckets"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|b| Some((b[0].as_u64()?, b[1].as_u64()?)))
        .filter(|&(upper, _)| upper <= 2048)
        .map(|(upper, n)| upper / 2 * n)
        .sum();
    s["wait_ns"]["sum"]
        .as_u64()
        .unwrap_or(0)
        .saturating_sub(under)
}

/// Adds a report line's process `pid` (any pid when None) to `c`, its own threads only.
fn add_line(c: &mut Capture, line: &Value, pid: Option<u64>, full: bool) {
    for p in line["processes"].as_array().into_iter().flatten() {
        if pid.is_some_and(|pid| p["pid"] != pid) {
            continue;
        }
        for t in p["threads"].as_array().into_iter().flatten() {
            if t["role"] == "foreign" || t["role"] == "profiler" {
                continue;
            }
            for side in ["write", "read"] {
                let s = &t[side];
                let n = s["count"].as_u64().unwrap_or(0);
                if full {
                    c.acquisitions += n;
                    c.over_2us_ns += over_2us(s);
                } else {
                    c.waits += n;
                    c.wait_ns += s["wait_ns"]["sum"].as_u64().unwrap_or(0);
                }
            }
        }
    }
}

/// The last line of an NDJSON file.
pub(super) fn last_line(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    serde_json::from_str(text.lines().last().unwrap_or("")).context("a summary line")
}

/// Starts `cmd` and waits for a line of its standard error containing `said`.
pub(super) fn started(mut cmd: Command, said: &str) -> Result<Guard> {
    cmd.stdout(Stdio::null());
    started_with_stdout(cmd, said)
}

/// [`started`], its standard output left as `cmd` sets it (a reader of it).
pub(super) fn started_with_stdout(mut cmd: Command, said: &str) -> Result<Guard> {
    let mut g = Guard(
        cmd.stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("start {cmd:?}"))?,
    );
    let (tx, rx) = mpsc::channel();
    let err = g.0.stderr.take().context("stderr")?;
    std::thread::spawn(move || {
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(l) if l.contains(said) => return Ok(g),
            Ok(_) => {}
            Err(_) => bail!("{cmd:?} did not say {said:?}: {:?}", g.0.try_wait()),
        }
    }
}

/// Waits for a child to end by itself (a one-shot profiler whose target exited).
pub(super) fn wait(g: &mut Guard, within: Duration) -> Result<()> {
    let t0 = Instant::now();
    while g.0.try_wait()?.is_none() {
        if t0.elapsed() > within {
            bail!("a profiler did not end within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// A one-shot case: the workload ready, both profilers on its pid, go, and their summaries.
fn one_shot(case: Case, prof: &Path, dir: &Path) -> Result<Capture> {
    let bin = prof.parent().context("bin dir")?;
    let mut w = Guard(
        case.command(bin, dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("start the workload")?,
    );
    let mut out = BufReader::new(w.0.stdout.take().context("stdout")?);
    let mut l = String::new();
    out.read_line(&mut l)?;
    if !l.starts_with("ready") {
        bail!("the workload said {l:?}");
    }
    let pid = w.0.id().to_string();
    let file = |m: &str| dir.join(format!("capture-{m}.json"));
    let mut profs = Vec::new();
    for m in ["full", "contention"] {
        let mut c = Command::new(prof);
        c.args(["-p", &pid, "-i", "0", "-f", "json", "--mode", m, "-o"])
            .arg(file(m));
        profs.push(started(c, "attached in")?);
    }
    w.0.stdin.take().context("stdin")?.write_all(b"go\n")?;
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut out, &mut rest);
    let _ = w.0.wait();
    for p in &mut profs {
        wait(p, Duration::from_secs(60))?;
    }
    let mut c = Capture {
        case,
        acquisitions: 0,
        over_2us_ns: 0,
        waits: 0,
        wait_ns: 0,
    };
    let pid = pid.parse::<u64>()?;
    add_line(&mut c, &last_line(&file("full"))?, Some(pid), true);
    add_line(&mut c, &last_line(&file("contention"))?, Some(pid), false);
    Ok(c)
}

/// Short processes under two agents at once (one per mode), selecting them by name: every
/// process's own threads in every interval line.
fn short_processes(prof: &Path, dir: &Path) -> Result<Capture> {
    let bin = prof.parent().context("bin dir")?;
    let name = "cap-churn";
    let file = |m: &str| dir.join(format!("capture-agent-{m}.jsonl"));
    let mut agents = Vec::new();
    for m in ["full", "contention"] {
        let _ = std::fs::remove_file(file(m));
        let mut c = Command::new(prof);
        c.args([
            "agent",
            "--listen",
            "127.0.0.1:0",
            "--comm",
            name,
            "-i",
            "0.5",
        ])
        .args(["--mode", m, "-o"])
        .arg(file(m));
        agents.push(started(c, "serving")?);
    }
    for _ in 0..25 {
        let batch: Vec<Child> = (0..4)
            .map(|_| {
                Command::new(bin.join("mmap-churn"))
                    .args(["4", "300", "65536", name])
                    .stdin(Stdio::piped())
                    .stdout(Stdio::null())
                    .spawn()
            })
            .collect::<std::io::Result<_>>()?;
        for mut c in batch.into_iter().collect::<Vec<_>>() {
            c.stdin.take().context("stdin")?.write_all(b"go\n")?;
            let _ = c.wait();
        }
    }
    // Their exits read, then the last interval written.
    std::thread::sleep(Duration::from_secs(3));
    for a in &mut agents {
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(a.0.id() as i32, libc::SIGTERM) };
        let _ = a.0.wait();
    }
    let mut c = Capture {
        case: Case::ShortProcesses,
        acquisitions: 0,
        over_2us_ns: 0,
        waits: 0,
        wait_ns: 0,
    };
    for (m, full) in [("full", true), ("contention", false)] {
        let text = std::fs::read_to_string(file(m))?;
        for l in text.lines() {
            add_line(&mut c, &serde_json::from_str(l)?, None, full);
        }
    }
    Ok(c)
}

/// Every case, `rounds` times.
pub fn run(rounds: usize, prof: &Path, dir: &Path) -> Result<Vec<Capture>> {
    std::fs::write(dir.join("data-1m.bin"), vec![0x5au8; 1 << 20])?;
    let mut out = Vec::new();
    for round in 0..rounds {
        for case in Case::ALL {
            let c = if case == Case::ShortProcesses {
                short_processes(prof, dir)?
            } else {
                one_shot(case, prof, dir)?
            };
            eprintln!(
                "capture round {}/{rounds}: {:<62} {:.1}% of {:.1} ms ({} contended waits of {} acquisitions)",
                round + 1,
                case.name(),
                c.share() * 100.0,
                c.over_2us_ns as f64 / 1e6,
                c.waits,
                c.acquisitions
            );
            out.push(c);
        }
    }
    Ok(out)
}

/// The section's JSON and markdown.
pub fn summarize(captures: &[Capture]) -> (Value, String) {
    let mut md = String::from(
        "## What contention mode captures (both modes on the same run at once)\n\n\
         Contention mode's wait over the wait full mode measured in acquisitions that waited \
         over 2 us (an upper bound of it: a bucket's waits taken at their lower bound), the \
         process's own threads; median (min - max) over the rounds.\n\n\
         | case | full mode: acquisitions | full: wait over 2 us (ms) | contention: waits | contention: wait (ms) | captured |\n\
         |---|---:|---:|---:|---:|---|\n",
    );
    let mut rows = Vec::new();
    for case in Case::ALL {
        let cs: Vec<&Capture> = captures.iter().filter(|c| c.case == case).collect();
        if cs.is_empty() {
            continue;
        }
        let sp = |f: &dyn Fn(&Capture) -> f64| Spread::of(cs.iter().map(|c| f(c)));
        let (acq, over, waits, wait, share) = (
            sp(&|c| c.acquisitions as f64),
            sp(&|c| c.over_2us_ns as f64 / 1e6),
            sp(&|c| c.waits as f64),
            sp(&|c| c.wait_ns as f64 / 1e6),
            sp(&|c| c.share() * 100.0),
        );
        let show = |s: &Option<Spread>, d: usize| s.as_ref().map_or("-".into(), |s| s.show(d));
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {}% |\n",
            case.name(),
            show(&acq, 0),
            show(&over, 1),
            show(&waits, 0),
            show(&wait, 1),
            show(&share, 1)
        ));
        let j = |s: &Option<Spread>| s.as_ref().map_or(Value::Null, |s| s.json(3));
        rows.push(json!({
            "case": case.name(), "acquisitions": j(&acq), "full_over_2us_ms": j(&over),
            "contended_waits": j(&waits), "contention_wait_ms": j(&wait),
            "captured_pct": j(&share),
        }));
    }
    (json!({ "cases": rows }), md)
}
