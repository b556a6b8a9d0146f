//! The lanes fixture as the advice section drives it (tests/src/lanes.rs drives it so for the
//! tests): `lanes.node` built with gcc, `hashserver.js` started in a shape (its CPUs, its
//! priority, its env), and `loadgen.js` run against it to its end.

use std::{
    io::{BufRead, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{ChildStdin, ChildStdout, Command, Stdio},
};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use crate::bench::procfs::Guard;
use crate::workspace_root;

/// A shape of the story's (its `Shape`), with the finding it heads and that finding's advice.
pub struct Shape {
    pub name: &'static str,
    /// `hash(block_kib, lanes, passes, 0, 0)` per request.
    block_kib: u64,
    lanes: u64,
    passes: u64,
    conns: u64,
    requests: u64,
    /// UV_THREADPOOL_SIZE.
    pool: u64,
    cpus: &'static str,
    realtime: bool,
    client_cpus: &'static str,
    pub finding: &'static str,
    pub advice: (&'static str, &'static str),
}

/// CPU-bound: eight lanes per call, four calls at once, on one CPU (thread creation heads,
/// latency only); idle cores: one lane per call, two at once, on two CPUs at real-time
/// priority (the blocks' unmaps head, throughput).
pub const SHAPES: [Shape; 2] = [
    Shape {
        name: "CPU-bound",
        block_kib: 36 * 1024,
        lanes: 8,
        passes: 1,
        conns: 4,
        requests: 60,
        pool: 4,
        cpus: "0",
        realtime: false,
        client_cpus: "1",
        finding: "thread-stacks",
        advice: ("GLIBC_TUNABLES", "glibc.pthread.stack_cache_size=536870912"),
    },
    Shape {
        name: "idle cores",
        block_kib: 36 * 1024,
        lanes: 1,
        passes: 0,
        conns: 2,
        requests: 150,
        pool: 2,
        cpus: "0,1",
        realtime: true,
        client_cpus: "0,1",
        finding: "mmap-threshold",
        advice: ("LANES_FREE_IN_PIECES", "1"),
    },
];

/// Why this host cannot run the shapes (tests/src/lanes.rs `can_shape`, and the addon's
/// build), if it cannot.
pub fn cannot_shape() -> Option<String> {
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        return Some("the lanes shapes need two CPUs".into());
    }
    let ok = |c: &mut Command| c.stdout(Stdio::null()).stderr(Stdio::null()).status();
    if !ok(Command::new("chrt").args(["-r", "1", "taskset", "-c", "0", "true"]))
        .is_ok_and(|s| s.success())
    {
        return Some("chrt -r (real-time scheduling) or taskset cannot run here".into());
    }
    if !ok(Command::new("node").arg("--version")).is_ok_and(|s| s.success()) {
        return Some("no node".into());
    }
    if !Path::new("/usr/include/node/node_api.h").exists() {
        return Some("no Node headers (/usr/include/node/node_api.h) to build the addon".into());
    }
    None
}

/// Builds `lanes.node` into `dir` (as tests/src/binaries.rs `gcc` does).
pub fn build_addon(dir: &Path) -> Result<PathBuf> {
    let out = dir.join("lanes.node");
    let status = Command::new("gcc")
        .args([
            "-shared",
            "-fPIC",
            "-O2",
            "-pthread",
            "-I/usr/include/node",
            "-o",
        ])
        .arg(&out)
        .arg(fixture("lanes.c"))
        .status()
        .context("gcc")?;
    if !status.success() {
        bail!("building lanes.c failed");
    }
    Ok(out)
}

fn fixture(name: &str) -> PathBuf {
    workspace_root().join("tests/fixtures/addon").join(name)
}

/// A running `hashserver.js`.
pub struct Server {
    pub child: Guard,
    stdin: ChildStdin,
    out: BufReader<ChildStdout>,
    pub port: u16,
}

impl Server {
    pub fn start(addon: &Path, s: &Shape, advice: bool) -> Result<Server> {
        let mut cmd = Command::new("taskset");
        cmd.args(["-c", s.cpus]);
        if s.realtime {
            cmd.args(["chrt", "-r", "1"]);
        }
        cmd.arg("node")
            .arg(fixture("hashserver.js"))
            .arg(addon)
            .args([s.block_kib, s.lanes, s.passes, 0, 0].map(|n| n.to_string()))
            .env("UV_THREADPOOL_SIZE", s.pool.to_string());
        if advice {
            cmd.env(s.advice.0, s.advice.1);
        }
        let mut child = Guard(
            (cmd.stdin(Stdio::piped()).stdout(Stdio::piped()))
                .spawn()
                .with_context(|| format!("start {cmd:?}"))?,
        );
        let stdin = child.0.stdin.take().context("stdin")?;
        let mut out = BufReader::new(child.0.stdout.take().context("stdout")?);
        let first = line(&mut out)?;
        let port: Value = serde_json::from_str(&first).with_context(|| format!("{first:?}"))?;
        let port = port["port"].as_u64().context("port")? as u16;
        if line(&mut out)? != "ready" {
            bail!("hashserver.js was not ready");
        }
        Ok(Server {
            child,
            stdin,
            out,
            port,
        })
    }

    /// "exit": it must have served every request.
    pub fn stop(mut self, s: &Shape) -> Result<()> {
        writeln!(self.stdin, "exit")?;
        let calls: Value = serde_json::from_str(&line(&mut self.out)?)?;
        let _ = self.child.0.wait();
        if calls["calls"] != s.requests {
            bail!("{}: the server made {calls} calls", s.name);
        }
        Ok(())
    }
}

fn line(r: &mut impl BufRead) -> Result<String> {
    let mut l = String::new();
    if r.read_line(&mut l)? == 0 {
        bail!("a fixture ended early");
    }
    Ok(l.trim().to_string())
}

/// Runs the client to its end against `server`: its requests per second.
pub fn load(s: &Shape, server: &Server) -> Result<f64> {
    let mut cmd = Command::new("taskset");
    cmd.args(["-c", s.client_cpus, "node"])
        .arg(fixture("loadgen.js"))
        .args([server.port.to_string(), "/hash".into()])
        .args([s.conns, s.requests].map(|n| n.to_string()));
    let mut c = Guard(
        (cmd.stdin(Stdio::piped()).stdout(Stdio::piped()))
            .spawn()
            .context("start loadgen.js")?,
    );
    let mut out = BufReader::new(c.0.stdout.take().context("stdout")?);
    if line(&mut out)? != "ready" {
        bail!("loadgen.js was not ready");
    }
    writeln!(c.0.stdin.as_mut().context("stdin")?, "go")?;
    let r: Value = serde_json::from_str(&line(&mut out)?)?;
    let _ = c.0.wait();
    if r["errors"] != 0 {
        bail!("{}: the client saw errors: {r}", s.name);
    }
    r["per_s"].as_f64().context("per_s")
}

/// Requests per second of one run with no profiler.
pub fn throughput(addon: &Path, s: &Shape, advice: bool) -> Result<f64> {
    let server = Server::start(addon, s, advice)?;
    let per_s = load(s, &server)?;
    server.stop(s)?;
    Ok(per_s)
}
