//! ROOT-ONLY: the right story on a service of the shape users meet. An HTTP endpoint whose
//! every request is a call of a native addon on libuv's threadpool that allocates a large
//! block, starts and joins a thread per lane, and frees the block (a memory-hard password
//! hash): the findings follow the evidence from the writers (libuv's threads, in the addon's
//! code) through the mechanism their stacks show (thread creation) to the waiters (the lanes,
//! the other calls), in both modes; and what removing a wait gives back, throughput or latency
//! only, is checked against the measured effect of the advice applied, on a CPU-bound run and
//! on a run with idle cores.

use integration_tests::{
    Finished, bpf_test,
    lanes::{Shape, build_lanes_addon, can_shape, profiled, throughputs},
};
use serde_json::Value;

/// CPU-bound: eight lanes per call and four calls at once on one CPU. The lanes outnumber
/// it, are preempted while a page fault holds the lock for read, and the writes of thread
/// creation queue behind them (the service, in small).
const CPU_BOUND: Shape = Shape {
    block_kib: 36 * 1024,
    lanes: 8,
    passes: 1,
    pause_us: 0,
    stack_kib: 0,
    conns: 4,
    requests: 60,
    pool: 4,
    cpus: "0",
    client_cpus: "1",
    realtime: false,
};

/// Idle cores: one lane per call and two calls at once on two CPUs (never more runnable
/// threads than CPUs): nothing is preempted with the lock held, and what waits is the other
/// call's mmap behind a block's unmap (the block above malloc's mmap threshold, unmapped
/// with the lock held while the kernel frees its pages).
const IDLE_CORES: Shape = Shape {
    block_kib: 36 * 1024,
    lanes: 1,
    passes: 0,
    pause_us: 0,
    stack_kib: 0,
    conns: 2,
    requests: 150,
    pool: 2,
    cpus: "0,1",
    client_cpus: "0,1",
    realtime: true,
};

const STACK_CACHE: (&str, &str) = ("GLIBC_TUNABLES", "glibc.pthread.stack_cache_size=536870912");

/// Contention mode sees only the writes that waited, and which of a run's writes wait is
/// the scheduler's doing: a run with fewer than [`MIN_CONTENDED`] contended writes says too
/// little to compare with full mode, and is run again (three runs at most).
fn contended_run(run: impl Fn() -> Finished) -> Finished {
    let mut seen = Vec::new();
    for _ in 0..3 {
        let out = run();
        let n: u64 = (out.summary()["processes"].as_array().into_iter().flatten())
            .map(|p| p["write"]["count"].as_u64().unwrap_or(0))
            .sum();
        if n >= MIN_CONTENDED {
            return out;
        }
        seen.push(n);
    }
    panic!("three contention-mode runs with fewer than {MIN_CONTENDED} contended writes: {seen:?}");
}

/// Contended writes a contention-mode run of the shape needs to tell its mechanisms apart.
const MIN_CONTENDED: u64 = 20;

/// The findings of a run's summary.
fn findings(out: &Finished) -> Vec<Value> {
    out.summary()["findings"]
        .as_array()
        .expect("findings")
        .clone()
}

fn with_id<'a>(f: &'a [Value], id: &str) -> Option<&'a Value> {
    f.iter().find(|f| f["id"] == id)
}

fn texts(v: &Value) -> Vec<&str> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

/// The headline of a run names the thread-creation mechanism: its writers' code and role,
/// the lanes as its victims, thread reuse and the stack cache in its advice; and no finding
/// says that code takes the lock for write with no writes, nor quotes JavaScript its writes'
/// stacks do not have.
fn assert_thread_headline(out: &Finished, mode: &str) -> Value {
    let all = findings(out);
    let first = all.first().unwrap_or_else(|| panic!("{mode}: no findings"));
    // Full mode ranks the mechanisms by the wait charged to every one of their writes:
    // thread creation heads. Contention mode sees only the writes that waited, and on this
    // shape the few contended writes of the lanes' blocks (a dozen, each a 36 MiB mmap) and
    // those of their threads' stacks take turns at the head from run to run: there thread
    // creation is the headline or the finding after the blocks'.
    let f = if mode == "contention" && first["id"] == "mmap-threshold" {
        // And the headline says why the modes differ: its rank rests on contended writes.
        assert!(
            texts(&first["evidence"]["facts"])
                .iter()
                .any(|x| x.starts_with("ranked above thread-stacks on contended writes only")),
            "{mode}: the blocks head without saying why: {first}"
        );
        all.get(1)
            .filter(|g| g["id"] == "thread-stacks")
            .unwrap_or_else(|| panic!("{mode}: thread creation is not next to the blocks: {all:?}"))
    } else {
        first
    };
    eprintln!("{mode}: {}", serde_json::to_string_pretty(f).unwrap());
    assert_eq!(f["id"], "thread-stacks", "{mode}: the headline is {f}");
    let title = f["title"].as_str().unwrap();
    assert!(
        title.starts_with("hash_lanes (lanes.node) starts and joins threads (libuv threads)"),
        "{mode}: {title}"
    );
    assert_eq!(texts(&f["evidence"]["roles"]), ["libuv"], "{mode}");
    assert_eq!(
        texts(&f["evidence"]["code"]).first(),
        Some(&"hash_lanes (lanes.node)"),
        "{mode}"
    );
    let victims: Vec<&str> = f["evidence"]["victims"]
        .as_array()
        .expect("victims")
        .iter()
        .map(|v| v["role"].as_str().unwrap())
        .collect();
    assert!(
        victims.contains(&"addon"),
        "{mode}: the lanes waited: {victims:?}"
    );
    assert!(f["wait_ns"].as_u64().unwrap() > 0 && f["writes"].as_u64().unwrap() > 0);
    let advice = texts(&f["advice"]).join("\n");
    assert!(advice.contains("Reuse threads"), "{mode}: {advice}");
    assert!(
        advice.contains("GLIBC_TUNABLES=glibc.pthread.stack_cache_size="),
        "{mode}: {advice}"
    );
    // The lanes run on libuv's threads, where no JavaScript is: none is quoted.
    assert!(
        texts(&f["evidence"]["js_functions"]).is_empty(),
        "{mode}: {f}"
    );
    for g in &all {
        let t = g["title"].as_str().unwrap();
        assert!(!t.contains("takes the lock for write"), "{mode}: {t}");
    }
    f.clone()
}

/// CPU-bound, in both modes: the headline is thread creation in the addon's code on libuv's
/// threads, with the lanes as its victims; its cost is latency only. Keeping freed stacks
/// (its advice, `GLIBC_TUNABLES`), applied as a study does: the mechanism's writes and the
/// wait behind them are gone as predicted, and the requests per second do not move beyond
/// the throughput the finding said it could give back (the CPU its writes took) and the runs'
/// noise, though its threads waited a good share of their time.
#[test]
fn on_a_cpu_bound_run_thread_creation_is_the_headline_in_both_modes_and_its_cost_is_latency() {
    let Some(dir) = bpf_test() else { return };
    if !can_shape() {
        return;
    }
    let addon = build_lanes_addon(dir.path());
    // Full mode, who made whom wait measured; one write in 4 sampled (the run is short).
    let (full, _) = profiled(
        &addon,
        &CPU_BOUND,
        &[],
        &["--blockers", "--stack-sample", "4"],
    );
    let f = assert_thread_headline(&full, "full");
    let impact = &f["impact"];
    assert_eq!(impact["kind"], "latency", "{f}");
    assert!(
        ["low", "info"].contains(&f["severity"].as_str().unwrap()),
        "{f}"
    );
    let predicted = impact["throughput_gain"].as_f64().unwrap();
    // At most the time its writes held the lock (the CPU they took, and more where a holder
    // was preempted): a few percent.
    assert!(predicted < 0.05, "{impact}");
    // Its victims waited (7-15% of the threads' time in runs here, a few tenths of a
    // percent on a host busy with other work), which it does not promise back.
    assert!(
        f["time_share"].as_f64().unwrap() > 0.0 && f["wait_ns"].as_u64().unwrap() > 0,
        "its victims waited: {f}"
    );
    // Contention mode on the same workload: the same headline, from the holders' stacks and
    // the contended writes'.
    let contention = contended_run(|| {
        profiled(
            &addon,
            &CPU_BOUND,
            &[],
            &["--mode", "contention", "--stack-sample", "1"],
        )
        .0
    });
    let c = assert_thread_headline(&contention, "contention");
    assert_eq!(c["impact"]["kind"], "latency", "{c}");

    // The advice applied: stacks kept for reuse.
    let (kept, _) = profiled(
        &addon,
        &CPU_BOUND,
        &[STACK_CACHE],
        &["--blockers", "--stack-sample", "4"],
    );
    let writes = f["writes"].as_u64().unwrap();
    let after = findings(&kept);
    let left = with_id(&after, "thread-stacks");
    let (w, wait) = left.map_or((0, 0), |t| {
        (
            t["writes"].as_u64().unwrap(),
            t["wait_ns"].as_u64().unwrap(),
        )
    });
    assert!(
        w * 5 <= writes,
        "the stack cache leaves {w} of the {writes} thread-stack writes: {left:?}"
    );
    // And the wait behind them falls, though less than the writes do: on a CPU-bound run
    // the writes left wait behind holders preempted with the lock held (a third to a half
    // of the wait was left in runs here, against a fifth of the writes).
    assert!(
        wait < f["wait_ns"].as_u64().unwrap(),
        "and the wait behind them: {wait} ns left of {}",
        f["wait_ns"]
    );
    // What it gave back, in requests per second, beside what was predicted: said, not
    // asserted (a throughput is a speed: on a host shared with other work the runs' noise
    // exceeds the few percent at stake; the closing notes and docs/findings.md quote it;
    // `cargo xtask bench --only advice` measures it beside an A/A).
    let (base, tuned) = throughputs(&addon, &CPU_BOUND, &[], &[STACK_CACHE], 5);
    let gain = tuned / base - 1.0;
    eprintln!(
        "CPU-bound: predicted at most {predicted:+.3}, measured {gain:+.3} ({base:.1} -> {tuned:.1} requests/s)"
    );
}

/// Idle cores: the CPUs had room (its threads never outnumbered them), so the wait there is
/// throughput, and each finding says so; with nothing preempted with the lock held, the wait
/// is a few milliseconds behind the blocks' unmaps, and the finding promises a few percent.
/// Giving the block's pages back in pieces before freeing it (its advice, applied in the
/// addon) takes that wait away, and the requests per second gain what was predicted (and
/// more: freeing the pages in pieces also shortens the free itself, which is not a wait).
#[test]
fn on_idle_cores_the_wait_is_throughput_and_its_advice_gains_what_was_predicted() {
    let Some(dir) = bpf_test() else { return };
    if !can_shape() {
        return;
    }
    let addon = build_lanes_addon(dir.path());
    let args = ["--blockers", "--stack-sample", "4"];
    let (out, _) = profiled(&addon, &IDLE_CORES, &[], &args);
    let all = findings(&out);
    eprintln!("{}", serde_json::to_string_pretty(&all).unwrap());
    let f = with_id(&all, "mmap-threshold").expect("the large blocks' finding");
    assert!(
        f["title"].as_str().unwrap().starts_with(
            "hash_lanes (lanes.node) allocates and frees large blocks (libuv threads)"
        ),
        "{f}"
    );
    // Every finding with a wait: throughput (its CPUs had room).
    for g in all.iter().filter(|g| g.get("impact").is_some()) {
        assert_eq!(g["impact"]["kind"], "throughput", "{g}");
    }
    let impact = &f["impact"];
    let queued = impact["queued_ns"].as_f64().unwrap();
    let cpu = impact["cpu_ns"].as_f64().unwrap();
    assert!(queued < 0.25 * (queued + cpu), "{impact}");
    let predicted = impact["throughput_gain"].as_f64().unwrap();
    assert!((0.0..0.1).contains(&predicted), "{impact}");
    assert!(texts(&f["advice"]).join("\n").contains("in pieces"), "{f}");
    // The advice applied: the wait behind the unmaps is gone.
    let pieces = [("LANES_FREE_IN_PIECES", "1")];
    let (after, _) = profiled(&addon, &IDLE_CORES, &pieces, &args);
    let behind = |out: &Finished| -> u64 {
        let p = &out.summary()["processes"][0];
        (p["blocked_by_role"].as_array().into_iter().flatten())
            .filter(|r| r["cause"] == "downgrade")
            .map(|r| r["wait_ns"].as_u64().unwrap())
            .sum()
    };
    let (before_ns, after_ns) = (behind(&out), behind(&after));
    assert!(
        after_ns * 2 <= before_ns,
        "the wait behind the unmaps' holds: {before_ns} ns before, {after_ns} ns after"
    );
    // The throughput it gave back beside the prediction: said, not asserted (see the
    // CPU-bound test).
    let (base, tuned) = throughputs(&addon, &IDLE_CORES, &[], &pieces, 3);
    let gain = tuned / base - 1.0;
    eprintln!(
        "idle cores: predicted up to {predicted:+.3}, measured {gain:+.3} ({base:.1} -> {tuned:.1} requests/s)"
    );
}
