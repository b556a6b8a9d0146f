//! ROOT-ONLY: Node.js in real containers (podman, runtime runc; `cargo xtask test` installs
//! both), from an image the tests build from this host's node and its libraries
//! (`integration_tests::containers`: node at `/opt/node/bin/node`, glibc a byte-identical copy
//! of the host's, another inode on another device).
//!
//! What a container changes, each against ground truth: the agent's `process` and `cgroup`
//! labels when runc's init is selected before it execs node (`podman create; init; start`) and
//! in a plain `podman run`; thread roles (the Workers' tids as the container sees them, mapped
//! to the host's through NSpid); JavaScript names from the perf map in the container's own
//! /tmp, and from V8's heap with no flag; the files of the stacks named as the container sees
//! them, after it has exited.

use std::{collections::BTreeMap, time::Duration};

use integration_tests::{
    Profiler, Workload, assert_mmaps_named,
    containers::{self, Container, FIXTURES_IN_IMAGE, NODE_IN_IMAGE},
    metric_sum, process, require_root_and_tracepoints,
    scrape::Agent,
    skip_because, wait_until,
};
use serde_json::Value;

/// Root, the tracepoints, podman and the node image; None (the test skipped) without them.
fn image() -> Option<String> {
    if !require_root_and_tracepoints() {
        return None;
    }
    match containers::node_image() {
        Ok(tag) => Some(tag),
        Err(why) => {
            skip_because(&format!("no container image: {why}"));
            None
        }
    }
}

/// The cgroup under which podman puts its containers here (runc, cgroupfs manager).
fn libpod_parent() -> String {
    let manager = containers::output(containers::podman().args([
        "info",
        "--format",
        "{{.Host.CgroupManager}}",
    ]))
    .unwrap_or_default();
    if manager == "systemd" {
        "/machine.slice".into()
    } else {
        "/libpod_parent".into()
    }
}

/// Waits until the agent's metrics satisfy `done`; the last page. A bound on what a broken
/// agent might never serve: 20 s on the reference machine, scaled by `wait_until`.
fn metrics_until(agent: &Agent, done: impl Fn(&str) -> bool) -> String {
    wait_until(Duration::from_secs(20), Duration::from_millis(200), || {
        let text = agent.metrics();
        if done(&text) {
            Ok(text)
        } else {
            Err(format!("the agent's metrics never got there:\n{text}"))
        }
    })
}

/// The records (whole lines) in an NDJSON file the agent is writing; none before it exists.
fn records(path: &std::path::Path) -> usize {
    let text = std::fs::read(path).unwrap_or_default();
    text.iter().filter(|&&b| b == b'\n').count()
}

/// Whether our child `pid` has ended (left unreaped, for whoever waits for it).
fn ended(pid: u32) -> bool {
    // SAFETY: a siginfo_t of our own for waitid to fill.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: asking, without waiting or reaping, about our own child.
    let r = unsafe {
        libc::waitid(
            libc::P_PID,
            pid,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    // SAFETY: waitid filled `info` (si_pid stays 0 while the child runs).
    r == 0 && unsafe { info.si_pid() } != 0
}

/// The `process` labels of every series of the agent's page in `cgroup`.
fn processes_in(text: &str, cgroup: &str) -> std::collections::BTreeSet<String> {
    let needle = format!("cgroup=\"{cgroup}\"");
    text.lines()
        .filter(|l| !l.starts_with('#') && l.contains(&needle))
        .filter_map(|l| {
            let rest = l.split_once("process=\"")?.1;
            Some(rest.split_once('"')?.0.to_string())
        })
        .collect()
}

/// `podman create`, `podman init`, ten of the agent's intervals, `podman start`: runc's init
/// (`runc:[2:INIT]`) waits in the container's cgroup, selected by the agent, before it execs
/// node. Every series and every NDJSON record of that cgroup must name node, none runc's init.
#[test]
fn a_container_started_in_steps_is_named_node_in_its_own_cgroup() {
    let Some(image) = image() else { return };
    let c = Container::new_name("steps");
    // 100 Buffers of 1 MiB: each its own mmap, by the main thread; then node lives on a
    // while, several of the agent's 0.2 s readings finding it alive as node: 1 s on the
    // reference machine, scaled (a loaded host's readings come late).
    let linger = integration_tests::scaled(Duration::from_secs(1)).as_millis();
    let script = format!(
        "let s = 0; for (let i = 0; i < 100; i++) {{ const b = Buffer.allocUnsafeSlow(1 << 20); b.fill(i); s += b[0]; }} setTimeout(() => process.exit(s < 0 ? 1 : 0), {linger});"
    );
    let id = c
        .create(
            &image,
            &["-e", "MALLOC_MMAP_THRESHOLD_=131072"],
            &["-e", &script],
        )
        .expect("podman create");
    c.verb("init").expect("podman init");
    let init = c.host_pid();
    assert_ne!(init, 0, "runc's init runs after podman init");
    let comm = std::fs::read_to_string(format!("/proc/{init}/comm")).unwrap();
    assert_eq!(comm.trim_end(), "runc:[2:INIT]");
    let cgroup = containers::cgroup_of(init).expect("its cgroup");
    assert!(cgroup.ends_with(&id), "{cgroup} is the container's ({id})");
    let dir = tempfile::tempdir().unwrap();
    let ndjson = dir.path().join("agent.ndjson");
    let agent = Agent::start(&[
        "--cgroup",
        &cgroup,
        "-i",
        "0.2",
        "-o",
        ndjson.to_str().unwrap(),
    ]);
    // Selected as runc's init, and only that, for a while: ten of the agent's readings, each
    // an NDJSON record (its 0.2 s intervals: the scenario's clock; an agent that wrote none
    // would run on: a bound, scaled by wait_until).
    metrics_until(&agent, |t| {
        integration_tests::metric_gauge(t, "mmaplock_tracked_processes") == 1
    });
    let selected = records(&ndjson);
    wait_until(
        Duration::from_secs(20),
        Duration::from_millis(100),
        || match records(&ndjson) - selected {
            10.. => Ok(()),
            n => Err(format!("{n} readings since runc's init was selected")),
        },
    );
    c.verb("start").expect("podman start");
    assert_eq!(c.verb("wait").expect("podman wait"), "0");
    let node = format!("cgroup=\"{cgroup}\"");
    let text = metrics_until(&agent, |t| {
        metric_sum(
            t,
            "mmaplock_acquisitions_total",
            &["process=\"node\"", &node, "role=\"main\"", "cause=\"mmap\""],
        ) >= 100
    });
    assert_node_is_named_node(&text, &cgroup);
    // The NDJSON records of the same cgroup carry it: stopped as a service manager does, the
    // agent writes its last interval and ends (no bound).
    agent.stop();
    let lines = std::fs::read_to_string(&ndjson).unwrap();
    let mut writes: BTreeMap<String, u64> = BTreeMap::new();
    let mut last = String::new();
    for l in lines.lines() {
        let r: Value = serde_json::from_str(l).unwrap();
        for p in r["processes"].as_array().into_iter().flatten() {
            if p["cgroup"] == cgroup.as_str() {
                last = p["comm"].as_str().unwrap().to_string();
                *writes.entry(last.clone()).or_default() += p["write"]["count"].as_u64().unwrap();
            }
        }
    }
    assert_eq!(last, "node", "NDJSON records of the container: {writes:?}");
    let node = writes["node"];
    assert!(node >= 100, "{writes:?}");
    for (name, n) in &writes {
        assert!(
            name == "node" || name.starts_with("runc") && *n * 10 < node,
            "NDJSON records of the container: {writes:?}"
        );
    }
}

/// Writes by process name in `cgroup`, from the agent's page.
fn writes_by_process(text: &str, cgroup: &str) -> BTreeMap<String, u64> {
    processes_in(text, cgroup)
        .into_iter()
        .map(|name| {
            let n = metric_sum(
                text,
                "mmaplock_acquisitions_total",
                &[
                    &format!("process=\"{name}\""),
                    &format!("cgroup=\"{cgroup}\""),
                    "op=\"write\"",
                ],
            );
            (name, n)
        })
        .collect()
}

/// The container's node process is named node: every series of `cgroup` names node, or one
/// of runc's own processes there before node (`runc init`, and `runc:[2:INIT]` until it execs
/// node), which are named for what they were and did little: their writes are under a tenth
/// of node's, by their main thread alone (node's Workers, threadpool and V8 threads would
/// show under any name node had been given).
fn assert_node_is_named_node(text: &str, cgroup: &str) {
    let writes = writes_by_process(text, cgroup);
    let node = writes.get("node").copied().unwrap_or(0);
    assert!(node > 0, "{writes:?}\n{text}");
    for (name, n) in &writes {
        if name == "node" {
            continue;
        }
        assert!(
            name.starts_with("runc") && n * 10 < node,
            "{name}: {n} writes (node: {node}) in {cgroup}\n{text}"
        );
        let roles: std::collections::BTreeSet<&str> = text
            .lines()
            .filter(|l| l.contains(&format!("process=\"{name}\"")) && l.contains(cgroup))
            .filter_map(|l| l.split_once("role=\"")?.1.split_once('"').map(|r| r.0))
            .collect();
        assert!(
            roles
                .iter()
                .all(|r| ["main", "foreign", "profiler"].contains(r)),
            "{name} with roles {roles:?}"
        );
    }
}

/// A container starting under the agent (`--cgroup` of podman's parent, `-q`) is a normal
/// event: not one line on standard error (runc's init maps its binary from a detached mount,
/// which /proc names `/`), and runc's stages (`runc`, `runc:[0:PARENT]`, `runc:[1:CHILD]`,
/// `runc:[2:INIT]` before its exec) are one `runc` process beside the image's own.
#[test]
fn a_container_start_is_silent_and_runcs_stages_are_one_process() {
    let Some(image) = image() else { return };
    let port = integration_tests::scrape::free_port();
    // (Full mode: the helpers' mmaps are counted exactly; killed on drop, even should the
    // test fail half-way.)
    let agent = integration_tests::scrape::ChildGuard::new(
        std::process::Command::new(integration_tests::profiler_bin())
            .args([
                "agent",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "-q",
                "-i",
                "0.2",
                "--mode",
                "full",
            ])
            .args(["--cgroup", &libpod_parent()])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start the agent"),
    );
    // It serves or ends: no bound on how long attaching takes (-q: no line says when).
    while let Err(e) = ureq::get(&format!("http://127.0.0.1:{port}/metrics")).call() {
        if ended(agent.id()) {
            let out = agent.take().wait_with_output().unwrap();
            panic!("the agent ended before it served ({e}): {out:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let (t, n) = (1, 500);
    let mut cgroups = Vec::new();
    for i in 0..3 {
        let c = Container::new_name(&format!("quiet{i}"));
        let helpers = format!("{}:/helpers:ro", integration_tests::target_dir().display());
        let mut w = Workload::spawn(c.run_command(
            &image,
            &["-v", &helpers, "--entrypoint", "/helpers/mmap-churn"],
            &[&t.to_string(), &n.to_string(), "65536"],
        ));
        cgroups.push(containers::cgroup_of(c.host_pid()).expect("its cgroup"));
        w.go();
        assert!(w.wait().success());
    }
    for cgroup in &cgroups {
        let node = format!("cgroup=\"{cgroup}\"");
        // (A bound on what a broken agent might never serve, scaled by wait_until.)
        let text = wait_until(Duration::from_secs(20), Duration::from_millis(200), || {
            let text = integration_tests::scrape::metrics(port);
            let churn = metric_sum(
                &text,
                "mmaplock_acquisitions_total",
                &["process=\"mmap-churn\"", &node, "cause=\"mmap\""],
            );
            if churn >= t * n {
                Ok(text)
            } else {
                Err(format!("{churn} mmaps of mmap-churn in {cgroup}:\n{text}"))
            }
        });
        let names = processes_in(&text, cgroup);
        assert!(
            names.iter().all(|n| n == "mmap-churn" || n == "runc"),
            "{cgroup}: {names:?}"
        );
    }
    // SAFETY: kill has no preconditions; the agent is our child.
    unsafe { libc::kill(agent.id() as i32, libc::SIGTERM) };
    let out = agent.take().wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "",
        "-q: nothing to say"
    );
}

/// A plain `podman run` of a Node process with known thread roles (`roles.js`: 3 Workers, a
/// threadpool of 2, 2 V8 platform threads), under the agent selecting by name from before the
/// container exists (the kernel selects node as runc execs it), and the one-shot profiler on
/// its host pid:
/// roles as on the host (the container's glibc is another file than the host's, the same
/// build), labels node and the container's cgroup.
#[test]
fn a_podman_run_has_the_roles_and_labels_it_has_on_the_host() {
    let Some(image) = image() else { return };
    let parent = libpod_parent();
    let agent = Agent::start(&["--comm", "node", "-i", "0.2"]);
    let data = tempfile::tempdir().unwrap();
    let c = Container::new_name("roles");
    let mut w = Workload::spawn(c.roles_command(&image, data.path(), 300));
    let ids: Value = serde_json::from_str(&w.preamble[0]).expect("tids line");
    let pid = c.host_pid();
    assert_ne!(pid, 0);
    let cgroup = containers::cgroup_of(pid).expect("its cgroup");
    assert!(cgroup.starts_with(&format!("{parent}/")), "{cgroup}");
    // The Workers' tids as the container sees them, on the host.
    let host = containers::host_tids(pid);
    assert_eq!(
        host.get(&1),
        Some(&(pid as u64)),
        "node is the container's pid 1"
    );
    let workers: Vec<u64> = ids["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| host[&t.as_u64().unwrap()])
        .collect();
    assert_eq!(workers.len(), 3);
    let before: Vec<u64> = host.values().copied().collect();
    let pid_s = pid.to_string();
    let prof = Profiler::start(&["-p", &pid_s, "-i", "0"]);
    w.go();
    assert!(w.wait().success());
    let out = prof.finish();
    let p = process(out.summary(), pid).expect("node is in the summary");
    assert_eq!(p["comm"], "node");
    let threads = p["threads"].as_array().unwrap();
    let mut roles: BTreeMap<&str, usize> = BTreeMap::new();
    for t in threads {
        let tid = t["tid"].as_u64().unwrap();
        let role = t["role"].as_str().unwrap();
        *roles.entry(role).or_default() += 1;
        match role {
            "main" => assert_eq!(tid, pid as u64),
            "worker" => assert!(workers.contains(&tid), "{t}"),
            // Started lazily, by the first deflate after "go".
            "libuv" => assert!(!before.contains(&tid), "{t}"),
            "v8" => assert!(before.contains(&tid) && !workers.contains(&tid), "{t}"),
            // Node's debug signal thread, started at start-up (it may run the exit).
            "inspector" => assert!(before.contains(&tid), "{t}"),
            "foreign" | "profiler" => assert_ne!(t["pid"], pid),
            // Only a thread that took the lock only at the process's exit, too late for its
            // start routine to be read.
            "other" => assert!(
                t["causes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|c| c["cause"] == "exit"),
                "unclassified {t}"
            ),
            r => panic!("unexpected role {r} for {t}"),
        }
    }
    assert_eq!(roles.get("worker"), Some(&3), "{roles:?}");
    assert_eq!(
        roles.get("libuv"),
        Some(&2),
        "UV_THREADPOOL_SIZE=2: {roles:?}"
    );
    assert!((1..=3).contains(roles.get("v8").unwrap_or(&0)), "{roles:?}");
    // The agent, from before the container existed: node in the container's cgroup, by the
    // same roles, nothing named after runc's init, no write unclassified (as on the host, a
    // few reads are, by a thread that reads the lock only as the process ends).
    let label = format!("cgroup=\"{cgroup}\"");
    let text = metrics_until(&agent, |t| {
        ["worker", "libuv", "v8"].iter().all(|r| {
            metric_sum(
                t,
                "mmaplock_acquisitions_total",
                &[&label, &format!("role=\"{r}\""), "op=\"write\""],
            ) > 0
        })
    });
    assert_node_is_named_node(&text, &cgroup);
    let other_writes = text
        .lines()
        .filter(|l| l.starts_with("mmaplock_acquisitions_total{") && l.contains(&label))
        .filter(|l| l.contains("role=\"other\"") && l.contains("op=\"write\""))
        .filter(|l| !l.contains("cause=\"exit\""))
        .collect::<Vec<_>>();
    assert!(other_writes.is_empty(), "unclassified: {other_writes:?}");
}

/// Runs `jsframes.js` (a Worker's `hotAllocator` allocating 256 KiB Buffers, 64 a round) in a
/// container under `node_flags`, profiled by its host pid with one write's stack in `sample`;
/// returns node's summary entry and the folded stacks, read after the container has exited.
fn profile_jsframes(image: &str, node_flags: &[&str], sample: u32, rounds: u32) -> (Value, String) {
    let c = Container::new_name("js");
    let file = format!("{FIXTURES_IN_IMAGE}/jsframes.js");
    let rounds = rounds.to_string();
    let mut args: Vec<&str> = node_flags.to_vec();
    args.extend([file.as_str(), rounds.as_str()]);
    // A fixed mmap threshold: each Buffer is one mmap (see jsframes.rs).
    // The Worker outlives its samples half a second on the reference machine, for the
    // profiler to name them.
    let linger = format!(
        "JSFRAMES_LINGER_MS={}",
        integration_tests::scaled(std::time::Duration::from_millis(500)).as_millis()
    );
    let mut w = Workload::spawn(c.run_command(
        image,
        &["-e", "MALLOC_MMAP_THRESHOLD_=131072", "-e", &linger],
        &args,
    ));
    let pid = c.host_pid();
    assert_ne!(pid, 0);
    let dir = tempfile::tempdir().unwrap();
    let folded = dir.path().join("stacks.folded");
    let prof = Profiler::start_with_stacks(pid, sample, &folded);
    w.go();
    assert!(w.wait().success());
    // The profiler ends when node has exited: everything below is symbolized after the exit.
    let out = prof.finish();
    let p = process(out.summary(), pid)
        .expect("node is in the summary")
        .clone();
    (
        p,
        std::fs::read_to_string(&folded).expect("the folded stacks"),
    )
}

/// The code a container's process ran is named as the container sees it: node's file is
/// `/opt/node/bin/node` (the host has none there), its functions named after the container
/// has exited.
fn assert_dsos_as_the_container_sees_them(p: &Value, folded: &str) {
    let dsos: Vec<&str> = p["dsos"]
        .as_array()
        .expect("dsos")
        .iter()
        .filter_map(|d| d["dso"].as_str())
        .collect();
    assert!(dsos.contains(&NODE_IN_IMAGE), "{dsos:?}");
    assert!(
        !dsos.contains(&"/usr/bin/node"),
        "the host's path: {dsos:?}"
    );
    // node's own functions, by name (not `0x... (node)`), in the sampled stacks.
    let named = folded
        .split([';', '\n'])
        .filter(|f| f.contains("v8::internal::") || f.contains("node::"))
        .count();
    assert!(named > 0, "no function of node named:\n{folded}");
}

#[test]
fn js_names_come_from_the_perf_map_in_the_containers_own_tmp() {
    let Some(image) = image() else { return };
    let (p, folded) = profile_jsframes(&image, &["--perf-basic-prof-only-functions"], 4, 50);
    assert_mmaps_named(&folded, "hotAllocator", 20, "in a container, perf map");
    let js = p["js_functions"].as_array().expect("js_functions");
    assert_eq!(js[0]["function"], "hotAllocator", "{js:?}");
    assert!(
        js[0]["file"]
            .as_str()
            .unwrap()
            .contains("/app/jsframes.js:"),
        "the script as the container names it: {}",
        js[0]
    );
    // The perf map (in the container's /tmp, named by its pid there) named frames.
    let from_map = p["js_frames"]["perf_map"].as_u64().unwrap_or(0)
        + p["js_frames"]["agree"].as_u64().unwrap_or(0)
        + p["js_frames"]["disagree"].as_u64().unwrap_or(0);
    assert!(from_map > 0, "{}", p["js_frames"]);
    assert!(p.get("js_hint").is_none(), "{}", p["js_hint"]);
    assert_dsos_as_the_container_sees_them(&p, &folded);
}

#[test]
fn js_names_come_from_v8s_heap_in_a_container_without_flags() {
    let Some(image) = image() else { return };
    let (p, folded) = profile_jsframes(&image, &[], 64, 200);
    assert_mmaps_named(&folded, "hotAllocator", 20, "in a container, no flags");
    assert_eq!(p["js_functions"][0]["function"], "hotAllocator");
    assert_eq!(p["js_frames"]["perf_map"], 0, "{}", p["js_frames"]);
    assert!(p.get("js_hint").is_none(), "{}", p["js_hint"]);
    assert_dsos_as_the_container_sees_them(&p, &folded);
}
