//! Every pattern at the edge of its minimum evidence (patterns.rs, docs/findings.md "Minimum
//! evidence"): reported at the minimum, not one below; and which processes the patterns look
//! at (listing.rs): all of them in a process that waited materially, only what is there in
//! one that did not.

use super::{
    find,
    listing::VERDICTS,
    patterns::{MIN_LONG_HOLDS, MIN_SAMPLED_STACKS, MIN_WRITES},
    tests::*,
};
use crate::{
    output::report::{BlockerReport, FlameStack, ProfilerShare, Report, RoleBlock, Stats},
    registry::roles::Role,
    vocab::Mode,
};

const MS: u64 = 1_000_000;

/// A process whose Worker thread made `n` writes of `cause` that waited 200 ms in all (2.5%
/// of its threads' 8 s: material).
fn worker_writes(cause: &'static str, n: u64) -> crate::output::report::ProcessReport {
    with_main(
        1,
        vec![writer(2, Role::Worker, &[(cause, stats(n, 200 * MS))])],
    )
}

/// `count` sampled stacks of `syscall` through malloc.
fn malloc_stacks(syscall: &str, count: u64) -> Option<Vec<FlameStack>> {
    Some(vec![FlameStack {
        stack: format!("start;node::Alloc (node);malloc (libc.so.6);{syscall} (libc.so.6)"),
        count,
    }])
}

/// The finding `id` of `s`, if any.
fn the(s: &Report, id: &str) -> Option<super::Finding> {
    find(s, None).into_iter().find(|f| f.id == id)
}

#[test]
fn not_your_bottleneck_rests_on_20_writes() {
    let quiet = |n| {
        process(
            7,
            vec![writer(7, Role::Main, &[("mmap", stats(n, 500_000))])],
            4 * S,
        )
    };
    assert!(finds(
        &summary(vec![quiet(MIN_WRITES)]),
        "not-your-bottleneck"
    ));
    assert!(!finds(
        &summary(vec![quiet(MIN_WRITES - 1)]),
        "not-your-bottleneck"
    ));
    // The case: a fork child's two writes before its exec.
    assert!(find(&summary(vec![quiet(2)]), None).is_empty());
}

#[test]
fn arena_growth_and_mmap_threshold_rest_on_20_writes() {
    for (cause, id) in [("mprotect", "arena-growth"), ("mmap", "mmap-threshold")] {
        assert!(finds(&summary(vec![worker_writes(cause, MIN_WRITES)]), id));
        assert!(!finds(
            &summary(vec![worker_writes(cause, MIN_WRITES - 1)]),
            id
        ));
    }
}

/// Sampled stacks tell whose code it is from 10 on: fewer say nothing, so where stacks were
/// sampled the pattern is not reported on them (the issue's "0 of 1 sampled mmap stacks are
/// malloc's"), and where none were, it rests on its writes and says so.
#[test]
fn malloc_patterns_need_10_sampled_stacks_where_stacks_were_sampled() {
    for (syscall, cause, id) in [
        ("__mprotect", "mprotect", "arena-growth"),
        ("mmap", "mmap", "mmap-threshold"),
    ] {
        let with = |sampled: u64, sample: Option<u32>| {
            let mut p = worker_writes(cause, 400);
            p.flame = (sampled > 0)
                .then(|| malloc_stacks(syscall, sampled))
                .flatten();
            Report {
                stack_sample: sample,
                ..summary(vec![p])
            }
        };
        let f = the(&with(MIN_SAMPLED_STACKS, Some(64)), id).expect(id);
        assert!(
            f.evidence
                .facts
                .iter()
                .any(|x| x.starts_with(&format!("10 of 10 sampled {cause} stacks are malloc's"))),
            "{:?}",
            f.evidence.facts
        );
        assert_eq!(f.evidence.code, ["node::Alloc (node)"]);
        assert!(the(&with(MIN_SAMPLED_STACKS - 1, Some(64)), id).is_none());
        assert!(
            the(&with(0, Some(64)), id).is_none(),
            "{id}: sampled, none of it"
        );
        // Not sampled at all: the writes alone, and the finding says what it does not know.
        let f = the(&with(0, None), id).expect(id);
        assert!(
            f.evidence.facts.iter().any(|x| x.starts_with("no ")),
            "{:?}",
            f.evidence.facts
        );
        let f = the(&with(MIN_SAMPLED_STACKS - 1, None), id).expect(id);
        assert!(f.evidence.code.is_empty(), "9 stacks name no code");
        assert!(
            f.evidence
                .facts
                .iter()
                .any(|x| x.starts_with(&format!("only 9 sampled {cause} stacks"))),
            "{:?}",
            f.evidence.facts
        );
    }
}

#[test]
fn fault_reads_rest_on_20_writes() {
    let p = |n| {
        let mut p = worker_writes("mprotect", n);
        p.blocked_by_role = Some(vec![RoleBlock {
            waiter_role: Role::Worker,
            holder_role: Role::Worker,
            cause: "read".into(),
            wait_ns: 100 * MS,
            write_wait_ns: 100 * MS,
        }]);
        summary(vec![p])
    };
    assert!(finds(&p(MIN_WRITES), "fault-reads"));
    assert!(!finds(&p(MIN_WRITES - 1), "fault-reads"));
}

#[test]
fn v8_gc_unmap_rests_on_20_writes() {
    let p = |n| {
        with_main(
            1,
            vec![writer(3, Role::V8, &[("munmap", stats(n, 200 * MS))])],
        )
    };
    assert!(finds(&summary(vec![p(MIN_WRITES)]), "v8-gc-unmap"));
    assert!(!finds(&summary(vec![p(MIN_WRITES - 1)]), "v8-gc-unmap"));
}

#[test]
fn addon_threads_rest_on_20_writes() {
    let p = |n: u64| {
        with_main(
            1,
            vec![thread(
                4,
                Role::Addon,
                &[("mmap", stats(n, 1000))],
                Stats::default(),
            )],
        )
    };
    assert!(finds(&summary(vec![p(MIN_WRITES)]), "addon-threads"));
    assert!(!finds(&summary(vec![p(MIN_WRITES - 1)]), "addon-threads"));
}

/// Long holds rest on 10 of the holder's calls: its holds, or in contention mode (no hold
/// timed) the waits behind it.
#[test]
fn long_holds_rest_on_10_calls() {
    let full = |n| {
        let holder = holds(n, 1000, 280 * MS, 40 * MS);
        with_main(
            20,
            vec![
                writer(21, Role::Other, &[("fork", holder)]),
                writer(22, Role::Worker, &[("mmap", stats(3000, 250 * MS))]),
            ],
        )
    };
    assert!(finds(&summary(vec![full(MIN_LONG_HOLDS)]), "long-holds"));
    assert!(!finds(
        &summary(vec![full(MIN_LONG_HOLDS - 1)]),
        "long-holds"
    ));
    let contention = |waits| {
        let mut p = with_main(
            30,
            vec![writer(32, Role::Worker, &[("mmap", stats(300, 250 * MS))])],
        );
        p.blockers = Some(vec![BlockerReport {
            tid: 31,
            pid: 30,
            role: Role::Worker,
            comm: "node".into(),
            cause: "mprotect".into(),
            waits,
            wait_ns: 200 * MS,
            write_wait_ns: 200 * MS,
        }]);
        let mut s = summary(vec![p]);
        s.mode = Mode::Contention;
        s.drop_unmeasured();
        s
    };
    assert!(finds(&contention(MIN_LONG_HOLDS), "long-holds"));
    assert!(!finds(&contention(MIN_LONG_HOLDS - 1), "long-holds"));
}

/// The profiler's holds: a millisecond in all, or 1% of a wait that was material.
#[test]
fn profiler_presence_rests_on_a_millisecond_or_a_hundredth_of_a_material_wait() {
    // 50 ms of wait in 2 s of its threads' time (2.5%: material), or in 200 s (not).
    let p = |holds_ns: u64, alive: u64| {
        let mut p = process(
            40,
            vec![
                writer(40, Role::Main, &[("mmap", stats(100, 50 * MS - 10))]),
                thread(41, Role::Other, &[], stats(0, 0)),
            ],
            alive,
        );
        p.profiler = Some(ProfilerShare {
            read: holds(3, 0, holds_ns, holds_ns),
            write: Stats::default(),
            share: 0.01,
        });
        summary(vec![p])
    };
    let presence = |s: &Report| finds(s, "profiler-presence");
    assert!(presence(&p(MS / 2, S)), "1% of 50 ms");
    assert!(!presence(&p(MS / 2 - 1, S)));
    assert!(
        !presence(&p(MS / 2, 100 * S)),
        "the same wait, not material"
    );
    assert!(presence(&p(MS, 100 * S)), "a millisecond");
    assert!(!presence(&p(MS - 1, 100 * S)));
}

/// In a process that did not wait materially, what is there (its verdict, an addon), never
/// what to change; and the verdict of at most three such processes.
#[test]
fn processes_that_did_not_wait_materially_get_their_verdict_only_and_few_of_them() {
    // 400 large mmaps by the main thread, 5 ms of wait in 8 s: a pattern's writes, no
    // material wait.
    let quiet = |pid: u32, wait: u64| {
        with_main(
            pid,
            vec![writer(pid + 1, Role::Worker, &[("mmap", stats(400, wait))])],
        )
    };
    let f = find(&summary(vec![quiet(1, 5 * MS)]), None);
    assert_eq!(ids(&f), ["not-your-bottleneck"]);
    // Five of them: the three that waited longest have it.
    let s = summary((1..=5).map(|i| quiet(i * 10, u64::from(i) * MS)).collect());
    let f = find(&s, None);
    assert_eq!(f.len(), VERDICTS);
    let pids: Vec<u32> = f.iter().map(|f| f.pid).collect();
    assert_eq!(pids, [50, 40, 30]);
}
