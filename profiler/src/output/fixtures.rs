//! Synthetic reports for the tests of what reads and renders them: built through the report's
//! own types, so that they are what the profiler writes.

use crate::{
    aggregation::{DurationHist, SideStats},
    output::report::{
        CauseReport, Kind, LockReport, ProcessReport, Report, Stats, ThreadReport, TimeShare,
    },
    registry::roles::Role,
};

/// How the process's write STATS begin in the JSON of [`summary_line`] (once in the line).
pub const WRITE_JSON_START: &str = "\"write\":{";

/// STATS of `count` acquisitions that waited `wait_sum` in all, `max` the longest, in these
/// `(upper_bound_ns, count)` buckets; each held the lock about 300 ns.
pub fn stats(count: u64, wait_sum: u64, max: u64, buckets: &[(u64, u64)]) -> Stats {
    Stats::new(&SideStats {
        count,
        failed: 0,
        wait: DurationHist::from_upper_bounds(wait_sum, max, buckets.iter().copied()),
        hold: DurationHist::from_upper_bounds(300 * count, 500, [(512, count)]),
    })
}

/// A process with 10 writes (6 in [512, 1024) ns, 4 in [4096, 8192)) that waited `wait` in
/// all, 2 reads, two causes and two threads (main and a worker), and with `flame`, two folded
/// stacks.
pub fn process(pid: u32, comm: &str, wait: u64, flame: bool) -> ProcessReport {
    let thread = |tid, role, comm: &str, write| ThreadReport {
        tid,
        role,
        comm: comm.into(),
        pid: None,
        role_addon: None,
        role_library: None,
        lock: LockReport {
            write,
            ..LockReport::default()
        },
        blocked_by: None,
        time_share: None,
    };
    let cause = |name: &'static str, write| CauseReport {
        cause: name.into(),
        write,
    };
    ProcessReport {
        pid,
        start_ticks: 5,
        comm: comm.into(),
        lock: LockReport {
            write: stats(10, wait, 5000, &[(1024, 6), (8192, 4)]),
            read: stats(2, 10, 100, &[(64, 2)]),
            downgrade: Stats::default(),
            causes: vec![
                cause("mprotect", stats(7, wait, 6000, &[(1024, 3), (8192, 4)])),
                cause("munmap", stats(3, 0, 1000, &[(1024, 3)])),
            ],
        },
        flame: flame.then(|| {
            vec![
                crate::output::report::FlameStack {
                    stack: "main;alloc;mmap".into(),
                    count: 5,
                },
                crate::output::report::FlameStack {
                    stack: "main;\"quoted\" <fn>;munmap".into(),
                    count: 2,
                },
            ]
        }),
        // The same stacks as a summary writes them (its `flame` is derived from them).
        samples: flame.then(|| {
            use crate::output::report::{FrameReport, SampleReport, SampledStacks};
            let frame = |f: &str| FrameReport {
                function: f.into(),
                ..FrameReport::default()
            };
            let stack = |frames: Vec<u32>, count| SampleReport {
                frames,
                role: Role::Worker,
                comm: "w".into(),
                cause: "mmap".into(),
                op: "write".into(),
                count,
                wait_ns_sum: 100 * count,
                hold_ns_sum: Some(10),
                holder: false,
            };
            SampledStacks {
                frames: ["mmap", "alloc", "main", "munmap", "\"quoted\" <fn>"]
                    .map(frame)
                    .to_vec(),
                stacks: vec![stack(vec![0, 1, 2], 5), stack(vec![3, 4, 2], 2)],
                cut: Default::default(),
            }
        }),
        threads: vec![
            thread(pid, Role::Main, comm, stats(4, 1, 900, &[(1024, 4)])),
            thread(
                pid + 1,
                Role::Worker,
                "w",
                stats(6, wait.saturating_sub(1), 6500, &[(8192, 6)]),
            ),
        ],
        ..ProcessReport::default()
    }
}

/// A summary of these processes, two seconds long.
pub fn summary(processes: Vec<ProcessReport>) -> Report {
    Report {
        start: "2026-01-01T00:00:00.000Z".into(),
        end: "2026-01-01T00:00:02.000Z".into(),
        duration_s: Some(2.0),
        processes,
        ..Report::empty_for_tests()
    }
}

/// An interval line ending at `end`, its process 1 (`node`) having waited `wait`.
pub fn interval(end: &str, wait: u64) -> Report {
    Report {
        kind: Kind::Interval,
        start: "2026-01-01T00:00:00.000Z".into(),
        end: end.into(),
        interval_s: Some(1.0),
        duration_s: None,
        processes: vec![process(1, "node", wait, false)],
        ..Report::empty_for_tests()
    }
}

/// Reports as newline-delimited JSON.
pub fn ndjson(lines: &[&Report]) -> String {
    lines
        .iter()
        .map(|l| serde_json::to_string(l).expect("a report") + "\n")
        .collect()
}

/// The JSON line of a summary of process 1, `node`.
pub fn summary_line() -> String {
    serde_json::to_string(&summary(vec![process(1, "node", 5000, false)])).expect("a report")
}

/// A summary line with the base contract's fields only (docs/cli-and-report.md), as the
/// first builds wrote them: 3 writes of process 9.
pub fn base_contract_line() -> String {
    let stats = r#"{"count":3,"failed_trylocks":0,"wait_ns":{"sum":2400,"max":900,"mean":800.0,"p50":768,"p90":900,"p99":900,"p999":900,"buckets":[[1024,3]]},"hold_ns":{"sum":0,"max":0,"mean":0.0,"p50":0,"p90":0,"p99":0,"p999":0,"buckets":[[1,3]]}}"#;
    format!(
        r#"{{"type":"summary","schema_version":1,"start":"2025-01-01T00:00:00.000Z","end":"2025-01-01T00:00:01.000Z","duration_s":1.0,"processes":[{{"pid":9,"comm":"node","write":{stats},"read":{stats},"threads":[{{"tid":9,"role":"main","write":{stats},"read":{stats}}}]}}],"lost":{{"events":0,"map_full":0}}}}"#
    )
}

/// A time share of `wait_ns` waited in `alive_ns` alive by `threads` threads, without CPU time.
pub fn time_share(wait_ns: u64, alive_ns: u64, threads: u64) -> TimeShare {
    TimeShare {
        wait_ns,
        alive_ns,
        wall: wait_ns as f64 / alive_ns as f64,
        cpu_ns: None,
        cpu: None,
        queued_ns: None,
        threads: Some(threads),
    }
}
