//! What a triggered capture (`agent --escalate-dir`) costs while it runs: two Node processes
//! of 4 Workers reading a 64 KiB file in a loop (tests/fixtures/phases.js, each read an mmap
//! and a munmap), one selected by the agent and captured, the other on the same host and not
//! selected; their reads over the same window with no agent and with the agent capturing the
//! first (it crosses the threshold within seconds, and the capture takes most of the window),
//! interleaved, the order alternating. Also the bytes each capture wrote.

use std::{
    io::{BufRead, BufReader, Write},
    path::Path,
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};

use super::{procfs::Guard, stats::Spread};
use crate::workspace_root;

/// How long each run reads; the capture is [`CAPTURE_S`] of it.
const WINDOW: Duration = Duration::from_secs(20);
const CAPTURE_S: &str = "15";

/// A phases.js process: its pipes, killed on drop.
struct Phases {
    child: Guard,
    stdin: ChildStdin,
    out: BufReader<ChildStdout>,
}

impl Phases {
    fn start(file: &Path) -> Result<Phases> {
        let mut child: Child = Command::new("node")
            .env("MALLOC_MMAP_THRESHOLD_", "65536")
            .arg(workspace_root().join("tests/fixtures/phases.js"))
            .arg("4")
            .arg(file)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("start node tests/fixtures/phases.js")?;
        let stdin = child.stdin.take().context("stdin")?;
        let mut out = BufReader::new(child.stdout.take().context("stdout")?);
        let mut l = String::new();
        out.read_line(&mut l)?;
        if l.trim() != "ready" {
            bail!("phases.js said {l:?}");
        }
        Ok(Phases {
            child: Guard(child),
            stdin,
            out,
        })
    }

    fn say(&mut self, cmd: &str) -> Result<String> {
        writeln!(self.stdin, "{cmd}")?;
        let mut l = String::new();
        self.out.read_line(&mut l)?;
        Ok(l.trim().to_string())
    }

    /// Reads done so far (`stopped N`).
    fn stop(&mut self) -> Result<f64> {
        let l = self.say("stop")?;
        l.strip_prefix("stopped ")
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("phases.js said {l:?}"))
    }

    fn pid(&self) -> u32 {
        self.child.0.id()
    }
}

/// One run: the two processes' reads per second, and the capture's bytes (with the agent).
#[derive(Clone, Debug)]
pub struct Run {
    pub round: usize,
    pub agent: bool,
    /// The second run with no agent in its round (the A/A).
    pub again: bool,
    pub captured_reads_per_s: f64,
    pub other_reads_per_s: f64,
    pub capture_bytes: Option<u64>,
}

fn dir_bytes(dir: &Path) -> u64 {
    let mut n = 0;
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let m = e.metadata();
        if e.path().is_dir() {
            n += dir_bytes(&e.path());
        } else if let Ok(m) = m {
            n += m.len();
        }
    }
    n
}

fn one(
    round: usize,
    (agent, again): (bool, bool),
    prof: &Path,
    file: &Path,
    dir: &Path,
) -> Result<Run> {
    let mut captured = Phases::start(file)?;
    let mut other = Phases::start(file)?;
    let _ = std::fs::remove_dir_all(dir);
    let tracer = if agent {
        let mut c = Command::new(prof)
            .args(["agent", "--listen", "127.0.0.1:0", "--pid"])
            .arg(captured.pid().to_string())
            .arg("--escalate-dir")
            .arg(dir)
            .args(["--escalate-window", "5", "--escalate-for", CAPTURE_S])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("start the agent")?;
        let err = BufReader::new(c.stderr.take().context("stderr")?);
        let mut lines = err.lines();
        loop {
            match lines.next() {
                Some(Ok(l)) if l.contains("serving") => break,
                Some(Ok(_)) => {}
                _ => bail!("the agent did not start: {:?}", c.try_wait()),
            }
        }
        // Its later lines are not read: the agent writes a few, a pipe holds them.
        std::thread::spawn(move || lines.for_each(drop));
        Some(Guard(c))
    } else {
        None
    };
    captured.say("go")?;
    other.say("go")?;
    std::thread::sleep(WINDOW);
    let (a, b) = (captured.stop()?, other.stop()?);
    let capture_bytes = match tracer {
        Some(mut t) => {
            // SAFETY: a signal to our own child; it stops its capture, complete, then ends.
            unsafe { libc::kill(t.0.id() as i32, libc::SIGTERM) };
            let _ = t.0.wait();
            Some(dir_bytes(dir))
        }
        None => None,
    };
    let s = WINDOW.as_secs_f64();
    Ok(Run {
        round,
        agent,
        again,
        captured_reads_per_s: a / s,
        other_reads_per_s: b / s,
        capture_bytes,
    })
}

pub fn run(rounds: usize, prof: &Path, out_dir: &Path) -> Result<Vec<Run>> {
    let file = out_dir.join("chunk-64k.bin");
    std::fs::write(&file, vec![7u8; 64 << 10])?;
    let dir = out_dir.join("escalate-captures");
    let mut runs = Vec::new();
    for round in 0..rounds {
        // No agent, the agent, no agent again: rotating from round to round.
        let configs = [(false, false), (true, false), (false, true)];
        for k in 0..configs.len() {
            let (agent, again) = configs[(round + k) % configs.len()];
            let r = one(round, (agent, again), prof, &file, &dir)?;
            eprintln!(
                "escalate round {}/{rounds}: agent {agent} (again {again}): captured {:.0} reads/s, other {:.0} reads/s, capture {:?} bytes",
                round + 1,
                r.captured_reads_per_s,
                r.other_reads_per_s,
                r.capture_bytes
            );
            runs.push(r);
        }
    }
    Ok(runs)
}

pub fn summarize(runs: &[Run]) -> (Value, String) {
    let rounds = runs.iter().map(|r| r.round).max().map_or(0, |m| m + 1);
    // Against the first run with no agent of the same round.
    let ratio = |f: fn(&Run) -> f64, agent: bool, again: bool| {
        let v: Vec<f64> = (0..rounds)
            .filter_map(|k| {
                let of = |agent, again| {
                    (runs.iter()).find(|r| r.round == k && r.agent == agent && r.again == again)
                };
                Some(f(of(agent, again)?) / f(of(false, false)?))
            })
            .collect();
        Spread::of(v)
    };
    let captured = ratio(|r| r.captured_reads_per_s, true, false);
    let other = ratio(|r| r.other_reads_per_s, true, false);
    let aa_captured = ratio(|r| r.captured_reads_per_s, false, true);
    let aa_other = ratio(|r| r.other_reads_per_s, false, true);
    let bytes: Vec<f64> = runs
        .iter()
        .filter_map(|r| r.capture_bytes.map(|b| b as f64))
        .collect();
    let bytes = Spread::of(bytes);
    let pct = |s: &Option<Spread>| {
        s.as_ref().map_or("-".into(), |s| {
            let p = |x: f64| format!("{:+.1}%", (x - 1.0) * 100.0);
            format!("{} ({} - {})", p(s.median), p(s.min), p(s.max))
        })
    };
    let md = format!(
        "## What a triggered capture costs (interleaved rounds: {rounds})\n\n\
         Two Node processes of 4 Workers reading a 64 KiB file in a loop (tests/fixtures/phases.js, \
         `MALLOC_MMAP_THRESHOLD_=65536`: every read an mmap and a munmap), {w} s each run; with the \
         agent (`--pid` the first, `--escalate-dir`, window 5 s, capture {c} s), the first crosses \
         the threshold in its first seconds and is captured in full mode with `--blockers` for \
         most of the window; the second, on the same host, is not selected. Reads per second \
         with the agent over the same round's first run with none, and the second run with \
         none over the first (A/A: this machine's noise): median (min - max).\n\n\
         | process | reads/s, the agent capturing | A/A |\n|---|---|---|\n\
         | the captured process | {} | {} |\n| another process on the host | {} | {} |\n\n\
         Bytes written per capture (report.ndjson, report.html, profile.pb.gz, before.pb.gz): {}.\n",
        pct(&captured),
        pct(&aa_captured),
        pct(&other),
        pct(&aa_other),
        bytes.as_ref().map_or("-".into(), |s| format!(
            "{:.0} KiB median ({:.0} - {:.0})",
            s.median / 1024.0,
            s.min / 1024.0,
            s.max / 1024.0
        )),
        w = WINDOW.as_secs(),
        c = CAPTURE_S,
    );
    let j = |s: &Option<Spread>| s.as_ref().map_or(Value::Null, |s| s.json(4));
    let json = json!({
        "rounds": rounds,
        "captured_ratio": j(&captured), "other_ratio": j(&other), "capture_bytes": j(&bytes),
        "aa_captured_ratio": j(&aa_captured), "aa_other_ratio": j(&aa_other),
        "runs": runs.iter().map(|r| json!({
            "round": r.round, "agent": r.agent, "again": r.again,
            "captured_reads_per_s": r.captured_reads_per_s,
            "other_reads_per_s": r.other_reads_per_s, "capture_bytes": r.capture_bytes,
        })).collect::<Vec<_>>(),
    });
    (json, md)
}
