use super::*;
use crate::output::fixtures::{stats, time_share};

/// A thread row: `writes` writes that waited `wait` ns, with a time share of `alive` ns.
fn row(tid: u32, role: Role, writes: u64, wait: u64, alive: u64) -> ThreadReport {
    let write = stats(writes, wait, 1000, &[(1024, writes)]);
    ThreadReport {
        tid,
        role,
        comm: "node".into(),
        pid: None,
        role_addon: (role == Role::Addon).then(|| "/app/argon2.node".into()),
        role_library: None,
        lock: LockReport {
            causes: vec![CauseReport {
                cause: "mmap".into(),
                write: write.clone(),
            }],
            write,
            ..LockReport::default()
        },
        blocked_by: None,
        time_share: Some(TimeShare {
            threads: None,
            ..time_share(wait, alive, 1)
        }),
    }
}

fn facts(lived_ns: Option<u64>, start: &str) -> ThreadFacts {
    ThreadFacts {
        lived_ns,
        start_routine: Some(start.into()),
    }
}

/// Thousands of addon threads of a few milliseconds each are one row, with their exact sums;
/// the long-lived threads stay listed, and so do the short-lived that waited longest.
#[test]
fn short_lived_threads_are_one_row_per_role_and_start_routine_with_exact_totals() {
    let ms = 1_000_000;
    let mut rows = vec![
        (
            row(1, Role::Main, 10, 50, 9_000 * ms),
            facts(None, "_start"),
        ),
        (
            row(2, Role::Libuv, 30, 900_000, 9_000 * ms),
            facts(None, "worker"),
        ),
    ];
    // 5,000 addon threads, 3 writes each; the first waited the longest of all.
    for i in 0..5_000u32 {
        let wait = if i == 0 { 5_000_000 } else { 10 };
        rows.push((
            row(100 + i, Role::Addon, 3, wait, 2 * ms),
            facts(Some(2 * ms), "fill_lane"),
        ));
    }
    let (listed, groups, tids) = group(rows, LISTED_THREADS);
    let listed_tids: Vec<u32> = listed.iter().map(|t| t.tid).collect();
    assert_eq!(
        listed_tids,
        [1, 2, 100],
        "the longest waiter listed, short as it lived"
    );
    assert_eq!(groups.len(), 1);
    let g = &groups[0];
    assert_eq!((g.threads, g.grouped.as_ref()), (4_999, SHORT_LIVED));
    assert_eq!(g.start_routine.as_deref(), Some("fill_lane"));
    assert_eq!(
        (g.row.role, g.row.role_addon.as_deref(), g.row.tid),
        (Role::Addon, Some("/app/argon2.node"), 0)
    );
    assert_eq!(g.row.lock.write.count, 3 * 4_999);
    assert_eq!(g.row.lock.write.wait_ns.sum, 10 * 4_999);
    assert_eq!(g.row.lock.causes[0].write.count, 3 * 4_999);
    let share = g.row.time_share.as_ref().unwrap();
    assert_eq!(
        (share.alive_ns, share.threads),
        (2 * ms * 4_999, Some(4_999))
    );
    assert_eq!(tids.len(), 4_999);
    assert_eq!(tids[&101], (Role::Addon, "node".to_string()));
    // The rows add up to every thread, listed or grouped.
    let p = ProcessReport {
        threads: listed,
        thread_groups: Some(groups),
        ..ProcessReport::default()
    };
    let writes: u64 = p.thread_rows().map(|(t, _)| t.lock.write.count).sum();
    assert_eq!(writes, 10 + 30 + 3 * 5_000);
    assert_eq!(p.thread_rows().map(|(_, n)| n).sum::<u64>(), 5_002);
    assert_eq!(p.grouped_threads(), 4_999);
    // In JSON, a group is a thread row with its count, why and start routine.
    let json = serde_json::to_value(p.thread_groups.as_ref().unwrap()).unwrap();
    assert_eq!(json[0]["threads"], 4_999);
    assert_eq!(json[0]["grouped"], "short_lived");
    assert_eq!(json[0]["role"], "addon");
    assert_eq!(json[0]["write"]["count"], 3 * 4_999);
    let back: Vec<ThreadGroupReport> = serde_json::from_value(json).unwrap();
    assert_eq!(back[0].row.lock.write.count, 3 * 4_999);
}

/// Past the threads listed, the rest are grouped too, whatever their lives: the listed are
/// those that waited longest.
#[test]
fn past_the_listed_threads_the_rest_are_grouped() {
    let rows: Vec<(ThreadReport, ThreadFacts)> = (0..300u32)
        .map(|i| {
            (
                row(
                    1_000 + i,
                    Role::Worker,
                    1,
                    u64::from(i) * 100,
                    60_000_000_000,
                ),
                ThreadFacts::default(),
            )
        })
        .collect();
    let (listed, groups, _) = group(rows, LISTED_THREADS);
    assert_eq!(listed.len(), LISTED_THREADS);
    // The 100 that waited longest: 1,200 to 1,299.
    assert!(
        listed.iter().all(|t| t.tid >= 1_200),
        "{:?}",
        listed.iter().map(|t| t.tid).collect::<Vec<_>>()
    );
    assert_eq!(groups.len(), 1);
    assert_eq!(
        (groups[0].threads, groups[0].grouped.as_ref()),
        (200, PAST_LISTED)
    );
    assert_eq!(groups[0].start_routine, None);
    // Fewer threads than the bound: all listed, in their order, no group.
    let few: Vec<(ThreadReport, ThreadFacts)> = (0..5)
        .map(|i| (row(i, Role::Other, 1, 1, 1), ThreadFacts::default()))
        .collect();
    let (listed, groups, _) = group(few, LISTED_THREADS);
    assert_eq!(listed.len(), 5);
    assert!(groups.is_empty());
}

/// The main thread is listed however little it waited, past the listed bound and when a
/// summary too large is regrouped: a person looks for it first, and a test counting the
/// process's other threads (listed and grouped) must not find it among them.
#[test]
fn the_main_thread_is_always_listed() {
    let mut rows: Vec<(ThreadReport, ThreadFacts)> = vec![(
        row(1, Role::Main, 1, 0, 60_000_000_000),
        ThreadFacts::default(),
    )];
    rows.extend((0..150u32).map(|i| {
        (
            row(10 + i, Role::Other, 5, 1_000 + u64::from(i), 60_000_000_000),
            ThreadFacts::default(),
        )
    }));
    let (listed, groups, tids) = group(rows, LISTED_THREADS);
    assert_eq!(listed.len(), LISTED_THREADS);
    assert!(listed.iter().any(|t| t.tid == 1), "main listed");
    assert!(!tids.contains_key(&1));
    assert!(groups.iter().all(|g| g.row.role != Role::Main));
    let mut p = ProcessReport {
        threads: listed,
        thread_groups: Some(groups),
        ..ProcessReport::default()
    };
    regroup(&mut p, 3);
    assert_eq!(p.threads.len(), 3);
    assert_eq!(p.threads[0].tid, 1, "main first of the kept");
    assert_eq!(p.grouped_threads(), 148);
    assert!(
        p.thread_groups
            .iter()
            .flatten()
            .all(|g| g.row.role != Role::Main)
    );
}
