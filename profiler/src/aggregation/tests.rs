//! The aggregation's unit tests: deltas, totals, windows and percentiles on made-up kernel
//! entries.

use super::*;
use crate::registry::roles::Role;
use profiler_common::{ThreadStats, bucket_index};

/// A kernel entry after the given (wait, hold) acquisitions, aggregated exactly as the
/// eBPF side does.
pub(super) fn kernel_entry(events: &[(u64, u64)]) -> ThreadStats {
    let mut t = ThreadStats::ZERO;
    let s = &mut t.stats;
    for &(wait, hold) in events {
        s.count += 1;
        s.wait_sum += wait;
        s.wait_max = s.wait_max.max(wait);
        s.hold_sum += hold;
        s.hold_max = s.hold_max.max(hold);
        s.wait_hist[bucket_index(wait)] = s.wait_hist[bucket_index(wait)].wrapping_add(1);
        s.hold_hist[bucket_index(hold)] = s.hold_hist[bucket_index(hold)].wrapping_add(1);
    }
    t
}

fn key(owner: u32, tid: u32, kind: u32) -> StatsKey {
    StatsKey {
        owner,
        tid,
        kind,
        _pad: 0,
        owner_start: 10_000_000_000,
        tid_start: 20_000_000_000,
    }
}

pub(super) const W: StatsKey = StatsKey {
    owner: 10,
    tid: 11,
    kind: cause::MPROTECT,
    _pad: 0,
    owner_start: 10_000_000_000,
    tid_start: 20_000_000_000,
};

/// The same start times in clock ticks (100 per second).
pub(super) const P10: ProcId = ProcId::new(10, 1000);
pub(super) const T11: ThreadId = ThreadId::new(11, 2000);

#[test]
fn bucket_bounds_cover_the_index_function() {
    for ns in [0u64, 1, 2, 3, 7, 8, 1000, 1024, 123_456_789] {
        let i = bucket_index(ns);
        assert!(
            bucket_lower_ns(i) <= ns && ns < bucket_upper_ns(i),
            "{ns} in {i}"
        );
    }
}

#[test]
fn sparse_buckets_stay_sorted_and_merge() {
    let mut h = DurationHist::default();
    h.add(7, 2);
    h.add(3, 1);
    h.add(7, 1);
    h.add(5, 0);
    assert_eq!(h.buckets().collect::<Vec<_>>(), vec![(3, 1), (7, 3)]);
    let mut o = DurationHist::default();
    o.add(5, 4);
    o.max = 99;
    h.merge(&o);
    assert_eq!(
        h.buckets().collect::<Vec<_>>(),
        vec![(3, 1), (5, 4), (7, 3)]
    );
    assert_eq!((h.count(), h.max), (8, 99));
}

/// A thread's kinds live in its one record: each is diffed on its own, counted once as a
/// live entry, and gone with the thread; an empty entry of an unknown thread makes none.
#[test]
fn a_threads_kinds_are_kept_and_retired_together() {
    let mut tot = Totals::default();
    let read = StatsKey {
        kind: cause::READ,
        ..W
    };
    let empty = StatsKey { tid: 12, ..W };
    let one = kernel_entry(&[(100, 1000)]);
    let two = kernel_entry(&[(100, 1000), (300, 10)]);
    let d = tot.update(&[(W, one), (read, two), (empty, ThreadStats::ZERO)]);
    assert_eq!(d.len(), 2, "{d:?}");
    assert_eq!(tot.live_entries(), 2);
    assert_eq!(tot.threads_on(P10), vec![T11]);
    let mut keys = tot.keys_of(P10, T11);
    keys.sort_by_key(|k| k.kind);
    assert_eq!(keys, vec![read, W]);
    // The write grew, the read did not.
    let d = tot.update(&[(W, two), (read, two)]);
    assert_eq!(d.len(), 1);
    assert_eq!((d[0].key, d[0].stats.count), (W, 1));
    tot.retire(P10, T11, None);
    assert_eq!(tot.live_entries(), 0);
    let w = tot.window();
    let t = &w.processes[&P10][&T11];
    assert_eq!((t.read.count, t.write().count), (2, 2));
}

/// A spill entry (a kind with `cause::SPILLED`: acquisitions a thread added to the map
/// itself while its ring was held elsewhere) is diffed on its own, counts under its kind,
/// and is read and deleted with the thread's other entries.
#[test]
fn a_spill_entry_adds_to_its_kind_and_retires_with_the_thread() {
    let mut tot = Totals::default();
    let spill = StatsKey {
        kind: cause::MPROTECT | cause::SPILLED,
        ..W
    };
    let read_spill = StatsKey {
        kind: cause::READ | cause::SPILLED,
        ..W
    };
    let one = kernel_entry(&[(100, 1000)]);
    let two = kernel_entry(&[(100, 1000), (300, 10)]);
    tot.update(&[(W, two), (spill, one), (read_spill, one)]);
    // The accumulators' entry is unchanged; the spill grew by one: one delta, its own.
    let d = tot.update(&[(W, two), (spill, two)]);
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!((d[0].key, d[0].stats.count), (spill, 1));
    let mut keys = tot.keys_of(P10, T11);
    keys.sort_by_key(|k| k.kind);
    assert_eq!(keys, vec![W, read_spill, spill]);
    let w = tot.window();
    let t = &w.processes[&P10][&T11];
    assert_eq!(t.writes.get(cause::MPROTECT).unwrap().count, 4);
    assert_eq!(t.writes.get(cause::MPROTECT).unwrap().wait.sum, 800);
    assert_eq!(t.writes.len(), 1, "no kind of its own");
    assert_eq!(t.read.count, 1);
    tot.retire(P10, T11, None);
    assert_eq!(tot.live_entries(), 0);
}

#[test]
fn interval_deltas_subtract_previous_reading() {
    let mut tot = Totals::default();
    let first = kernel_entry(&[(100, 1000)]);
    let d1 = tot.update(&[(W, first)]);
    assert_eq!(d1.len(), 1);
    assert_eq!((d1[0].stats.count, d1[0].stats.wait.sum), (1, 100));

    // Unchanged entry: no delta at all.
    assert!(tot.update(&[(W, first)]).is_empty());

    let second = kernel_entry(&[(100, 1000), (5000, 10)]);
    let d2 = tot.update(&[(W, second)]);
    let s = &d2[0].stats;
    assert_eq!((s.count, s.wait.sum, s.hold.sum), (1, 5000, 10));
    assert_eq!(s.wait.max, 5000, "a new all-time max is exact");
    assert_eq!(s.wait.bucket(bucket_index(5000)), 1);
    assert_eq!(s.wait.count(), 1);
    // The hold max did not grow (10 < 1000): bounded by the delta's highest bucket.
    assert_eq!(s.hold.max, bucket_upper_ns(bucket_index(10)) - 1);
    // Totals equal the kernel's cumulative values.
    let w = tot.window();
    let t = &w.processes[&P10][&T11];
    assert_eq!(t.writes.get(cause::MPROTECT).unwrap().count, 2);
    assert_eq!(t.writes.get(cause::MPROTECT).unwrap().wait.sum, 5100);
    assert_eq!(t.write().wait.max, 5000);
}

#[test]
fn deltas_survive_u32_bucket_wraparound() {
    let mut prev = ThreadStats::ZERO;
    prev.stats.wait_hist[3] = u32::MAX - 1;
    prev.stats.count = u64::from(u32::MAX - 1);
    let mut cur = prev;
    cur.stats.wait_hist[3] = 2; // wrapped: +4
    cur.stats.count += 4;
    let mut tot = Totals::default();
    tot.update(&[(W, prev)]);
    let d = tot.update(&[(W, cur)]);
    assert_eq!(d[0].stats.wait.bucket(3), 4);
    assert_eq!(d[0].stats.count, 4);
    // And the next reading is diffed against the wrapped value correctly.
    cur.stats.wait_hist[3] = 3;
    cur.stats.count += 1;
    assert_eq!(tot.update(&[(W, cur)])[0].stats.wait.bucket(3), 1);
}

#[test]
fn a_retired_thread_keeps_its_role_and_a_reused_tid_is_another_thread() {
    let mut tot = Totals::default();
    let s = kernel_entry(&[(1, 1), (2, 2)]);
    let r = key(10, 11, cause::READ);
    let dg = key(10, 11, cause::DOWNGRADE);
    tot.update(&[(W, s), (r, s), (dg, kernel_entry(&[(0, 5)]))]);
    assert_eq!(tot.owners_of(T11), vec![P10]);
    assert_eq!(tot.keys_of(P10, T11).len(), 3);
    tot.retire(P10, T11, Some(Role::Worker.into()));
    assert_eq!(tot.live_threads().count(), 0);
    assert!(tot.owners_of(T11).is_empty());
    assert!(!tot.has_own_live_threads(P10));
    assert!(tot.threads_on(P10).is_empty());
    // A new thread reusing tid 11 (another start time): its own entry, from zero.
    let again = StatsKey {
        tid_start: 90_000_000_000,
        ..W
    };
    assert_eq!(
        tot.update(&[(again, kernel_entry(&[(3, 3)]))])[0]
            .stats
            .count,
        1
    );
    let w = tot.window();
    let old = &w.processes[&P10][&T11];
    assert_eq!(old.writes.get(cause::MPROTECT).unwrap().count, 2);
    assert_eq!((old.read.count, old.downgrade.count), (2, 1));
    assert_eq!(old.role, Some(Role::Worker.into()));
    let new = &w.processes[&P10][&ThreadId::new(11, 9000)];
    assert_eq!(new.writes.get(cause::MPROTECT).unwrap().count, 1);
    assert_eq!(new.role, None);
}

#[test]
fn downgrades_are_not_reads() {
    let mut w = Window::default();
    let d = |kind, n| ThreadDelta {
        key: key(1, 1, kind),
        tgid: 1,
        comm: [0; COMM_LEN],
        fsbase: 0,
        stats: SideStats {
            count: n,
            ..Default::default()
        },
    };
    w.add(&d(cause::READ, 5));
    w.add(&d(cause::DOWNGRADE, 7));
    w.add(&d(cause::MUNMAP, 7));
    let t = &w.processes[&ProcId::new(1, 1000)][&ThreadId::new(1, 2000)];
    assert_eq!(
        (t.read.count, t.downgrade.count, t.write().count),
        (5, 7, 7)
    );
}

#[test]
fn merge_adds_counts_and_keeps_max() {
    let mut a = SideStats {
        count: 3,
        ..Default::default()
    };
    a.wait.sum = 30;
    a.wait.max = 20;
    a.wait.add(5, 3);
    let mut b = SideStats {
        count: 2,
        failed: 1,
        ..Default::default()
    };
    b.wait.sum = 100;
    b.wait.max = 90;
    b.wait.add(7, 2);
    a.merge(&b);
    assert_eq!((a.count, a.failed, a.wait.sum, a.wait.max), (5, 1, 130, 90));
    assert_eq!(a.wait.bucket(5) + a.wait.bucket(7), 5);
}

#[test]
fn window_groups_by_owner_thread_and_cause() {
    let mut w = Window::default();
    let mk = |owner, tid, tgid, kind, n| ThreadDelta {
        key: key(owner, tid, kind),
        tgid,
        comm: [0; COMM_LEN],
        fsbase: 0,
        stats: SideStats {
            count: n,
            ..Default::default()
        },
    };
    w.add(&mk(1, 1, 1, cause::MMAP, 2));
    w.add(&mk(1, 2, 1, cause::MPROTECT, 3));
    w.add(&mk(1, 2, 1, cause::MUNMAP, 1));
    w.add(&mk(1, 2, 1, cause::READ, 9));
    w.add(&mk(1, 99, 99, cause::OTHER, 1)); // foreign thread on 1's lock
    w.add(&mk(5, 5, 5, cause::BRK, 7));
    let p = |pid| ProcId::new(pid, 1000);
    let t = |tid| ThreadId::new(tid, 2000);
    let t2 = &w.processes[&p(1)][&t(2)];
    assert_eq!((t2.write().count, t2.read.count), (4, 9));
    assert_eq!(t2.writes.get(cause::MPROTECT).unwrap().count, 3);
    assert_eq!(w.processes[&p(1)][&t(99)].tgid, 99);
    assert_eq!(w.processes[&p(5)][&t(5)].write().count, 7);
}

#[test]
fn percentiles_follow_the_buckets_and_never_exceed_max() {
    // 90 fast acquisitions (~100 ns) and 10 slow ones (~1 ms).
    let mut events = vec![(100, 0); 90];
    events.extend(vec![(1_000_000, 0); 10]);
    let mut tot = Totals::default();
    let d = tot.update(&[(W, kernel_entry(&events))]);
    let wait = &d[0].stats.wait;
    let [p50, p90, p99, p100] = wait.quantiles([0.5, 0.9, 0.99, 1.0]);
    let b = |ns| {
        (
            bucket_lower_ns(bucket_index(ns)),
            bucket_upper_ns(bucket_index(ns)),
        )
    };
    assert!(p50 >= b(100).0 && p50 < b(100).1, "p50={p50}");
    assert!(p90 >= b(100).0 && p90 < b(100).1, "p90={p90}");
    assert!(p99 >= b(1_000_000).0 && p99 <= 1_000_000, "p99={p99}");
    assert!(p100 >= b(1_000_000).0 && p100 <= 1_000_000, "p100={p100}");
    assert_eq!(wait.sum / wait.count(), (90 * 100 + 10 * 1_000_000) / 100);
}
