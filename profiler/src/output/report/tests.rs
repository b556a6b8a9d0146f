//! The report built from a synthetic window: the contract's fields, shares, and its text.

use std::time::SystemTime;

use profiler_common::cause;

use super::*;
use crate::aggregation::{Attribution, SideStats, ThreadDelta, Window};
use crate::output::text::{fmt_ns, histogram_lines, to_text};
use crate::registry::roles::Role;
use crate::vocab::ids::ProcId;
use profiler_common::{COMM_LEN, StatsKey};

fn window() -> Window {
    let mut w = Window::default();
    let mut comm = [0u8; COMM_LEN];
    comm[..4].copy_from_slice(b"node");
    for (tid, tgid, n, wait) in [(10, 10, 2, 400), (11, 10, 5, 9000), (77, 77, 1, 50)] {
        let mut s = SideStats {
            count: n,
            ..Default::default()
        };
        s.wait.sum = wait * n;
        s.wait.max = wait;
        s.wait.add(profiler_common::bucket_index(wait), n);
        s.hold.add(1, n);
        s.hold.sum = n;
        s.hold.max = 1;
        // Thread 11 splits its writes between two causes.
        let kinds: &[(u32, u64)] = if tid == 11 {
            &[(cause::MPROTECT, 3), (cause::MUNMAP, 2)]
        } else {
            &[(cause::MMAP, n)]
        };
        for &(kind, k) in kinds {
            let mut part = s.clone();
            part.count = k;
            part.wait = Default::default();
            part.wait.sum = wait * k;
            part.wait.max = wait;
            part.wait.add(profiler_common::bucket_index(wait), k);
            part.hold = Default::default();
            part.hold.add(1, k);
            part.hold.sum = k;
            part.hold.max = 1;
            w.add(&ThreadDelta {
                key: StatsKey {
                    owner: 10,
                    tid,
                    kind,
                    _pad: 0,
                    owner_start: 0,
                    tid_start: 0,
                },
                tgid,
                comm,
                fsbase: 0,
                stats: part,
            });
        }
    }
    w
}

/// Builds as a run would, with thread 10 the main thread, 11 an `other` and 77 foreign.
fn test_build(kind: Kind, w: &Window, start: SystemTime, end: SystemTime) -> Report {
    build_in(crate::vocab::Mode::Full, kind, w, start, end)
}

fn build_in(
    mode: crate::vocab::Mode,
    kind: Kind,
    w: &Window,
    start: SystemTime,
    end: SystemTime,
) -> Report {
    let p = ProcId::new(10, 0);
    let t = |tid| crate::vocab::ids::ThreadId::new(tid, 0);
    let a = Attribution::with(
        &[(p, "node")],
        &[
            (p, t(10), Role::Main),
            (p, t(11), Role::Other),
            (p, t(77), Role::Foreign),
        ],
    );
    build(
        w,
        &a,
        Meta {
            kind,
            mode,
            start,
            end,
            lost: Lost::default(),
            uncounted: Uncounted::default(),
            overhead: None,
        },
    )
}

#[test]
fn summary_json_has_the_contract_fields() {
    let t0 = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
    let t1 = t0 + std::time::Duration::from_millis(2500);
    let r = test_build(Kind::Summary, &window(), t0, t1);
    let v: serde_json::Value = serde_json::from_str(&to_json_line(&r)).unwrap();
    assert_eq!(v["type"], "summary");
    assert_eq!(v["schema_version"], 1);
    assert_eq!(v["duration_s"], 2.5);
    assert!(v.get("interval_s").is_none());
    assert_eq!(v["start"], "2023-11-14T22:13:20.000Z");
    let p = &v["processes"][0];
    assert_eq!(p["pid"], 10);
    assert_eq!(p["write"]["count"], 8);
    assert_eq!(p["write"]["wait_ns"]["sum"], 400 * 2 + 9000 * 5 + 50);
    assert_eq!(p["write"]["wait_ns"]["max"], 9000);
    // Threads ordered by write wait: the worker-ish thread 11 first.
    let th = p["threads"].as_array().unwrap();
    assert_eq!(th[0]["tid"], 11);
    assert_eq!(th[0]["role"], "other");
    let main = th.iter().find(|t| t["tid"] == 10).unwrap();
    assert_eq!(main["role"], "main");
    let foreign = th.iter().find(|t| t["tid"] == 77).unwrap();
    assert_eq!(foreign["role"], "foreign");
    assert_eq!(foreign["pid"], 77);
    assert_eq!(v["lost"]["events"], 0);
    // Causes: per process, ordered by total wait, summing to the write count.
    let causes = p["causes"].as_array().unwrap();
    assert_eq!(causes[0]["cause"], "mprotect");
    assert_eq!(causes[0]["write"]["count"], 3);
    let total: u64 = causes
        .iter()
        .map(|c| c["write"]["count"].as_u64().unwrap())
        .sum();
    assert_eq!(total, 8);
    assert_eq!(th[0]["causes"].as_array().unwrap().len(), 2);
    // Buckets: [upper bound, count], non-empty only.
    let buckets = p["write"]["wait_ns"]["buckets"].as_array().unwrap();
    assert_eq!(buckets.len(), 3);
    assert!(buckets.iter().all(|b| b[1].as_u64().unwrap() > 0));
}

#[test]
fn time_shares_per_thread_process_and_role_count_idle_threads_and_leave_foreign_out() {
    let mut w = window();
    let p = ProcId::new(10, 0);
    let t = |tid| crate::vocab::ids::ThreadId::new(tid, 0);
    let set = |w: &mut Window, tid, alive_ns, cpu_ns| {
        w.processes
            .get_mut(&p)
            .unwrap()
            .get_mut(&t(tid))
            .unwrap()
            .time = crate::aggregation::ThreadTime {
            alive_ns,
            cpu_ns,
            queued_ns: None,
        };
    };
    // 10 (main) waited 800 ns of 8000; 11 (other) 45000 of 90000, 30000 on CPU.
    set(&mut w, 10, 8_000, None);
    set(&mut w, 11, 90_000, Some(30_000));
    set(&mut w, 77, 1_000, None);
    // A thread alive but idle in the window (role other: the attribution does not know it).
    let mut idle = crate::aggregation::Window::default();
    idle.processes
        .entry(p)
        .or_default()
        .insert(t(12), w.processes[&p][&t(10)].clone());
    let i = idle.processes.get_mut(&p).unwrap().get_mut(&t(12)).unwrap();
    (i.read, i.writes, i.downgrade) = Default::default();
    i.time.alive_ns = 2_000;
    w.add_thread(p, t(12), &idle.processes[&p][&t(12)].clone());
    let t0 = SystemTime::now();
    let r = test_build(Kind::Summary, &w, t0, t0);
    let v: serde_json::Value = serde_json::from_str(&to_json_line(&r)).unwrap();
    let proc = &v["processes"][0];
    assert!(
        proc["threads"]
            .as_array()
            .unwrap()
            .iter()
            .all(|x| x["tid"] != 12),
        "an idle thread is not listed"
    );
    let th = |tid| {
        proc["threads"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["tid"] == tid)
            .unwrap()
    };
    assert_eq!(th(11)["time_share"]["wall"], 0.5);
    assert_eq!(th(11)["time_share"]["cpu"], 1.5);
    assert!(th(10)["time_share"].get("cpu").is_none());
    // The process: its own threads (10, 11 and the idle 12), not the foreign 77.
    let all = &proc["time_share"];
    assert_eq!(all["alive_ns"], 100_000);
    assert_eq!(all["wait_ns"], 45_800);
    assert_eq!(all["threads"], 3);
    let role = |r: &str| {
        proc["time_share_by_role"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["role"] == r)
            .unwrap()
            .clone()
    };
    assert_eq!(role("main")["wall"], 0.1);
    assert_eq!(role("other")["alive_ns"], 92_000);
    assert_eq!(role("foreign")["wait_ns"], 50);
    // Text: the process's and the roles' shares.
    let text = to_text(&r);
    assert!(
        text.contains("its 3 threads spent 45.8% of their time"),
        "{text}"
    );
    assert!(text.contains("other threads (2) spent 48.9% of their time waiting for mmap_lock (1.50 s of wait per CPU-second)"), "{text}");
}

#[test]
fn interval_json_carries_interval_s() {
    let t0 = SystemTime::now();
    let r = test_build(
        Kind::Interval,
        &Window::default(),
        t0,
        t0 + std::time::Duration::from_secs(1),
    );
    let v: serde_json::Value = serde_json::from_str(&to_json_line(&r)).unwrap();
    assert_eq!(v["type"], "interval");
    assert_eq!(v["interval_s"], 1.0);
    assert!(v.get("duration_s").is_none());
    assert_eq!(v["processes"].as_array().unwrap().len(), 0);
}

#[test]
fn text_shows_tables_threads_and_histograms() {
    let t0 = SystemTime::now();
    let r = test_build(
        Kind::Summary,
        &window(),
        t0,
        t0 + std::time::Duration::from_secs(1),
    );
    let text = to_text(&r);
    assert!(text.contains("process 10"), "{text}");
    assert!(text.contains("write wait (log2 buckets)"), "{text}");
    assert!(text.contains("foreign"), "{text}");
    assert!(text.contains('█'), "{text}");
}

#[test]
fn histograms_share_rows_and_give_zero_waits_their_own() {
    let d = |buckets: Vec<(u64, u64)>| Dist {
        sum: 0,
        max: 0,
        mean: 0.0,
        p50: 0,
        p90: 0,
        p99: 0,
        p999: 0,
        buckets,
    };
    let a = d(vec![(1, 5), (128, 10)]);
    let b = d(vec![(512, 3)]);
    let cols = histogram_lines(&[&a, &b]);
    // rows: 0, <128ns, <256ns, <512ns
    assert_eq!(cols[0].len(), 4);
    assert_eq!(cols[1].len(), 4);
    assert!(cols[0][0].trim_start().starts_with('0') && cols[0][0].ends_with(" 5"));
    assert!(cols[0][1].contains("<128ns") && cols[0][1].ends_with(" 10"));
    assert!(cols[1][3].contains("<512ns") && cols[1][3].ends_with(" 3"));
    assert!(cols[1][0].ends_with(" 0"));
    assert!(histogram_lines(&[&d(vec![])])[0].is_empty());
}

#[test]
fn durations_read_naturally() {
    assert_eq!(fmt_ns(850), "850ns");
    assert_eq!(fmt_ns(12_345), "12.3us");
    assert_eq!(fmt_ns(4_560_000), "4.56ms");
    assert_eq!(fmt_ns(1_200_000_000), "1.20s");
}

/// Contention mode's lines say so, and carry no hold anywhere (not a zero that reads as a
/// measured hold); read back, they are the same, and a summary of its interval lines too.
#[test]
fn contention_lines_say_their_mode_and_have_no_hold() {
    use crate::vocab::Mode;
    let t0 = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
    let t1 = t0 + std::time::Duration::from_millis(1000);
    let full = to_json_line(&test_build(Kind::Interval, &window(), t0, t1));
    assert!(full.contains(r#""mode":"full""#), "{full}");
    assert!(full.contains("hold_ns"), "{full}");
    let r = build_in(Mode::Contention, Kind::Interval, &window(), t0, t1);
    let line = to_json_line(&r);
    assert!(line.contains(r#""mode":"contention""#), "{line}");
    assert!(!line.contains("hold_ns"), "{line}");
    let back: Report = serde_json::from_str(&line).unwrap();
    assert_eq!(back.mode, Mode::Contention);
    assert_eq!(back.processes[0].lock.write.count, 8);
    assert!(back.processes[0].lock.write.hold_ns.is_none());
    // A line without `mode` (older builds) is full mode's, holds and all.
    let old = full.replace(r#""mode":"full","#, "");
    assert_ne!(old, full);
    let back: Report = serde_json::from_str(&old).unwrap();
    assert_eq!(back.mode, Mode::Full);
    assert!(back.processes[0].lock.write.hold_ns.is_some());
    // A run cut short: its interval lines summed keep their mode.
    let mut summed = crate::output::partial::Summed::default();
    summed.add(&r);
    summed.add(&r);
    let s = summed.report();
    assert_eq!(
        (s.mode, s.processes[0].lock.write.count),
        (Mode::Contention, 16)
    );
    assert!(!to_json_line(&s).contains("hold_ns"));
    // The text says what the numbers are, and shows no hold.
    let text = to_text(&build_in(
        Mode::Contention,
        Kind::Summary,
        &window(),
        t0,
        t1,
    ));
    assert!(
        text.contains("contention mode: counts and waits are the contended waits only"),
        "{text}"
    );
    assert!(text.contains("contended"), "{text}");
    assert!(!text.contains("write hold (log2 buckets)"), "{text}");
    let full_text = to_text(&test_build(Kind::Summary, &window(), t0, t1));
    assert!(!full_text.contains("contention mode"), "{full_text}");
    assert!(
        full_text.contains("write hold (log2 buckets)"),
        "{full_text}"
    );
}
