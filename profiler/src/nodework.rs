//! Runs a Node.js workload under a freshly attached profiler restricted to its processes: k
//! Worker threads in one process, or k processes side by side, all started together after a
//! ready/go handshake over stdio, profiled through the shared run loop until they exit. The
//! demo and the study both run their workloads this way.
//!
//! The workload script's protocol: `node SCRIPT workers K ARGS...` or `node SCRIPT process 1
//! ARGS...` prints `ready`, waits for a line on stdin, does its work, and prints one JSON line
//! `{"ops":N,"elapsed_ms":T,...}`.

use std::{
    io,
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use serde::Serialize;
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines},
    process::{Child, ChildStdout, Command},
};

use crate::{
    aggregation::{SideStats, Window},
    kernel::collector::{Collector, CollectorConfig, CollectorError, Floor},
    output::report::Report,
    run::{Driver, LoopConfig, Profile, Session, SessionError, Targets},
};

/// The workload script, in this protocol: the demo's reads, or a study scenario's (with the
/// study's module beside it).
pub const WORKLOAD_JS: &str = include_str!("../demo/workload.js");

/// Give up on a workload that does not answer (a broken node, a stuck machine).
const STEP_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Debug, thiserror::Error)]
pub enum NodeRunError {
    #[error("cannot run Node.js ({0}): {1}; install Node.js or pass --node PATH")]
    NoNode(PathBuf, #[source] io::Error),
    #[error("the Node.js workload failed: {0}")]
    Workload(String),
    #[error(transparent)]
    Collector(#[from] CollectorError),
    #[error(transparent)]
    Session(#[from] SessionError),
}

/// What to run.
pub struct NodeSpec<'a> {
    pub node: &'a Path,
    pub script: &'a Path,
    /// `workers` (k Worker threads of one process) or `processes` (k processes).
    pub mode: &'static str,
    pub k: u32,
    /// The script's arguments after the mode and k.
    pub args: Vec<String>,
    /// Extra environment of the node processes.
    pub env: Vec<(String, String)>,
    pub stack_sample: u32,
    pub blockers: bool,
}

/// One profiled run.
#[derive(Debug, Serialize)]
pub struct NodeRun {
    pub mode: &'static str,
    /// Operations done in all (the script's `ops`).
    pub reads: u64,
    pub elapsed_s: f64,
    pub reads_per_s: f64,
    /// The profiler's summary of the run's process(es).
    pub report: Report,
    /// Write side over all of the run's processes.
    #[serde(skip)]
    pub write: SideStats,
    /// What went wrong while profiling, if anything: the run reports what was gathered
    /// until then, and its caller ends with an error after reporting it.
    #[serde(skip)]
    pub failure: Option<SessionError>,
}

struct Participant {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

async fn next_line(p: &mut Participant) -> Result<String, NodeRunError> {
    match tokio::time::timeout(STEP_TIMEOUT, p.lines.next_line()).await {
        Ok(Ok(Some(l))) => Ok(l),
        Ok(Ok(None)) => Err(NodeRunError::Workload("node exited early".into())),
        Ok(Err(e)) => Err(NodeRunError::Workload(e.to_string())),
        Err(_) => Err(NodeRunError::Workload(
            "no answer from node in 300 s".into(),
        )),
    }
}

async fn spawn(spec: &NodeSpec<'_>, wmode: &str, k: u32) -> Result<Participant, NodeRunError> {
    let mut child = Command::new(spec.node)
        .arg(spec.script)
        .arg(wmode)
        .arg(k.to_string())
        .args(&spec.args)
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| NodeRunError::NoNode(spec.node.to_path_buf(), e))?;
    let stdout = child.stdout.take().expect("piped stdout");
    let mut p = Participant {
        child,
        lines: BufReader::new(stdout).lines(),
    };
    let l = next_line(&mut p).await?;
    if l != "ready" {
        return Err(NodeRunError::Workload(format!("unexpected output {l:?}")));
    }
    Ok(p)
}

/// Runs one mode under a freshly attached profiler restricted to its processes.
pub async fn run_node(spec: &NodeSpec<'_>) -> Result<NodeRun, NodeRunError> {
    let (n_procs, k_arg, wmode) = if spec.mode == "workers" {
        (1, spec.k, "workers")
    } else {
        (spec.k, 1, "process")
    };
    let mut procs = Vec::new();
    for _ in 0..n_procs {
        procs.push(spawn(spec, wmode, k_arg).await?);
    }
    let pids: Vec<u32> = procs.iter().filter_map(|p| p.child.id()).collect();
    let collector = Collector::start(&CollectorConfig {
        pids: pids.clone(),
        comms: vec![],
        max_threads: crate::cli::Config::MAX_THREADS,
        bpf_stats: false,
        stack_sample: spec.stack_sample,
        writes_only: false,
        floor: Floor::Off,
        selection: false,
        children: false,
        blockers: spec.blockers,
        mode: crate::vocab::Mode::Full,
        sample_floor_ms: 0,
        floor_after_first: false,
        max_stack_rate: 0,
    })?;
    let mut session = Session::new(collector, None, &pids)?;
    // The command set the profiler's options, not its user: no advice names one.
    session.advice = crate::run::lost::Advice::OwnWorkload;
    // Start everyone together.
    for p in &mut procs {
        if let Some(stdin) = p.child.stdin.as_mut() {
            stdin
                .write_all(b"go\n")
                .await
                .map_err(|e| NodeRunError::Workload(e.to_string()))?;
        }
    }
    // The shared run loop, until every participant has exited (each has printed its one
    // result line, which waits in its pipe), classifying threads and taking stacks as they
    // come.
    struct Quiet;
    impl Driver for Quiet {
        fn after_poll(&mut self, _: &mut Profile) -> Result<(), SessionError> {
            Ok(())
        }
    }
    let targets = Targets::open(&pids)?;
    // A failure while running ends the loop, not the run: what was gathered until then is
    // finished and reported like the rest (the failure is said).
    let mut failure = None;
    if let Err(e) = session
        .run(
            LoopConfig {
                period: Duration::from_secs(1),
                duration: None,
                targets: Some(&targets),
                signals_end: true,
            },
            &mut Quiet,
        )
        .await?
    {
        eprintln!(
            "mmaplock-prof: {e}; the {} run reports what was gathered until then",
            spec.mode
        );
        failure = Some(e);
    }
    let mut reads = 0u64;
    let mut elapsed_ms = 0f64;
    for p in &mut procs {
        let line = next_line(p).await?;
        let v: serde_json::Value = serde_json::from_str(&line)
            .map_err(|e| NodeRunError::Workload(format!("bad result {line:?}: {e}")))?;
        reads += v["ops"].as_u64().unwrap_or(0);
        elapsed_ms = elapsed_ms.max(v["elapsed_ms"].as_f64().unwrap_or(0.0));
        let status = p
            .child
            .wait()
            .await
            .map_err(|e| NodeRunError::Workload(e.to_string()))?;
        if !status.success() {
            return Err(NodeRunError::Workload(format!("node exited with {status}")));
        }
    }
    // Every participant has exited, its exit_mmap included: the kernel maps are complete.
    if let Err(e) = session.finish().await {
        eprintln!(
            "mmaplock-prof: {e}; the {} run reports what was gathered until then",
            spec.mode
        );
        failure.get_or_insert(e);
    }
    let profile = &mut session.profile;
    let mut report = profile.summary();
    report.processes.retain(|p| pids.contains(&p.pid));
    crate::output::findings::attach(&mut report, None);
    let write = pooled_writes(&profile.total_window(), &pids);
    let elapsed_s = elapsed_ms / 1e3;
    Ok(NodeRun {
        mode: spec.mode,
        reads,
        elapsed_s,
        reads_per_s: if elapsed_s > 0.0 {
            reads as f64 / elapsed_s
        } else {
            0.0
        },
        report,
        write,
        failure,
    })
}

/// Write acquisitions of every cause, pooled over all threads of the given processes (each
/// process has its own lock; a run's `write` is their sum, its histogram their merge).
fn pooled_writes(window: &Window, pids: &[u32]) -> SideStats {
    let mut write = SideStats::default();
    for t in window
        .processes
        .iter()
        .filter(|(p, _)| pids.contains(&p.pid))
        .flat_map(|(_, threads)| threads.values())
    {
        write.merge(&t.write());
    }
    write
}

#[cfg(test)]
mod tests {
    use profiler_common::cause;

    use super::*;
    use crate::{
        aggregation::{DurationHist, ThreadAgg},
        output::report::Stats,
        vocab::ids::{ProcId, ThreadId},
    };

    /// `n` acquisitions that each waited `wait_ns` (log2 bucket of the kernel's).
    fn side(n: u64, bucket: usize, wait_ns: u64) -> SideStats {
        let mut wait = DurationHist::default();
        wait.add(bucket, n);
        wait.sum = n * wait_ns;
        wait.max = wait_ns;
        SideStats {
            count: n,
            failed: 0,
            wait,
            hold: DurationHist::default(),
        }
    }

    fn thread(pid: u32, writes: &[(u32, SideStats)], read: SideStats) -> ThreadAgg {
        let mut t = ThreadAgg {
            tgid: pid,
            comm: [0; profiler_common::COMM_LEN],
            fsbase: 0,
            read,
            writes: Default::default(),
            downgrade: SideStats::default(),
            role: None,
            time: Default::default(),
            lived_ns: None,
        };
        for (c, s) in writes {
            t.writes.entry(*c).merge(s);
        }
        t
    }

    #[test]
    fn writes_are_pooled_over_the_runs_processes_only() {
        let mut w = Window::default();
        let mut add = |pid: u32, tid: u32, t: ThreadAgg| {
            w.processes
                .entry(ProcId::new(pid, 1))
                .or_default()
                .insert(ThreadId::new(tid, 1), t);
        };
        // Process 10: two threads, 3 mmaps of ~600 ns and 1 munmap of ~600 ns, then 4
        // mprotects of ~600 ns; its reads are not writes.
        add(
            10,
            10,
            thread(
                10,
                &[
                    (cause::MMAP, side(3, 10, 600)),
                    (cause::MUNMAP, side(1, 10, 600)),
                ],
                side(50, 20, 1_000_000),
            ),
        );
        add(
            10,
            11,
            thread(
                10,
                &[(cause::MPROTECT, side(4, 10, 600))],
                SideStats::default(),
            ),
        );
        // Process 20: 2 mprotects that waited ~1 ms.
        add(
            20,
            20,
            thread(
                20,
                &[(cause::MPROTECT, side(2, 20, 1_000_000))],
                SideStats::default(),
            ),
        );
        // Process 30 is not the run's.
        add(
            30,
            30,
            thread(
                30,
                &[(cause::MMAP, side(100, 25, 30_000_000))],
                SideStats::default(),
            ),
        );

        let pooled = pooled_writes(&w, &[10, 20]);
        assert_eq!(pooled.count, 10);
        assert_eq!(pooled.wait.sum, 8 * 600 + 2 * 1_000_000);
        assert_eq!(pooled.wait.max, 1_000_000);
        assert_eq!((pooled.wait.bucket(10), pooled.wait.bucket(20)), (8, 2));
        assert_eq!(pooled.wait.bucket(25), 0);
        // The STATS of results.json: p50 in the 600 ns bucket, p99 in the 1 ms one.
        let stats = Stats::new(&pooled);
        assert_eq!(stats.wait_ns.mean, (8.0 * 600.0 + 2e6) / 10.0);
        assert!(stats.wait_ns.p50 < 1024, "{}", stats.wait_ns.p50);
        assert!(stats.wait_ns.p99 >= 524_288, "{}", stats.wait_ns.p99);

        assert_eq!(pooled_writes(&w, &[20]).count, 2);
        assert!(pooled_writes(&w, &[]).is_empty());
    }
}
