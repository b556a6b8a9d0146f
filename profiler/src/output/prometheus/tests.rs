//! The exposition against the contract: buckets, names, labels and their order.

use super::buckets::{classic, native, native_index};
use super::*;
use profiler_common::{HIST_BUCKETS, bucket_index};

fn hist(values: &[u64]) -> DurationHist {
    let mut d = DurationHist::default();
    for &v in values {
        d.add(bucket_index(v), 1);
        d.sum += v;
    }
    let mut h = DurationHist::default();
    h.merge(&d);
    h
}

/// The series of node's Worker threads' writes.
fn worker_writes(cgroup: &str, pid: Option<u32>) -> SeriesKey {
    SeriesKey {
        process: "node".into(),
        cgroup: cgroup.into(),
        role: "worker",
        op: "write",
        pid,
    }
}

#[test]
fn classic_buckets_are_the_kernel_buckets() {
    let h = hist(&[0, 100, 100, 5000]);
    let c = classic(&h);
    assert_eq!(c.len(), HIST_BUCKETS);
    assert_eq!(c[0], (1e-9, 1));
    // 100 ns is in [64, 128): le = 128 ns.
    assert_eq!(c[bucket_index(100)], (128e-9, 2));
    assert!(c.last().unwrap().0.is_infinite());
    assert_eq!(c.iter().map(|b| b.1).sum::<u64>(), 4);
    assert_eq!((h.count(), h.sum), (4, 5200));
}

#[test]
fn native_buckets_move_a_count_one_bucket_at_most() {
    for i in 1..HIST_BUCKETS {
        let (lo, hi) = ((1u64 << (i - 1)) as f64 * 1e-9, (1u64 << i) as f64 * 1e-9);
        let k = native_index(i);
        // Native bucket k holds (2^(k-1), 2^k] s: it holds the kernel bucket's lower
        // bound, and its upper bound lies in k + 1.
        let (nlo, nhi) = (2f64.powi(k - 1), 2f64.powi(k));
        assert!(nlo < lo && lo <= nhi, "{i}: {lo} in ({nlo}, {nhi}]");
        assert!(hi > nhi && hi <= 2.0 * nhi, "{i}: {hi} in the next bucket");
    }
}

#[test]
fn native_spans_and_deltas() {
    let h = hist(&[0, 3, 3, 5, 1000, 1000, 1000]);
    let (spans, deltas) = native(&h);
    // Kernel buckets 2 (3 ns: 2), 3 (5 ns: 1), 10 (1000 ns: 3).
    assert_eq!(spans, vec![(native_index(2), 2), (10 - 4, 1)]);
    assert_eq!(deltas, vec![2, -1, 2]);
    assert_eq!(h.bucket(0), 1, "the zero bucket");
}

#[test]
fn text_exposition_has_the_contract_names() {
    let shared = Shared(Arc::new(Mutex::new(Metrics::new(
        false,
        "6.18".into(),
        "6.14+".into(),
    ))));
    {
        let mut m = shared.0.lock().unwrap();
        let key = worker_writes("/system.slice/api.service", None);
        let mut s = SideStats {
            count: 2,
            failed: 1,
            ..Default::default()
        };
        s.wait.add(bucket_index(1000), 2);
        s.wait.sum = 2000;
        s.hold.add(bucket_index(50), 2);
        s.hold.sum = 100;
        m.add_side(key, &s, "mprotect");
        m.thread_time.insert(
            (
                "node".into(),
                "/system.slice/api.service".into(),
                "worker",
                None,
            ),
            (2_500_000_000, Some(500_000_000)),
        );
        // Threads whose CPU time the kernel did not report: their wall time only.
        m.thread_time.insert(
            (
                "node".into(),
                "/system.slice/api.service".into(),
                "libuv",
                None,
            ),
            (1_000_000_000, None),
        );
    }
    let text = encode_text(&registry(shared)).unwrap();
    for needle in [
        "mmaplock_wait_seconds_bucket{le=\"0.000001024\",process=\"node\",cgroup=\"/system.slice/api.service\",role=\"worker\",op=\"write\",mode=\"full\"} 2",
        "mmaplock_wait_seconds_bucket{le=\"1e-9\",",
        "mmaplock_wait_seconds_bucket{le=\"+Inf\",",
        "mmaplock_wait_seconds_sum{",
        "mmaplock_wait_seconds_count{process=\"node\",cgroup=\"/system.slice/api.service\",role=\"worker\",op=\"write\",mode=\"full\"} 2",
        "mmaplock_hold_seconds_bucket{",
        "mmaplock_acquisitions_total{process=\"node\",cgroup=\"/system.slice/api.service\",role=\"worker\",op=\"write\",mode=\"full\",cause=\"mprotect\"} 2",
        "mmaplock_failed_trylocks_total{process=\"node\",cgroup=\"/system.slice/api.service\",op=\"write\",mode=\"full\"} 1",
        "mmaplock_lost_total{reason=\"events\"} 0",
        "mmaplock_tracked_processes 0",
        "mmaplock_thread_seconds_total{process=\"node\",cgroup=\"/system.slice/api.service\",role=\"worker\",mode=\"full\"} 2.5",
        "mmaplock_thread_cpu_seconds_total{process=\"node\",cgroup=\"/system.slice/api.service\",role=\"worker\",mode=\"full\"} 0.5",
        "mmaplock_build_info{version=",
    ] {
        assert!(text.contains(needle), "{needle}\n{text}");
    }
    assert!(!text.contains("pid="), "no pid label unless asked");
    assert!(text.contains("mmaplock_thread_seconds_total{process=\"node\",cgroup=\"/system.slice/api.service\",role=\"libuv\",mode=\"full\"} 1"));
    assert!(!text.contains("mmaplock_thread_cpu_seconds_total{process=\"node\",cgroup=\"/system.slice/api.service\",role=\"libuv\",mode=\"full\"}"));
}

#[test]
fn every_process_series_has_process_cgroup_its_own_labels_then_pid() {
    let shared = Shared(Arc::new(Mutex::new(
        Metrics::new(true, "6.18".into(), "6.14+".into()).with_js_functions(2),
    )));
    {
        let mut m = shared.0.lock().unwrap();
        let key = worker_writes("/a", Some(7));
        let s = SideStats {
            count: 2,
            ..Default::default()
        };
        m.add_side(key.clone(), &s, "mmap");
        m.downgrades.insert(key, 3);
        m.failed
            .insert(("node".into(), "/a".into(), "read", Some(7)), 4);
        let blocked = (
            "node".into(),
            "/a".into(),
            "worker",
            "main",
            "mmap".into(),
            Some(7),
        );
        m.blocked.insert(blocked, 1_500_000_000);
        m.thread_time.insert(
            ("node".into(), "/a".into(), "worker", Some(7)),
            (2_000_000_000, Some(500_000_000)),
        );
        m.js_functions
            .insert(("node".into(), "/a".into(), "f (x.js:1)".into()), 12);
    }
    let text = encode_text(&registry(shared)).unwrap();
    for line in [
        r#"mmaplock_acquisitions_total{process="node",cgroup="/a",role="worker",op="write",pid="7",mode="full",cause="mmap"} 2"#,
        r#"mmaplock_downgrades_total{process="node",cgroup="/a",role="worker",pid="7",mode="full"} 3"#,
        r#"mmaplock_failed_trylocks_total{process="node",cgroup="/a",op="read",pid="7",mode="full"} 4"#,
        r#"mmaplock_blocked_seconds_total{process="node",cgroup="/a",waiter_role="worker",holder_role="main",holder_cause="mmap",pid="7",mode="full"} 1.5"#,
        r#"mmaplock_thread_seconds_total{process="node",cgroup="/a",role="worker",pid="7",mode="full"} 2.0"#,
        r#"mmaplock_thread_cpu_seconds_total{process="node",cgroup="/a",role="worker",pid="7",mode="full"} 0.5"#,
        r#"mmaplock_js_function_sampled_writes_total{process="node",cgroup="/a",function="f (x.js:1)",mode="full"} 12"#,
    ] {
        assert!(text.lines().any(|l| l == line), "{line}\n{text}");
    }
}

#[test]
fn series_say_their_mode_and_the_agent_says_when_it_fell_back() {
    let shared = Shared(Arc::new(Mutex::new(
        Metrics::new(false, "6.18".into(), "6.14+".into()).with_mode(Mode::Contention, false),
    )));
    {
        let mut m = shared.0.lock().unwrap();
        let s = SideStats {
            count: 3,
            ..Default::default()
        };
        m.add_side(worker_writes("/a", None), &s, "mmap");
    }
    let text = encode_text(&registry(shared.clone())).unwrap();
    for line in [
        r#"mmaplock_acquisitions_total{process="node",cgroup="/a",role="worker",op="write",mode="contention",cause="mmap"} 3"#,
        r#"mmaplock_mode_fallback 0"#,
    ] {
        assert!(text.lines().any(|l| l == line), "{line}\n{text}");
    }
    assert!(
        text.lines()
            .any(|l| l.starts_with("mmaplock_build_info{") && l.contains(r#"mode="contention""#)),
        "{text}"
    );
    let full = Shared(Arc::new(Mutex::new(
        Metrics::new(false, "5.15".into(), "5.8-6.13".into()).with_mode(Mode::Full, true),
    )));
    let text = encode_text(&registry(full)).unwrap();
    assert!(
        text.lines().any(|l| l == "mmaplock_mode_fallback 1"),
        "{text}"
    );
    assert!(text.contains(r#"mode="full""#), "{text}");
}

#[test]
fn escalations_are_exported_only_when_on_and_name_the_capture_running() {
    let shared = Shared(Arc::new(Mutex::new(Metrics::new(
        false,
        "6.12".into(),
        "6.14+".into(),
    ))));
    let text = encode_text(&registry(shared.clone())).unwrap();
    assert!(!text.contains("escalation"), "{text}");
    {
        let mut m = shared.0.lock().unwrap();
        let mut e = Escalations::default();
        e.count("node".into(), "/a".into(), "captured");
        e.count("node".into(), "/a".into(), "captured");
        e.count("node".into(), "/b".into(), "cooldown");
        m.escalations = Some(e);
    }
    let text = encode_text(&registry(shared.clone())).unwrap();
    for line in [
        r#"mmaplock_escalations_total{process="node",cgroup="/a",reason="captured"} 2"#,
        r#"mmaplock_escalations_total{process="node",cgroup="/b",reason="cooldown"} 1"#,
        "mmaplock_escalation_in_progress 0",
        "mmaplock_escalations_waiting 0",
    ] {
        assert!(text.lines().any(|l| l == line), "{line}\n{text}");
    }
    shared
        .0
        .lock()
        .unwrap()
        .escalations
        .as_mut()
        .unwrap()
        .in_progress = Some(("node".into(), "/a".into()));
    let text = encode_text(&registry(shared)).unwrap();
    let line = r#"mmaplock_escalation_in_progress{process="node",cgroup="/a"} 1"#;
    assert!(text.lines().any(|l| l == line), "{text}");
    assert!(
        !text.contains("mmaplock_escalation_in_progress 0"),
        "{text}"
    );
}
