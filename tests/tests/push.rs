//! ROOT-ONLY: the agent's pushes, against a real OpenTelemetry Collector (built by `cargo
//! xtask test` from the Collector's published Go modules: its OTLP receiver with TLS and a
//! bearer token, `service.profilesSupport`, contrib's file exporter), and with its backends
//! down or silent.
//!
//! Ground truth: the agent's own NDJSON interval lines (each interval's sampled writes, their
//! wait, and the contended writes counted), which the pushed profiles and metrics must add up
//! to exactly: consecutive pushes cover every interval once, the last at the agent's end.

use std::{
    net::TcpListener,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use integration_tests::{
    Workload, bpf_test, fixture, installed_or_skip,
    otelcol::{Collector, int, otelcol_bin, samples_by_type},
    pyroscope::{Ingest, ingest_bin},
    scrape::{Agent, free_port},
    wait_until,
};
use serde_json::Value;

/// A self-signed certificate for localhost and its key, as PEM files in `dir`.
fn certificate(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let (cert, key) = (dir.join("server.crt"), dir.join("server.key"));
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
    (cert, key)
}

/// `holder.js`: one Worker holding the lock for write for milliseconds at a time
/// (`shrinkResizableBuffer`, 20 mprotects of a populated 64 MiB) while 3 Workers allocate
/// behind it (`allocateBehindHolder`, 1 MiB Buffers: an mmap and a munmap each), on "go",
/// its Workers living until [`finish`] (their stacks are unwound from the process's memory
/// maps, their functions named from their heaps, while they live). Waits begin behind a
/// writer of their own process, whose stack contention mode takes, in every run
/// (`tests/tests/holders.rs` checks it against bpftrace): a workload of mmaps and munmaps
/// alone waits mostly behind readers (page faults, munmap's downgraded hold), and a run of
/// `contended.js` had at times no wait begun behind a writer, no holder to push.
fn workers() -> Workload {
    let mut cmd = Command::new("node");
    cmd.env("MALLOC_MMAP_THRESHOLD_", "131072")
        .arg(fixture("holder.js"))
        .args(["3", "20"]);
    Workload::spawn(cmd)
}

/// Runs the Workers, then lets the process go once the agent has had its stacks (it reads
/// them within a tenth of a second of their sample, and unwinds a process's first in
/// about 150 ms on this machine kind: 3 s leaves room for one several times slower).
fn finish(w: &mut Workload) {
    w.send("go");
    assert_eq!(w.read_line(), "done");
    std::thread::sleep(Duration::from_secs(3));
    w.send("exit");
    assert!(w.wait().success());
}

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Over the agent's interval lines, for process `pid`: its sampled writes and their wait
/// (`dsos`), and its contended writes and their wait (`write`).
fn intervals_total(lines: &[Value], pid: u32) -> (i64, i64, i64, i64) {
    let mut t = (0, 0, 0, 0);
    for p in (lines.iter())
        .filter(|l| l["type"] == "interval")
        .flat_map(|l| l["processes"].as_array().unwrap())
        .filter(|p| p["pid"] == pid)
    {
        for d in p["dsos"].as_array().into_iter().flatten() {
            t.0 += d["write"]["count"].as_i64().unwrap();
            t.1 += d["write"]["wait_ns"]["sum"].as_i64().unwrap();
        }
        t.2 += p["write"]["count"].as_i64().unwrap_or(0);
        t.3 += p["write"]["wait_ns"]["sum"].as_i64().unwrap_or(0);
    }
    t
}

/// A metric's data points in one OTLP metrics request (pdata's JSON), by name.
fn points<'a>(req: &'a Value, name: &str) -> Vec<&'a Value> {
    let mut out = Vec::new();
    for rm in req["resourceMetrics"].as_array().into_iter().flatten() {
        for sm in rm["scopeMetrics"].as_array().into_iter().flatten() {
            for m in sm["metrics"].as_array().into_iter().flatten() {
                if m["name"] == name {
                    for kind in ["sum", "gauge", "histogram"] {
                        out.extend(m[kind]["dataPoints"].as_array().into_iter().flatten());
                    }
                }
            }
        }
    }
    out
}

fn attr<'a>(point: &'a Value, key: &str) -> Option<&'a str> {
    (point["attributes"].as_array().into_iter().flatten())
        .find(|a| a["key"] == key)
        .and_then(|a| a["value"]["stringValue"].as_str())
}

#[test]
fn the_agent_pushes_profiles_and_metrics_to_a_real_collector_over_tls_with_a_token() {
    let Some(dir) = bpf_test() else { return };
    if !integration_tests::bpftrace::require_contention_tracepoints() {
        return;
    }
    let Some(bin) = installed_or_skip(
        otelcol_bin(),
        "the OpenTelemetry Collector (cargo xtask test builds it with go)",
    ) else {
        return;
    };
    let (cert, key) = certificate(dir.path());
    let collector = Collector::start(&bin, dir.path(), &cert, &key, "t0k3n-for-the-test");
    let mut w = workers();
    let ndjson = dir.path().join("agent.json");
    let otlp = format!("https://localhost:{}", collector.port);
    let agent = Agent::start(&[
        "--mode",
        "contention",
        "--pid",
        &w.pid.to_string(),
        "-i",
        "0.5",
        // Every contended wait's stack, and its holder's (no bound on stacks a second): the
        // holding Worker's function is looked for among the holders.
        "--stack-sample",
        "1",
        "--max-stack-rate",
        "0",
        "--otlp",
        &otlp,
        "--push-interval",
        "1",
        "--push-ca",
        cert.to_str().unwrap(),
        "--push-header",
        "Authorization: Bearer t0k3n-for-the-test",
        "--pprof",
        "-o",
        ndjson.to_str().unwrap(),
    ]);
    finish(&mut w);
    // Pushes while the agent runs (their deliveries in the last metrics), then the last at
    // its end.
    std::thread::sleep(Duration::from_secs(3));
    let scraped = agent.metrics();
    // The pull path of the same run, as `go tool pprof` shows it with no flag: the waiters'
    // delay, the holders' one flag away (the sums are checked against the interval lines
    // in tests/tests/pprof.rs).
    if let Some(go) = integration_tests::pprof::go_bin() {
        let url = format!(
            "http://127.0.0.1:{}/debug/pprof/mmaplock?seconds=600",
            agent.port
        );
        let default = integration_tests::pprof::top_total(&go, "", &url);
        let holders = integration_tests::pprof::top_total(&go, "holder_delay", &url);
        eprintln!("endpoint: default view {default} ns, holder_delay {holders} ns");
        assert!(default > 0 && holders > 0, "{default} {holders}");
    }
    agent.stop();
    let (profiles, metrics) = collector.stop();
    assert!(
        !profiles.is_empty() && !metrics.is_empty(),
        "nothing received"
    );
    let lines = lines(&ndjson);
    let (sampled, sampled_wait, contended, contended_wait) = intervals_total(&lines, w.pid);
    assert!(sampled >= 20, "{sampled} sampled writes");
    // Every profile's samples, each request once: the waiters' default types are the
    // sampled writes and their wait exactly, each wait once.
    let all: Vec<_> = profiles.iter().flat_map(samples_by_type).collect();
    let total = |t: &str| -> i64 {
        (all.iter())
            .filter(|(ty, ..)| ty == t)
            .map(|(_, v, ..)| v)
            .sum()
    };
    assert_eq!(
        (total("contentions"), total("delay")),
        (sampled, sampled_wait)
    );
    let holder_delay = total("holder_delay");
    assert!(holder_delay > 0, "no holder pushed");
    for (t, _, _, attrs) in &all {
        let side = attrs
            .iter()
            .find(|(k, _)| k == "side")
            .map(|(_, v)| v.as_str());
        let want = if t.starts_with("holder_") {
            "holder"
        } else {
            "waiter"
        };
        assert_eq!(side, Some(want), "{t}: {attrs:?}");
    }
    // The waiting Workers' JavaScript function, with the delay of the stacks through it.
    let through: i64 = (all.iter())
        .filter(|(t, _, names, _)| {
            t == "delay" && names.iter().any(|n| n == "allocateBehindHolder")
        })
        .map(|(_, v, ..)| v)
        .sum();
    assert!(
        through > 0 && through <= sampled_wait,
        "allocateBehindHolder: {through} ns of {sampled_wait}"
    );
    // Each resource is the process, as the agent labels it (the Collector moves resource
    // attributes' strings into the dictionary: `keyStrindex`, `stringValueStrindex`).
    let strings = profiles[0]["dictionary"]["stringTable"].clone();
    let text = |v: &Value, plain: &str, index: &str| -> String {
        match v.get(plain).and_then(Value::as_str) {
            Some(s) => s.to_string(),
            None => strings[v[index].as_u64().unwrap_or(0) as usize]
                .as_str()
                .unwrap_or("")
                .to_string(),
        }
    };
    let resource = &profiles[0]["resourceProfiles"][0]["resource"];
    let service = (resource["attributes"].as_array().unwrap().iter())
        .find(|a| text(a, "key", "keyStrindex") == "service.name")
        .map(|a| text(&a["value"], "stringValue", "stringValueStrindex"));
    assert_eq!(service.as_deref(), Some("node"), "{resource}");
    eprintln!(
        "pushed: waiters' delay {sampled_wait} ns in {sampled} sampled writes (agent's contended write wait {contended_wait} ns in {contended}); holders' delay {holder_delay} ns; allocateBehindHolder {through} ns"
    );
    // The metrics: the same series as /metrics; the last push, made at the agent's end, has
    // its contended writes exactly.
    let last = metrics.last().unwrap();
    let written: i64 = (points(last, "mmaplock_wait_seconds").iter())
        .filter(|p| attr(p, "process") == Some("node") && attr(p, "op") == Some("write"))
        .map(|p| int(&p["count"]))
        .sum();
    assert_eq!(written, contended, "pushed mmaplock_wait_seconds count");
    for name in ["mmaplock_build_info", "mmaplock_export_sent_total"] {
        assert!(!points(last, name).is_empty(), "{name} not pushed");
        assert!(scraped.contains(name), "{name} not in /metrics");
    }
    let sent: f64 = (points(last, "mmaplock_export_sent_total").iter())
        .filter(|p| attr(p, "exporter") == Some("otlp_profiles"))
        .map(|p| p["asDouble"].as_f64().unwrap_or(0.0))
        .sum();
    assert!(sent >= 1.0, "profiles sent: {sent}");
}

/// Pyroscope's ingest path, against the stand-in that reads a push with Pyroscope's own
/// label-set parser and pprof's parser (Pyroscope's server cannot be had here): every push
/// taken, named after the process with the agent's labels, its default view the waiters'
/// delay, which adds up to the agent's sampled wait, with the waiting Workers' function, the
/// holders' delay pushed too, with the holding Worker's function, node the main binary.
#[test]
fn the_agent_pushes_to_pyroscopes_ingest_path_each_wait_once() {
    let Some(dir) = bpf_test() else { return };
    if !integration_tests::bpftrace::require_contention_tracepoints() {
        return;
    }
    let Some(bin) = installed_or_skip(
        ingest_bin(),
        "the Pyroscope ingest stand-in (cargo xtask test builds it with go)",
    ) else {
        return;
    };
    let ingest = Ingest::start(&bin, dir.path());
    let mut w = workers();
    let ndjson = dir.path().join("agent.json");
    let agent = Agent::start(&[
        "--mode",
        "contention",
        "--pid",
        &w.pid.to_string(),
        "-i",
        "0.5",
        // Every contended wait's stack, and its holder's (no bound on stacks a second): the
        // holding Worker's function is looked for among the holders.
        "--stack-sample",
        "1",
        "--max-stack-rate",
        "0",
        "--pyroscope",
        &format!("http://127.0.0.1:{}", ingest.port),
        "--push-interval",
        "1",
        "-o",
        ndjson.to_str().unwrap(),
    ]);
    finish(&mut w);
    std::thread::sleep(Duration::from_secs(2));
    let page = agent.metrics();
    agent.stop();
    let pushes = ingest.pushes();
    assert!(!pushes.is_empty(), "nothing pushed");
    assert!(
        page.contains(
            "mmaplock_export_dropped_total{exporter=\"pyroscope\",reason=\"rejected\"} 0"
        ),
        "a push was refused:\n{page}"
    );
    let (sampled, sampled_wait, _, contended_wait) = intervals_total(&lines(&ndjson), w.pid);
    let mut totals = (0, 0, 0);
    // The waiters' delay through the waiting Workers' function, the holders' through the
    // holding Worker's.
    let (mut through, mut holding) = (0, 0);
    for p in &pushes {
        assert_eq!(p["labels"]["__name__"], "node", "{p}");
        assert_eq!(p["labels"]["process"], "node", "{p}");
        assert!(
            p["labels"]["host"].as_str().is_some_and(|h| !h.is_empty()),
            "{p}"
        );
        assert_eq!(p["default_sample_type"], "delay", "{p}");
        assert_eq!(p["sample_type_config"]["delay"]["display-name"], "mmaplock");
        let types: Vec<&str> = (p["sample_types"].as_array().unwrap().iter())
            .map(|t| t.as_str().unwrap())
            .collect();
        assert_eq!(
            types,
            [
                "contentions/count",
                "delay/nanoseconds",
                "holder_contentions/count",
                "holder_delay/nanoseconds"
            ]
        );
        assert!(
            p["main_binary"]
                .as_str()
                .is_some_and(|b| b.ends_with("node")),
            "main binary {} in {p}",
            p["main_binary"]
        );
        totals.0 += p["totals"]["contentions"].as_i64().unwrap_or(0);
        totals.1 += p["totals"]["delay"].as_i64().unwrap_or(0);
        totals.2 += p["totals"]["holder_delay"].as_i64().unwrap_or(0);
        for s in p["samples"].as_array().unwrap() {
            let names = s["functions"].as_array().unwrap();
            let value = |i: usize| s["values"][i].as_i64().unwrap();
            if names.iter().any(|n| n == "allocateBehindHolder") {
                through += value(1);
            }
            if names.iter().any(|n| n == "shrinkResizableBuffer") {
                holding += value(3);
            }
        }
    }
    let each: Vec<&Value> = pushes.iter().map(|p| &p["totals"]).collect();
    assert_eq!(
        (totals.0, totals.1),
        (sampled, sampled_wait),
        "pushes' totals {each:?}"
    );
    assert!(totals.2 > 0, "no holder pushed: pushes' totals {each:?}");
    assert!(through > 0, "allocateBehindHolder not pushed");
    assert!(
        holding > 0 && holding <= totals.2,
        "shrinkResizableBuffer held {holding} ns of the holders' {} ns",
        totals.2
    );
    eprintln!(
        "pyroscope: {} pushes; waiters' delay {} ns (agent's sampled {sampled_wait}, contended {contended_wait}); holders' {} ns; allocateBehindHolder {through} ns, shrinkResizableBuffer holding {holding} ns",
        pushes.len(),
        totals.1,
        totals.2
    );
}

/// A listener that accepts and never answers: a backend that hangs.
fn silent_backend() -> (TcpListener, u16) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    l.set_nonblocking(true).unwrap();
    (l, port)
}

#[test]
fn backends_down_or_silent_never_hold_metrics_and_what_is_lost_is_counted() {
    let Some(_dir) = bpf_test() else { return };
    // Nothing listens on `down`; `silent` accepts and never answers.
    let down = free_port();
    let (silent, silent_port) = silent_backend();
    let mut w = Workload::churn(2, 2000, Some("push-churn"));
    let agent = Agent::start(&[
        "--pid",
        &w.pid.to_string(),
        "-i",
        "0.5",
        "--otlp",
        &format!("http://127.0.0.1:{down}"),
        "--pyroscope",
        &format!("http://127.0.0.1:{silent_port}"),
        "--push-interval",
        "1",
    ]);
    w.go();
    assert!(w.wait().success());
    // /metrics answers at once all along, and the exact count comes in, while both
    // backends fail (a scrape is bounded by the helper's own limit).
    let mut held = Vec::new();
    let dropped = |page: &str, exporter: &str, reason: &str| -> f64 {
        (page.lines())
            .filter(|l| l.starts_with("mmaplock_export_dropped_total{"))
            .filter(|l| l.contains(&format!("exporter=\"{exporter}\"")))
            .filter(|l| l.contains(&format!("reason=\"{reason}\"")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    wait_until(
        integration_tests::scaled(Duration::from_secs(60)),
        Duration::from_millis(200),
        || {
            // Keep the silent backend's connections open, unanswered.
            while let Ok((s, _)) = silent.accept() {
                held.push(s);
            }
            let t = Instant::now();
            let page = agent.metrics();
            let took = t.elapsed();
            let metrics = dropped(&page, "otlp_metrics", "unreachable");
            let pyro = dropped(&page, "pyroscope", "unreachable");
            if took > Duration::from_secs(5) {
                panic!("a scrape took {took:?} while the backends failed");
            }
            if metrics >= 1.0 && pyro >= 1.0 {
                Ok(())
            } else {
                Err(format!(
                    "otlp_metrics unreachable {metrics}, pyroscope unreachable {pyro}"
                ))
            }
        },
    );
    let page = agent.metrics();
    let writes = integration_tests::metric_sum(
        &page,
        "mmaplock_acquisitions_total",
        &["process=\"push-churn\"", "op=\"write\""],
    );
    integration_tests::assert_churn_total(writes, 2, 2000, "push-churn", "");
    // It ends cleanly and promptly, its last pushes given up on (counted, said once).
    let t = Instant::now();
    agent.stop();
    assert!(
        t.elapsed() < integration_tests::scaled(Duration::from_secs(30)),
        "the agent took {:?} to end",
        t.elapsed()
    );
    drop(held);
}
