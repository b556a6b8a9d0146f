//! ROOT-ONLY: selection is per process, and complete (issue 34). A Node process that renames
//! itself with `process.title` (as Vitest, pm2 and NestJS apps do) before or after it starts
//! its Workers, selected by `--comm` under its name at exec or under the name it gave itself,
//! is profiled in all its threads: every thread's writes are bpftrace's, counted by pid and
//! tid over the process's whole life, under the one-shot profiler and under the agent (whose
//! SIGHUP, which looks at every process again, keeps it); and the report says what selected
//! it and how.

use std::{
    collections::BTreeMap,
    path::Path,
    process::{Child, Command},
    sync::mpsc,
    time::Duration,
};

use integration_tests::{
    Finished, Profiler, Workload, bpf_test, check_lost, fixture, installed_or_skip, process,
    scrape::Agent, wait_until,
};
use serde_json::Value;

/// The name the fixture gives itself.
const TITLE: &str = "mlp-myapp";
/// The issue's reproduction: 3 Workers reading a 64 KiB file 3,000 times each.
const WORKERS: usize = 3;
const ITERATIONS: u32 = 3000;

/// Writes by (tid) of one process.
type Writes = BTreeMap<u64, u64>;

/// The pid `WriteCount` is asked about when it is to say what it counted: above any
/// `pid_max` (2^22), so no process's.
const STOP: i32 = 0x7fff_0000;

/// bpftrace counting, by tid, the successful write acquisitions made by process `pid`'s
/// threads on its own mm (or on none: the last thread's exit_mmap, after exit_mm), once its
/// name is no longer sh's (the shell that execs node under this pid: its own writes, and
/// exec's before node is named, are not node's); killed on drop.
///
/// It is told when to say what it counted by a `getpgid` of a pid that cannot exist, not by
/// a signal (once in a few runs on this machine, bpftrace 0.17 did not end after SIGINT).
struct WriteCount {
    child: Child,
    out: mpsc::Receiver<String>,
}

impl WriteCount {
    /// Started and attached; None when bpftrace is missing (the test is then skipped).
    fn start(pid: u32) -> Option<Self> {
        let bin = installed_or_skip(integration_tests::bpftrace::bpftrace_bin(), "bpftrace")?;
        // It says "counting" at the first write of this test's process it sees: the probe
        // is attached then ("Attaching" comes before it is).
        let script = format!(
            r#"tracepoint:mmap_lock:mmap_lock_acquire_returned
{{
  if (pid == {me} && @ready == 0) {{ @ready = 1; printf("counting\n"); }}
  if (pid == {pid} && args->write && args->success && comm != "sh" &&
      ((uint64)args->mm == (uint64)curtask->mm || (uint64)curtask->mm == 0)) {{
    @w[tid] = count();
  }}
}}
tracepoint:syscalls:sys_enter_getpgid / pid == {me} && args->pid == {STOP} && @said == 0 /
{{ @said = 1; print(@w); printf("counted\n"); }}
"#,
            me = std::process::id()
        );
        let (child, out) = integration_tests::bpftrace::spawn(&bin, &script);
        // Attached once it says so: poked with a write of ours (an mmap) until it does. A
        // bpftrace that fails closes its output.
        let mut said = Vec::new();
        // (It compiles with LLVM first: a bound only on a bpftrace that neither counts nor
        // ends, scaled by wait_until.)
        wait_until(Duration::from_secs(120), Duration::from_millis(20), || {
            let p = integration_tests::map_anon(4096);
            // SAFETY: the mapping just made, unmapped once.
            unsafe { libc::munmap(p, 4096) };
            loop {
                match out.try_recv() {
                    Ok(l) if l == "counting" => return Ok(()),
                    Ok(l) => said.push(l),
                    Err(mpsc::TryRecvError::Empty) => {
                        return Err(format!("bpftrace is not counting: {said:?}"));
                    }
                    Err(mpsc::TryRecvError::Disconnected) => {
                        panic!("bpftrace ended: {said:?}")
                    }
                }
            }
        });
        Some(WriteCount { child, out })
    }

    /// What it counted (the counted process has exited: nothing is to come). It is stopped
    /// on drop.
    fn counted(self) -> Writes {
        let mut said = Vec::new();
        wait_until(Duration::from_secs(120), Duration::from_millis(50), || {
            // SAFETY: a plain system call; the pid cannot exist (ESRCH).
            unsafe { libc::getpgid(STOP) };
            loop {
                match self.out.try_recv() {
                    Ok(l) if l == "counted" => return Ok(()),
                    Ok(l) => said.push(l),
                    Err(mpsc::TryRecvError::Empty) => {
                        return Err(format!("bpftrace did not say what it counted: {said:?}"));
                    }
                    Err(mpsc::TryRecvError::Disconnected) => panic!("bpftrace ended: {said:?}"),
                }
            }
        });
        // `@w[4242]: 17`
        said.iter()
            .filter_map(|l| {
                let (tid, n) = l.strip_prefix("@w[")?.split_once("]:")?;
                Some((tid.trim().parse().ok()?, n.trim().parse().ok()?))
            })
            .collect()
    }
}

impl Drop for WriteCount {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `title.js TITLE WHEN` (fixtures/title.js) behind a shell that waits for a line before it
/// execs node, so that its pid is known before node runs: node is then counted from its exec.
/// The shell printed "ready".
fn titled(dir: &Path, when: &str) -> Workload {
    let file = dir.join("data.bin");
    std::fs::write(&file, vec![7u8; 64 * 1024]).unwrap();
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "echo ready; read line; exec node \"$@\"", "sh"])
        .arg(fixture("title.js"))
        .args([TITLE, when])
        .args([WORKERS.to_string(), ITERATIONS.to_string()])
        .arg(&file);
    Workload::spawn(cmd)
}

/// Lets the shell exec node and waits for node's "ready": its Workers' tids.
fn exec_node(w: &mut Workload) -> Vec<u64> {
    w.send("exec");
    let ids: Value = serde_json::from_str(&w.read_line()).expect("the fixture's tids");
    assert_eq!(ids["main"], w.pid, "node runs under the shell's pid");
    assert_eq!(w.read_line(), "ready");
    let workers: Vec<u64> = ids["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    assert_eq!(workers.len(), WORKERS);
    workers
}

/// The Workers work, then node exits: its whole life is in both counts.
fn work_then_exit(w: &mut Workload) {
    w.send("go");
    assert_eq!(w.read_line(), "done");
    w.send("exit");
    assert!(w.wait().success());
}

/// Ends a one-shot run (SIGINT) and returns what it reported.
fn stop(p: Profiler) -> Finished {
    p.signal(libc::SIGINT);
    let out = p.finish();
    assert!(out.status.success(), "{}", out.stderr);
    out
}

/// A process's own threads' writes in a report, by tid (foreign takers and the profiler's
/// threads apart, as bpftrace's count by pid has them).
fn own_writes(p: &Value) -> Writes {
    p["threads"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["role"] != "foreign" && t["role"] != "profiler")
        .map(|t| {
            (
                t["tid"].as_u64().unwrap(),
                t["write"]["count"].as_u64().unwrap(),
            )
        })
        .filter(|&(_, n)| n > 0)
        .collect()
}

/// A process's thread rows, in short: tid, role, writes.
fn rows(p: &Value) -> Vec<(u64, String, u64)> {
    (p["threads"].as_array().unwrap().iter())
        .map(|t| {
            let role = t["role"].as_str().unwrap_or_default().to_string();
            let tid = t["tid"].as_u64().unwrap();
            (tid, role, t["write"]["count"].as_u64().unwrap())
        })
        .collect()
}

/// Every Worker has its row, as a `worker`, with the writes bpftrace counted for it (its
/// 3,000 reads' Buffers: some writes at least).
fn assert_workers(p: &Value, workers: &[u64], counted: &Writes) {
    for &tid in workers {
        let row = p["threads"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["tid"] == tid)
            .unwrap_or_else(|| panic!("Worker {tid} is not in the report: {:?}", rows(p)));
        assert_eq!(row["role"], "worker", "{row}");
        let writes = row["write"]["count"].as_u64().unwrap();
        assert!(writes > 0, "Worker {tid} counted no write");
        assert_eq!(Some(&writes), counted.get(&tid), "Worker {tid}");
    }
}

/// `mmaplock-prof --comm node` over a node that sets `process.title` `when` its Workers
/// start: the process, selected at its exec, has every thread's writes, bpftrace's exactly,
/// the Workers' included, and says it was selected by `--comm node` at exec.
fn renamed_node_is_counted_whole(when: &str) {
    let Some(dir) = bpf_test() else { return };
    let mut w = titled(dir.path(), when);
    let Some(count) = WriteCount::start(w.pid) else {
        return;
    };
    let prof = Profiler::start(&["--comm", "node", "-i", "0", "--stack-sample", "0"]);
    let workers = exec_node(&mut w);
    work_then_exit(&mut w);
    let out = stop(prof);
    let counted = count.counted();
    let s = out.summary();
    assert_eq!(check_lost(s), 0, "{}", s["lost"]);
    let p = process(s, w.pid).expect("the renamed node is profiled");
    assert_workers(p, &workers, &counted);
    let own = own_writes(p);
    assert_eq!(
        own, counted,
        "every thread's writes, as bpftrace counted them"
    );
    assert_eq!(
        p["selected_by"],
        serde_json::json!({"comm": "node", "how": "exec"})
    );
    eprintln!(
        "title {when} the Workers: {} writes, {} by the Workers",
        own.values().sum::<u64>(),
        workers.iter().map(|t| counted[t]).sum::<u64>()
    );
}

/// The issue's reproduction: `process.title = 'myapp'`, then 3 Workers (born under the new
/// name) each read a 64 KiB file 3,000 times; `--comm node` used to count only the main
/// thread's and V8's writes.
#[test]
fn a_node_titled_before_its_workers_start_is_counted_in_every_thread() {
    renamed_node_is_counted_whole("before");
}

#[test]
fn a_node_titled_after_its_workers_start_is_counted_in_every_thread() {
    renamed_node_is_counted_whole("after");
}

/// `--comm myapp` selects the node that named itself so, at its rename, and says so (JSON and
/// text); its Workers, all born after the rename, have every write bpftrace counted for them.
/// Titled after its Workers started, those (which resolved "not profiled" under the old name)
/// are profiled from the rename on.
#[test]
fn the_name_a_process_gave_itself_selects_it_from_its_rename() {
    let Some(dir) = bpf_test() else { return };
    for when in ["before", "after"] {
        let mut w = titled(dir.path(), when);
        let Some(count) = WriteCount::start(w.pid) else {
            return;
        };
        let prof = Profiler::start(&["--comm", TITLE, "-i", "0", "--stack-sample", "0"]);
        let workers = exec_node(&mut w);
        work_then_exit(&mut w);
        let out = stop(prof);
        let counted = count.counted();
        let s = out.summary();
        assert_eq!(check_lost(s), 0, "{}", s["lost"]);
        let p = process(s, w.pid).expect("the renamed node is profiled");
        assert_eq!(
            p["selected_by"],
            serde_json::json!({"comm": TITLE, "how": "rename"}),
            "title {when} the Workers"
        );
        if when == "before" {
            assert_workers(p, &workers, &counted);
        } else {
            for &tid in &workers {
                let row = p["threads"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|t| t["tid"] == tid);
                let writes = row.map_or(0, |r| r["write"]["count"].as_u64().unwrap());
                assert!(
                    writes > 0 && writes <= counted[&tid],
                    "Worker {tid}: {writes} writes from the rename on, {} in its life",
                    counted[&tid]
                );
            }
        }
        // The text report says it after the process's name.
        let text = integration_tests::report_text(&out, &dir.path().join(format!("{when}.json")));
        let heading = text
            .lines()
            .find(|l| l.starts_with(&format!("process {} (", w.pid)))
            .unwrap_or_else(|| panic!("process {} not in:\n{text}", w.pid));
        assert!(
            heading.ends_with(&format!(
                "), selected by --comm {TITLE} when it renamed itself"
            )),
            "{heading}"
        );
    }
}

/// The agent's writes of one process (`--pid-label`), by role, its threads' own (the
/// profiler's apart, as bpftrace's count by pid has them).
fn agent_writes_by_role(text: &str, pid: u32) -> BTreeMap<String, u64> {
    let label = |l: &str, k: &str| -> Option<String> {
        let from = l.find(&format!("{k}=\""))? + k.len() + 2;
        Some(l[from..from + l[from..].find('"')?].to_string())
    };
    let mut out = BTreeMap::new();
    for l in text.lines() {
        if !l.starts_with("mmaplock_acquisitions_total{")
            || !l.contains(&format!("pid=\"{pid}\""))
            || !l.contains("op=\"write\"")
        {
            continue;
        }
        let Some(role) = label(l, "role").filter(|r| r != "profiler" && r != "foreign") else {
            continue;
        };
        let n: f64 = l.rsplit(' ').next().unwrap().parse().unwrap();
        *out.entry(role).or_default() += n as u64;
    }
    out
}

/// The same under `mmaplock-prof agent --comm node`: a node titled before or after its
/// Workers start has every write bpftrace counted, its Workers' under the role `worker`.
#[test]
fn the_agent_counts_every_thread_of_a_node_that_retitles_itself() {
    let Some(dir) = bpf_test() else { return };
    let agent = Agent::start(&["--comm", "node", "--pid-label", "-i", "0.2"]);
    for when in ["before", "after"] {
        let mut w = titled(dir.path(), when);
        let Some(count) = WriteCount::start(w.pid) else {
            return;
        };
        let workers = exec_node(&mut w);
        work_then_exit(&mut w);
        let counted = count.counted();
        let total: u64 = counted.values().sum();
        let by_workers: u64 = workers.iter().map(|t| counted[t]).sum();
        assert!(by_workers > 0, "{counted:?}");
        // Once the agent has read the process's last entries (it is gone).
        let got = wait_until(Duration::from_secs(20), Duration::from_millis(300), || {
            let got = agent_writes_by_role(&agent.metrics(), w.pid);
            if got.values().sum::<u64>() == total && got.get("worker") == Some(&by_workers) {
                Ok(got)
            } else {
                Err(format!(
                    "title {when} the Workers: the agent's writes by role {got:?}; bpftrace: \
                     {total} in all, {by_workers} by the Workers"
                ))
            }
        });
        eprintln!("title {when} the Workers, under the agent: {got:?}");
    }
}

/// The agent re-reads its selectors on SIGHUP and looks at every process again: a node
/// selected at its exec as `node`, which has named itself otherwise since, stays selected
/// (the name its exec gave it still matches), and its Workers' writes after the SIGHUP are
/// all counted. A process named for a selector added by the new file, found only by the scan
/// that follows, says when that scan has run.
#[test]
fn a_retitled_node_stays_selected_when_the_agent_reloads() {
    let Some(dir) = bpf_test() else { return };
    let config = dir.path().join("selectors");
    std::fs::write(&config, "# nothing more yet\n").unwrap();
    let agent = Agent::start(&[
        "--comm",
        "node",
        "--config",
        config.to_str().unwrap(),
        "--pid-label",
        "-i",
        "0.2",
    ]);
    let mut w = titled(dir.path(), "before");
    let Some(count) = WriteCount::start(w.pid) else {
        return;
    };
    let workers = exec_node(&mut w);
    // Named before the new selector exists: only the scan after the SIGHUP finds it.
    let marker = "mlp-reloaded";
    let mut found_by_scan = Workload::churn(1, 1, Some(marker));
    std::fs::write(&config, format!("comm {marker}\n")).unwrap();
    // SAFETY: a signal to our own child.
    assert_eq!(
        unsafe { libc::kill(agent.child.id() as i32, libc::SIGHUP) },
        0
    );
    let selector = format!("mmaplock_selector_matches{{selector=\"comm {marker}\"}} 1");
    wait_until(Duration::from_secs(20), Duration::from_millis(100), || {
        let m = agent.metrics();
        if m.lines().any(|l| l == selector) {
            Ok(())
        } else {
            Err(format!(
                "the agent did not scan with the new selectors:\n{m}"
            ))
        }
    });
    work_then_exit(&mut w);
    found_by_scan.go();
    assert!(found_by_scan.wait().success());
    let counted = count.counted();
    let total: u64 = counted.values().sum();
    let by_workers: u64 = workers.iter().map(|t| counted[t]).sum();
    wait_until(Duration::from_secs(20), Duration::from_millis(300), || {
        let got = agent_writes_by_role(&agent.metrics(), w.pid);
        if got.values().sum::<u64>() == total && got.get("worker") == Some(&by_workers) {
            Ok(())
        } else {
            Err(format!(
                "after the SIGHUP, the agent's writes by role {got:?}; bpftrace: {total} in \
                 all, {by_workers} by the Workers"
            ))
        }
    });
}

/// Node 24 and 26 name their main thread (`MainThread`, `node-MainThread`), so a node
/// process's command name changes once it runs: `--comm node` still selects it in all its
/// threads, the main one included, whether it runs before the profiler (by its executable's
/// name: `running`) or is started under it (at its exec: `exec`).
#[test]
fn comm_node_selects_node_24_and_26_that_name_their_main_thread() {
    let Some(_dir) = bpf_test() else { return };
    // Allocations of a MiB, four kept: an mmap and a munmap each, from the main thread.
    let script = "const k=[];const t=setInterval(()=>{k.push(Buffer.alloc(1<<20).fill(1));if(k.length>4)k.shift();},5);process.stdin.on('data',()=>{clearInterval(t);process.exit(0)});process.stdout.write('ready\\n');";
    for major in [24, 26] {
        let Some(node) = integration_tests::nodes::node_or_skip(major) else {
            continue;
        };
        let start = || {
            let mut cmd = node.command();
            cmd.args(["-e", script]);
            // (Returns once it has said "ready".)
            Workload::spawn(cmd)
        };
        let mut before = start();
        // Its main thread renamed itself as it started.
        let named = wait_until(Duration::from_secs(30), Duration::from_millis(50), || {
            let c =
                std::fs::read_to_string(format!("/proc/{}/comm", before.pid)).unwrap_or_default();
            match c.trim() {
                "node" | "" => Err(format!("node {major} has not named its main thread")),
                other => Ok(other.to_string()),
            }
        });
        let prof = Profiler::start(&["--comm", "node", "--all-processes", "-i", "0"]);
        let mut under = start();
        std::thread::sleep(Duration::from_millis(500));
        for w in [&mut before, &mut under] {
            w.send("exit");
            assert!(w.wait().success());
        }
        let out = stop(prof);
        let s = out.summary();
        for (w, how) in [(&before, "running"), (&under, "exec")] {
            let p =
                process(s, w.pid).unwrap_or_else(|| panic!("node {major} ({how}) is not selected"));
            assert_eq!(p["selected_by"]["comm"], "node", "{}", p["selected_by"]);
            assert_eq!(p["selected_by"]["how"], how, "node {major}");
            let main = p["threads"]
                .as_array()
                .unwrap()
                .iter()
                .find(|t| t["tid"] == w.pid && t["role"] == "main")
                .unwrap_or_else(|| panic!("node {major} ({how}): its main thread"));
            assert!(main["write"]["count"].as_u64().unwrap() > 0, "{main}");
        }
        eprintln!("node {major}: main thread named {named}; selected running and at exec");
    }
}
