//! ROOT-ONLY: pprof profiles, read by Go's own `go tool pprof` (`cargo xtask test` installs
//! Debian's golang-go when no Go is found): `--pprof FILE` of a Node process whose Workers
//! call a known function through `readFileSync`, the same from `report RUN.json --pprof`, and
//! three scrapes of the agent's `/debug/pprof/mmaplock` over TLS with basic auth.
//!
//! Ground truth: the report's own sampled writes (the sum over its `dsos`) and their wait,
//! which the profile's values must equal exactly (they are the same samples, unscaled); for
//! the agent, its NDJSON interval lines over the intervals each profile says it covers.

use std::{path::Path, process::Command, time::Duration};

use integration_tests::{
    Profiler, Workload, bpf_test, fixture, installed_or_skip,
    pprof::{RawProfile, go_bin, raw_profile, top_total},
    process, profile_until_done, run_ok, run_profiler,
    scrape::Agent,
};
use serde_json::Value;

/// `jsapis.js`: two Workers running `viaReadFile` (fs.readFileSync of a 256 KiB file in a
/// loop) and one `viaBufferAlloc`, `rounds` calls each, one after the other.
fn jsapis(dir: &Path, rounds: u32) -> Workload {
    let mut cmd = Command::new("node");
    cmd.current_dir(dir)
        .env("MALLOC_MMAP_THRESHOLD_", "131072")
        .arg(fixture("jsapis.js"))
        .arg(rounds.to_string())
        .arg("viaReadFile,viaReadFile,viaBufferAlloc");
    Workload::spawn(cmd)
}

/// A process's sampled writes and their wait, as its report line says them (`dsos`).
fn sampled(p: &Value) -> (i64, i64) {
    let dsos = p["dsos"].as_array().map(Vec::as_slice).unwrap_or_default();
    let n = dsos.iter().map(|d| d["write"]["count"].as_i64().unwrap());
    let w = dsos
        .iter()
        .map(|d| d["write"]["wait_ns"]["sum"].as_i64().unwrap());
    (n.sum(), w.sum())
}

/// The checks every profile of this file passes: the sample types of a lock profile, the
/// waiters' (and their writes and hold, in full mode) then the holders', the waiters' delay
/// the default; every sample naming its process and role, and 0 in the other side's types.
fn check_shape(raw: &RawProfile, process: &str) {
    assert_eq!(
        raw.sample_types,
        [
            "contentions/count",
            "delay/nanoseconds",
            "writes/count",
            "hold/nanoseconds",
            "holder_contentions/count",
            "holder_delay/nanoseconds",
        ],
        "{}",
        raw.text
    );
    check_sides(raw);
    assert_eq!(raw.period_type, "contentions/count");
    let roles = [
        "main",
        "worker",
        "libuv",
        "v8",
        "inspector",
        "addon",
        "other",
        "foreign",
    ];
    for s in &raw.samples {
        assert_eq!(s.labels["process"], process, "{s:?}");
        assert!(roles.contains(&s.labels["role"].as_str()), "{s:?}");
        assert!(
            ["write", "read"].contains(&s.labels["op"].as_str()),
            "{s:?}"
        );
    }
}

/// Each sample's values are on its side only: a waiter's are 0 in the holders' types, a
/// holder's 0 in the waiters'; the waiters' delay is the default type.
fn check_sides(raw: &RawProfile) {
    assert_eq!(raw.default_type, "delay/nanoseconds");
    assert_eq!(raw.period_type, "contentions/count");
    let holders = (raw.sample_types.iter())
        .position(|t| t.starts_with("holder_"))
        .expect("holder types");
    for s in &raw.samples {
        let (own, other) = match s.labels["side"].as_str() {
            "waiter" => (&s.values[..holders], &s.values[holders..]),
            "holder" => (&s.values[holders..], &s.values[..holders]),
            side => panic!("side {side}: {s:?}"),
        };
        assert!(other.iter().all(|&v| v == 0), "{s:?}");
        assert!(own.iter().any(|&v| v != 0), "{s:?}");
    }
}

/// The location lines of `viaReadFile`, defined in jsapis.js (`viaReadFile
/// /path/jsapis.js:LINE:COLUMN s=LINE`), and the samples through it are Workers'.
fn check_named(raw: &RawProfile) {
    let at = raw.locations_of("viaReadFile");
    assert!(!at.is_empty(), "viaReadFile is not named:\n{}", raw.text);
    assert!(at.iter().all(|l| l.contains("/jsapis.js:")), "{at:?}");
    let ids: Vec<u64> = (raw.locations.iter())
        .filter(|(_, l)| at.contains(&l.as_str()))
        .map(|(id, _)| *id)
        .collect();
    let through: Vec<_> = (raw.samples.iter())
        .filter(|s| s.locations.iter().any(|l| ids.contains(l)))
        .collect();
    assert!(!through.is_empty());
    assert!(
        through.iter().all(|s| s.labels["role"] == "worker"),
        "{through:?}"
    );
}

#[test]
fn a_node_profile_names_its_function_and_sums_to_the_reports_sampled_writes() {
    let Some(dir) = bpf_test() else { return };
    let Some(go) = installed_or_skip(go_bin(), "go (Debian's golang-go)") else {
        return;
    };
    let mut w = jsapis(dir.path(), 48);
    let file = dir.path().join("run.pb.gz");
    let pid = w.pid.to_string();
    let prof = Profiler::start(&[
        "-p",
        &pid,
        "-i",
        "0.5",
        "--stack-sample",
        "1",
        "--pprof",
        file.to_str().unwrap(),
    ]);
    let out = profile_until_done(&mut w, prof);
    assert!(out.status.success(), "{}", out.stderr);
    let json = dir.path().join("run.json");
    std::fs::write(&json, &out.raw_stdout).unwrap();
    let p = process(out.summary(), w.pid).expect("node in the summary");
    let (writes, wait) = sampled(p);
    assert!(writes >= 48, "{writes} sampled writes");
    let file = file.to_str().unwrap();
    let raw = raw_profile(&go, None, file).unwrap();
    check_shape(&raw, "node");
    check_named(&raw);
    assert_eq!(raw.period, 1);
    assert!(
        (raw.comments.iter())
            .any(|c| c.starts_with("sampled: 1 in 1 write acquisitions per thread")),
        "{:?}",
        raw.comments
    );
    for s in &raw.samples {
        assert_eq!(s.labels["pid"], pid);
    }
    // The same samples, unscaled: exactly the report's (within 1% is the contract).
    assert_eq!(
        (raw.total("contentions"), raw.total("delay")),
        (writes, wait)
    );
    assert_eq!(raw.total("writes"), writes);
    assert_eq!(top_total(&go, "contentions", file), writes);
    assert_eq!(top_total(&go, "delay", file), wait);
    assert_eq!(
        top_total(&go, "", file),
        wait,
        "-top with no flag: the waiters' delay"
    );
    // From the saved run: the same profile.
    let again = dir.path().join("again.pb.gz");
    run_ok([
        "report",
        json.to_str().unwrap(),
        "--pprof",
        again.to_str().unwrap(),
    ]);
    let raw_again = raw_profile(&go, None, again.to_str().unwrap()).unwrap();
    assert_eq!(raw_again.text, raw.text);
    // The saved run's text is the live run's: tables and histograms, not findings alone.
    let text = run_ok(["report", json.to_str().unwrap(), "-f", "text"]);
    for part in [
        "lock        acquired",
        "top threads by write wait",
        "write wait (log2 buckets)",
    ] {
        assert!(text.contains(part), "{part:?} not in:\n{text}");
    }
    // A run that kept no samples gives no profile: one line, exit 2.
    let bare: String = (out.raw_stdout.lines())
        .map(|l| {
            let mut v: Value = serde_json::from_str(l).unwrap();
            if let Some(o) = v.as_object_mut() {
                o.remove("stack_sample");
            }
            v.to_string() + "\n"
        })
        .collect();
    let bare_json = dir.path().join("bare.json");
    std::fs::write(&bare_json, bare).unwrap();
    let r = run_profiler(&[
        "report",
        bare_json.to_str().unwrap(),
        "--pprof",
        "/dev/null",
    ]);
    assert_eq!(r.status.code(), Some(2));
    let err = String::from_utf8_lossy(&r.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("no sampled stacks"), "{err}");
}

/// A self-signed certificate for localhost, and its key, as PEM files in `dir`.
fn certificate(dir: &Path) -> std::path::PathBuf {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let cert = dir.join("server.crt");
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(dir.join("server.key"), ck.signing_key.serialize_pem()).unwrap();
    cert
}

/// Waits until the agent has written `n` more lines to `ndjson` than it has now.
fn intervals_after(ndjson: &Path, n: usize) {
    let count = || {
        std::fs::read_to_string(ndjson)
            .map(|t| t.lines().count())
            .unwrap_or(0)
    };
    let want = count() + n;
    integration_tests::wait_until(Duration::from_secs(30), Duration::from_millis(50), || {
        let got = count();
        if got >= want {
            Ok(())
        } else {
            Err(format!(
                "{got} lines in {}, waiting for {want}",
                ndjson.display()
            ))
        }
    });
}

/// The agent's interval lines that a profile covers (its comment `intervals from A to B (N
/// intervals of the agent)`), their sampled writes and wait summed.
fn covered(raw: &RawProfile, lines: &[Value]) -> (usize, i64, i64) {
    let c = (raw.comments.iter())
        .find_map(|c| c.strip_prefix("intervals from "))
        .unwrap_or_else(|| panic!("no intervals in {:?}", raw.comments));
    let (from, rest) = c.split_once(" to ").unwrap();
    let (to, rest) = rest.split_once(" (").unwrap();
    let n: usize = rest.split_whitespace().next().unwrap().parse().unwrap();
    let within: Vec<&Value> = (lines.iter())
        .filter(|l| l["type"] == "interval")
        .filter(|l| l["start"].as_str().unwrap() >= from && l["end"].as_str().unwrap() <= to)
        .collect();
    assert_eq!(within.len(), n, "{from} to {to}");
    let (mut writes, mut wait) = (0, 0);
    for p in within
        .iter()
        .flat_map(|l| l["processes"].as_array().unwrap())
    {
        let (n, w) = sampled(p);
        (writes, wait) = (writes + n, wait + w);
    }
    (n, writes, wait)
}

#[test]
fn three_scrapes_of_the_agents_profile_over_tls_with_basic_auth_match_its_intervals() {
    let Some(dir) = bpf_test() else { return };
    let Some(go) = installed_or_skip(go_bin(), "go (Debian's golang-go)") else {
        return;
    };
    let cert = certificate(dir.path());
    let hash = bcrypt::hash("s3cret", 6).unwrap();
    let web = dir.path().join("web.yml");
    std::fs::write(
        &web,
        format!(
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\nbasic_auth_users:\n  scraper: {hash}\n"
        ),
    )
    .unwrap();
    let ndjson = dir.path().join("agent.json");
    let mut w = jsapis(dir.path(), 160);
    let agent = Agent::start(&[
        "--pid",
        &w.pid.to_string(),
        "-i",
        "0.5",
        "--pprof",
        "--stack-sample",
        "1",
        "--web.config.file",
        web.to_str().unwrap(),
        "-o",
        ndjson.to_str().unwrap(),
    ]);
    let url = |password: &str, query: &str| {
        format!(
            "https://scraper:{password}@localhost:{}/debug/pprof/mmaplock{query}",
            agent.port
        )
    };
    let ca = Some(cert.as_path());
    w.send("go");
    // Paced by the agent's own intervals (0.5 s), not by the clock: a slow host writes them
    // later, and the scrapes still fall where they should among them.
    intervals_after(&ndjson, 4);
    let mut scrapes = vec![raw_profile(&go, ca, &url("s3cret", "?seconds=2")).unwrap()];
    intervals_after(&ndjson, 3);
    scrapes.push(raw_profile(&go, ca, &url("s3cret", "")).unwrap());
    assert_eq!(w.read_line(), "done");
    // The workload's last writes are in an interval that has ended: the one under way when
    // it said done may have been read before them, the next one was not.
    intervals_after(&ndjson, 2);
    scrapes.push(raw_profile(&go, ca, &url("s3cret", "?seconds=600")).unwrap());
    // A wrong password, a window too long: refused (the message is agent/http.rs's tests').
    let e = raw_profile(&go, ca, &url("wrong", "")).unwrap_err();
    assert!(e.contains("401"), "{e}");
    let e = raw_profile(&go, ca, &url("s3cret", "?seconds=601")).unwrap_err();
    assert!(e.contains("400 Bad Request"), "{e}");
    w.send("exit");
    assert!(w.wait().success());
    drop(agent);
    let lines: Vec<Value> = std::fs::read_to_string(&ndjson)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for (i, raw) in scrapes.iter().enumerate() {
        check_shape(raw, "node");
        let (n, writes, wait) = covered(raw, &lines);
        eprintln!("scrape {i}: {n} intervals, {writes} sampled writes, {wait} ns");
        // The default types are the waiters' alone (the writers the sampled waits began
        // behind are in the holders' types, charged the same waits again).
        assert_eq!(
            (raw.total("contentions"), raw.total("delay")),
            (writes, wait),
            "scrape {i}"
        );
        for s in &raw.samples {
            assert!(s.labels.contains_key("cgroup"), "{s:?}");
            assert!(
                !s.labels.contains_key("pid"),
                "no pid label by default: {s:?}"
            );
        }
    }
    // The whole run: the workload's writes, and its function named.
    assert!(
        scrapes[2].total("contentions") >= 160,
        "{}",
        scrapes[2].text
    );
    check_named(&scrapes[2]);
    assert!(
        scrapes[1]
            .comments
            .iter()
            .any(|c| c.contains("(1 interval of the agent)"))
    );
}

/// Contention mode's profile: the contended writes' stacks (every one sampled here), as a
/// mutex profile and nothing more (no hold is measured), their totals the report's, and the
/// Workers' own JavaScript function named with its script. `holder.js`: its waits begin
/// behind a writer of their process in every run (a Worker holding the lock for write for
/// milliseconds), whose stack contention mode takes; a workload of mmaps and munmaps alone
/// waits mostly behind readers (faults, munmap's downgraded hold), and had at times no
/// holder stack at all.
#[test]
fn a_contention_mode_profile_has_the_contended_waits_stacks() {
    let Some(dir) = bpf_test() else { return };
    if !integration_tests::bpftrace::require_contention_tracepoints() {
        return;
    }
    let Some(go) = installed_or_skip(go_bin(), "go (Debian's golang-go)") else {
        return;
    };
    let mut cmd = Command::new("node");
    cmd.env("MALLOC_MMAP_THRESHOLD_", "131072")
        .arg(fixture("holder.js"))
        .args(["3", "20"]);
    let mut w = Workload::spawn(cmd);
    let file = dir.path().join("contention.pb.gz");
    let pid = w.pid.to_string();
    let prof = integration_tests::Profiler::start(&[
        "--pid",
        &pid,
        "--mode",
        "contention",
        "-i",
        "0",
        "--stack-sample",
        "1",
        "--pprof",
        file.to_str().unwrap(),
    ]);
    let out = integration_tests::profile_until_done(&mut w, prof);
    let s = out.summary();
    let p = process(s, w.pid).expect("node in the summary");
    let (writes, wait) = sampled(p);
    assert!(writes >= 10, "{writes} contended writes sampled");
    // Every contended write sampled, or its stack counted as lost (a burst can fill the
    // ring faster than a debug build unwinds; only node is profiled).
    let contended = p["write"]["count"].as_u64().unwrap();
    let lost = s["lost"]["stacks"].as_u64().unwrap();
    assert_eq!(writes as u64 + lost, contended, "{}", s["lost"]);
    assert!(writes as u64 >= contended.min(100), "{}", s["lost"]);
    let raw = raw_profile(&go, None, file.to_str().unwrap()).unwrap();
    assert_eq!(
        raw.sample_types,
        [
            "contentions/count",
            "delay/nanoseconds",
            "holder_contentions/count",
            "holder_delay/nanoseconds"
        ],
        "{}",
        raw.text
    );
    check_sides(&raw);
    assert!(
        (raw.comments.iter()).any(|c| c.starts_with("sampled: 1 in 1 contended writes")),
        "{:?}",
        raw.comments
    );
    // Each side in its own types: the default (the waiters') is the sampled writes and
    // their wait, each wait once; the holders' (the Workers the sampled waits began behind)
    // the wait the summary charges to them.
    assert_eq!(
        (raw.total("contentions"), raw.total("delay")),
        (writes, wait)
    );
    let file = file.to_str().unwrap();
    assert_eq!(top_total(&go, "", file), wait, "-top with no flag");
    let holders: Vec<&Value> = (p["samples"]["stacks"].as_array().unwrap().iter())
        .filter(|r| r["holder"] == true)
        .collect();
    let held = |k: &str| holders.iter().map(|r| r[k].as_i64().unwrap()).sum::<i64>();
    assert!(held("count") > 0, "no holder sampled");
    assert_eq!(
        (raw.total("holder_contentions"), raw.total("holder_delay")),
        (held("count"), held("wait_ns_sum"))
    );
    assert_eq!(top_total(&go, "holder_delay", file), held("wait_ns_sum"));
    let at = raw.locations_of("allocateBehindHolder");
    assert!(
        !at.is_empty(),
        "allocateBehindHolder is not named:\n{}",
        raw.text
    );
    assert!(at.iter().all(|l| l.contains("/holder.js:")), "{at:?}");
    for s in &raw.samples {
        assert_eq!(s.labels["op"], "write", "{s:?}");
    }
}
