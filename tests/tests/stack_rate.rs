//! ROOT-ONLY: how often the agent takes a process's stacks. Its bound on the stacks a process
//! takes a second (`--max-stack-rate`): a process that writes (or waits) far more often than
//! the bound is sampled less often, in the kernel, and its samples, weighted by the rate each
//! was drawn at, still add up to its writes, checked against `mmap-churn`'s known count in both
//! modes. And `--escalate-dir`'s sampling floor, which starts a second after a process's first
//! wait.

use integration_tests::{
    Workload, bpf_test, bpftrace::require_contention_tracepoints, read_lines, scrape::Agent,
};
use serde_json::Value;

/// What the agent's interval lines say of process `pid`: its writes (full mode: all of them;
/// contention mode: the contended ones), its sampled writes as weighted, and the raised rates
/// it was sampled at.
fn totals(lines: &[Value], pid: u32) -> (u64, u64, Vec<u64>) {
    let (mut writes, mut sampled, mut raised) = (0, 0, Vec::new());
    let of_pid = (lines.iter())
        .filter(|l| l["type"] == "interval")
        .flat_map(|l| l["processes"].as_array().unwrap())
        .filter(|p| p["pid"] == pid);
    for p in of_pid {
        writes += p["write"]["count"].as_u64().unwrap_or(0);
        let dsos = p["dsos"].as_array().map(Vec::as_slice).unwrap_or_default();
        sampled += (dsos.iter())
            .map(|d| d["write"]["count"].as_u64().unwrap())
            .sum::<u64>();
        raised.extend(p["stack_sample_raised"].as_u64());
    }
    (writes, sampled, raised)
}

/// 4 threads x `iterations` mmap/munmap pairs under the agent, every write's stack asked for
/// (`--stack-sample 1`) but at most `per_s` a second: the rate is raised, said in the interval
/// lines, and the sampled writes, weighted, come within 30% of the writes counted. Unweighted
/// they would be a few hundred against tens of thousands (`per_s` a second over a run of a
/// few seconds); sampled at the asked rate, the process's stacks would be hundreds of
/// thousands.
fn bounded(mode: &str, iterations: u32, per_s: &str) {
    let Some(dir) = bpf_test() else { return };
    let ndjson = dir.path().join("agent.json");
    let mut w = Workload::churn(4, iterations, None);
    let pid = w.pid.to_string();
    let agent = Agent::start(&[
        "--mode",
        mode,
        "--pid",
        &pid,
        "-i",
        "0.5",
        "--pprof",
        "--stack-sample",
        "1",
        "--max-stack-rate",
        per_s,
        "-o",
        ndjson.to_str().unwrap(),
    ]);
    w.go();
    assert!(w.wait().success());
    agent.stop();
    let lines = read_lines(&ndjson);
    let (writes, sampled, raised) = totals(&lines, w.pid);
    eprintln!("{mode}: {writes} writes, {sampled} sampled (weighted), raised to {raised:?}");
    let lost: u64 = (lines.iter())
        .map(|l| l["lost"]["stacks"].as_u64().unwrap_or(0))
        .sum();
    // Bounded from the process's first window: no burst of stacks the agent falls behind on.
    assert_eq!(lost, 0, "stacks lost");
    if mode == "full" {
        assert!(writes >= 8 * u64::from(iterations), "{writes} writes");
    } else {
        assert!(writes >= 300, "{writes} contended writes: too few to bound");
    }
    // Raised past 1 in 1 (full mode: the churn writes tens of thousands a second; contention
    // mode: it waits hundreds of times a second).
    let top = raised.iter().copied().max().unwrap_or(0);
    assert!(top >= 4, "the rate was not raised: {raised:?}");
    let off = (sampled as f64 - writes as f64).abs() / writes as f64;
    assert!(
        off <= 0.3,
        "{sampled} sampled writes, weighted, against {writes} writes ({:.0}% off)",
        off * 100.0
    );
}

#[test]
fn a_process_past_the_stack_rate_is_sampled_less_often_its_samples_weighted_full_mode() {
    bounded("full", 40_000, "200");
}

#[test]
fn a_process_past_the_stack_rate_is_sampled_less_often_its_samples_weighted_contention_mode() {
    if !require_contention_tracepoints() {
        return;
    }
    // More writes: a few in a hundred of them wait, and a longer run draws more samples.
    bounded("contention", 150_000, "50");
}

/// `--escalate-dir`'s floor (a process's wait sampled whenever the process had none sampled
/// for a second) starts a second after its first wait: `time-share wait` (a waiter behind a
/// writer holding the lock for milliseconds at a time, for SECS of wall time, whatever the
/// machine's speed) takes no floor sample in 0.3 s, and one or more in 3 s. `--stack-sample
/// 1000000`: nothing else samples (a thread's first gap is drawn in 1..2,000,000, and it waits
/// a few thousand times at most).
#[test]
fn the_escalation_floor_starts_a_second_after_a_process_first_waits() {
    let Some(dir) = bpf_test() else { return };
    if !require_contention_tracepoints() {
        return;
    }
    let ndjson = dir.path().join("agent.json");
    let mut short = Workload::helper("time-share", ["wait", "0.3"]);
    let mut long = Workload::helper("time-share", ["wait", "3"]);
    let (a, b) = (short.pid.to_string(), long.pid.to_string());
    let agent = Agent::start(&[
        "--mode",
        "contention",
        "--pid",
        &a,
        "--pid",
        &b,
        "-i",
        "0.5",
        "--pprof",
        "--stack-sample",
        "1000000",
        "--escalate-dir",
        dir.path().join("captures").to_str().unwrap(),
        "--escalate-at",
        "100",
        "-o",
        ndjson.to_str().unwrap(),
    ]);
    short.go();
    long.go();
    assert!(short.wait().success() && long.wait().success());
    agent.stop();
    let lines = read_lines(&ndjson);
    let (short_waits, short_sampled, _) = totals(&lines, short.pid);
    let (long_waits, long_sampled, _) = totals(&lines, long.pid);
    eprintln!(
        "0.3 s: {short_waits} contended writes, {short_sampled} sampled; \
         3 s: {long_waits} contended writes, {long_sampled} sampled"
    );
    assert!(
        short_waits >= 5 && long_waits >= 50,
        "too few waits to judge"
    );
    assert_eq!(
        short_sampled, 0,
        "a floor sample in the process's first second"
    );
    assert!(long_sampled >= 1, "no floor sample after the first second");
}
