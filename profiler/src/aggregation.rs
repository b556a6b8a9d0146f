//! Turns the kernel's cumulative per-thread counters into per-interval deltas and merges them
//! into per-process and per-thread windows (one per interval, one for the whole run).
//!
//! The kernel keeps exact log2 bucket counts, sums and all-time maxima; percentiles are
//! computed from the buckets through an hdrhistogram at report time (their resolution is the
//! log2 bucket: each bucket is recorded at its midpoint, clamped to the observed maximum).

use std::collections::{BTreeMap, HashMap};

use hdrhistogram::Histogram;
use profiler_common::{COMM_LEN, HIST_BUCKETS, LockStats, StatsKey, ThreadStats};

/// Exclusive upper bound, in ns, of log2 bucket `i` (bucket 0 holds exactly 0 ns).
pub fn bucket_upper_ns(i: usize) -> u64 {
    1u64 << i
}

/// Inclusive lower bound, in ns, of log2 bucket `i`.
pub fn bucket_lower_ns(i: usize) -> u64 {
    if i == 0 { 0 } else { 1u64 << (i - 1) }
}

/// A distribution of durations: exact sum, max and log2 bucket counts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DurationHist {
    pub sum: u64,
    pub max: u64,
    pub buckets: [u64; HIST_BUCKETS],
}

impl Default for DurationHist {
    fn default() -> Self {
        DurationHist {
            sum: 0,
            max: 0,
            buckets: [0; HIST_BUCKETS],
        }
    }
}

impl DurationHist {
    #[cfg(test)]
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    pub fn merge(&mut self, other: &DurationHist) {
        self.sum = self.sum.wrapping_add(other.sum);
        self.max = self.max.max(other.max);
        for (a, b) in self.buckets.iter_mut().zip(other.buckets.iter()) {
            *a += b;
        }
    }

    /// The change between two cumulative kernel readings. The kernel keeps an all-time
    /// maximum: when it grew, the new value is this window's exact maximum; otherwise the
    /// window's maximum is bounded by its highest non-empty bucket (and by the old maximum).
    fn delta(
        cur_sum: u64,
        cur_max: u64,
        cur: &[u32; HIST_BUCKETS],
        prev_sum: u64,
        prev_max: u64,
        prev: &[u32; HIST_BUCKETS],
    ) -> DurationHist {
        let mut buckets = [0u64; HIST_BUCKETS];
        for (i, b) in buckets.iter_mut().enumerate() {
            *b = u64::from(cur[i].wrapping_sub(prev[i]));
        }
        let max = if cur_max > prev_max {
            cur_max
        } else {
            match buckets.iter().rposition(|&c| c > 0) {
                Some(i) => (bucket_upper_ns(i) - 1).min(cur_max),
                None => 0,
            }
        };
        DurationHist {
            sum: cur_sum.wrapping_sub(prev_sum),
            max,
            buckets,
        }
    }

    /// Percentiles (0..=1 quantiles) through `hdr`, which is reset first.
    pub fn quantiles<const N: usize>(&self, hdr: &mut Histogram<u64>, qs: [f64; N]) -> [u64; N] {
        hdr.reset();
        for (i, &n) in self.buckets.iter().enumerate() {
            if n == 0 {
                continue;
            }
            let (lo, hi) = (bucket_lower_ns(i), bucket_upper_ns(i));
            let mid = lo + (hi - lo) / 2;
            // Bucket 0 (zero-length waits) records 0, which hdrhistogram counts exactly.
            let v = mid.min(self.max).max(lo);
            // Saturating: the histogram's range covers every bucket, so this cannot fail.
            let _ = hdr.record_n(v, n);
        }
        let mut out = [0u64; N];
        if hdr.is_empty() {
            return out;
        }
        for (o, q) in out.iter_mut().zip(qs) {
            *o = hdr.value_at_quantile(q).min(self.max);
        }
        out
    }
}

/// A histogram sized for every log2 bucket the kernel can produce.
pub fn new_hdr() -> Histogram<u64> {
    Histogram::new_with_bounds(1, bucket_upper_ns(HIST_BUCKETS), 2)
        .expect("static histogram bounds are valid")
}

/// One side (read or write) of the lock, over some window.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SideStats {
    pub count: u64,
    pub failed: u64,
    pub wait: DurationHist,
    pub hold: DurationHist,
}

impl SideStats {
    pub fn merge(&mut self, o: &SideStats) {
        self.count += o.count;
        self.failed += o.failed;
        self.wait.merge(&o.wait);
        self.hold.merge(&o.hold);
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.count == 0 && self.failed == 0
    }

    fn delta(cur: &LockStats, prev: &LockStats) -> SideStats {
        SideStats {
            count: cur.count.wrapping_sub(prev.count),
            failed: cur.failed.wrapping_sub(prev.failed),
            wait: DurationHist::delta(
                cur.wait_sum,
                cur.wait_max,
                &cur.wait_hist,
                prev.wait_sum,
                prev.wait_max,
                &prev.wait_hist,
            ),
            hold: DurationHist::delta(
                cur.hold_sum,
                cur.hold_max,
                &cur.hold_hist,
                prev.hold_sum,
                prev.hold_max,
                &prev.hold_hist,
            ),
        }
    }
}

/// `[read, write]`, indexed by `profiler_common::READ` / `WRITE`.
pub type ReadWrite = [SideStats; 2];

fn merge_rw(a: &mut ReadWrite, b: &ReadWrite) {
    a[0].merge(&b[0]);
    a[1].merge(&b[1]);
}

/// What one thread did to one owner's lock since the previous reading.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadDelta {
    pub key: StatsKey,
    /// Process of the acting thread.
    pub tgid: u32,
    pub comm: [u8; COMM_LEN],
    pub rw: ReadWrite,
}

/// Remembers the previous cumulative reading of each kernel entry.
#[derive(Default)]
pub struct DeltaTracker {
    prev: HashMap<StatsKey, ThreadStats>,
}

impl DeltaTracker {
    /// Deltas of entries that changed since the last call.
    pub fn update(&mut self, snapshot: &[(StatsKey, ThreadStats)]) -> Vec<ThreadDelta> {
        let mut out = Vec::new();
        for (key, cur) in snapshot {
            let prev = self.prev.get(key).unwrap_or(&ThreadStats::ZERO);
            if prev.rw == cur.rw {
                continue;
            }
            out.push(ThreadDelta {
                key: *key,
                tgid: cur.tgid,
                comm: cur.comm,
                rw: [
                    SideStats::delta(&cur.rw[0], &prev.rw[0]),
                    SideStats::delta(&cur.rw[1], &prev.rw[1]),
                ],
            });
            self.prev.insert(*key, *cur);
        }
        out
    }

    /// The kernel entry was deleted (its thread exited, after its last delta was taken).
    pub fn forget(&mut self, key: &StatsKey) {
        self.prev.remove(key);
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.prev.len()
    }
}

/// One thread's activity on one process's lock in a window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadAgg {
    pub tgid: u32,
    pub comm: [u8; COMM_LEN],
    pub rw: ReadWrite,
}

/// One process's lock in a window: totals and per-thread parts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessAgg {
    pub rw: ReadWrite,
    pub threads: BTreeMap<u32, ThreadAgg>,
}

/// Everything seen in a window, per owner process.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Window {
    pub processes: BTreeMap<u32, ProcessAgg>,
}

impl Window {
    pub fn add(&mut self, d: &ThreadDelta) {
        let p = self.processes.entry(d.key.owner).or_default();
        merge_rw(&mut p.rw, &d.rw);
        let t = p.threads.entry(d.key.tid).or_insert_with(|| ThreadAgg {
            tgid: d.tgid,
            comm: d.comm,
            rw: Default::default(),
        });
        merge_rw(&mut t.rw, &d.rw);
    }

    pub fn clear(&mut self) {
        self.processes.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use profiler_common::{READ, WRITE, bucket_index};

    fn stats_with(events: &[(usize, u64, u64)]) -> ThreadStats {
        // (side, wait, hold) acquisitions, aggregated exactly as the eBPF side does.
        let mut t = ThreadStats::ZERO;
        for &(side, wait, hold) in events {
            let s = &mut t.rw[side];
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

    const K: StatsKey = StatsKey { owner: 10, tid: 11 };

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
    fn interval_deltas_subtract_previous_reading() {
        let mut tr = DeltaTracker::default();
        let first = stats_with(&[(WRITE, 100, 1000), (READ, 0, 50)]);
        let d1 = tr.update(&[(K, first)]);
        assert_eq!(d1.len(), 1);
        assert_eq!(d1[0].rw[WRITE].count, 1);
        assert_eq!(d1[0].rw[WRITE].wait.sum, 100);
        assert_eq!(d1[0].rw[READ].count, 1);

        // Unchanged entry: no delta at all.
        assert!(tr.update(&[(K, first)]).is_empty());

        let second = stats_with(&[(WRITE, 100, 1000), (READ, 0, 50), (WRITE, 5000, 10)]);
        let d2 = tr.update(&[(K, second)]);
        assert_eq!(d2.len(), 1);
        let w = &d2[0].rw[WRITE];
        assert_eq!((w.count, w.wait.sum, w.hold.sum), (1, 5000, 10));
        assert_eq!(w.wait.max, 5000, "a new all-time max is exact");
        assert_eq!(w.wait.count(), 1);
        assert_eq!(w.wait.buckets[bucket_index(5000)], 1);
        assert!(d2[0].rw[READ].is_empty());
        // The hold max did not grow (10 < 1000): bounded by the delta's highest bucket.
        assert_eq!(w.hold.max, bucket_upper_ns(bucket_index(10)) - 1);
    }

    #[test]
    fn deltas_survive_u32_bucket_wraparound() {
        let mut prev = ThreadStats::ZERO;
        prev.rw[WRITE].wait_hist[3] = u32::MAX - 1;
        prev.rw[WRITE].count = 10;
        let mut cur = prev;
        cur.rw[WRITE].wait_hist[3] = 2; // wrapped: +4
        cur.rw[WRITE].count = 14;
        let mut tr = DeltaTracker::default();
        tr.update(&[(K, prev)]);
        let d = tr.update(&[(K, cur)]);
        assert_eq!(d[0].rw[WRITE].wait.buckets[3], 4);
        assert_eq!(d[0].rw[WRITE].count, 4);
    }

    #[test]
    fn forgotten_entries_start_from_zero_again() {
        let mut tr = DeltaTracker::default();
        let s = stats_with(&[(WRITE, 1, 1)]);
        tr.update(&[(K, s)]);
        tr.forget(&K);
        assert_eq!(tr.len(), 0);
        assert_eq!(tr.update(&[(K, s)])[0].rw[WRITE].count, 1);
    }

    #[test]
    fn per_cpu_style_merge_adds_counts_and_keeps_max() {
        let mut a = SideStats::default();
        let mut b = SideStats::default();
        a.count = 3;
        a.wait.sum = 30;
        a.wait.max = 20;
        a.wait.buckets[5] = 3;
        b.count = 2;
        b.failed = 1;
        b.wait.sum = 100;
        b.wait.max = 90;
        b.wait.buckets[7] = 2;
        a.merge(&b);
        assert_eq!((a.count, a.failed, a.wait.sum, a.wait.max), (5, 1, 130, 90));
        assert_eq!(a.wait.buckets[5] + a.wait.buckets[7], 5);
    }

    #[test]
    fn window_groups_by_owner_and_thread() {
        let mut w = Window::default();
        let mk = |owner, tid, tgid, n| ThreadDelta {
            key: StatsKey { owner, tid },
            tgid,
            comm: [0; COMM_LEN],
            rw: [
                SideStats::default(),
                SideStats {
                    count: n,
                    ..Default::default()
                },
            ],
        };
        w.add(&mk(1, 1, 1, 2));
        w.add(&mk(1, 2, 1, 3));
        w.add(&mk(1, 99, 99, 1)); // foreign thread on 1's lock
        w.add(&mk(5, 5, 5, 7));
        w.add(&mk(1, 2, 1, 1));
        assert_eq!(w.processes[&1].rw[WRITE].count, 7);
        assert_eq!(w.processes[&1].threads[&2].rw[WRITE].count, 4);
        assert_eq!(w.processes[&1].threads[&99].tgid, 99);
        assert_eq!(w.processes[&5].rw[WRITE].count, 7);
    }

    #[test]
    fn percentiles_follow_the_buckets_and_never_exceed_max() {
        let mut hdr = new_hdr();
        // 90 fast acquisitions (~100 ns) and 10 slow ones (~1 ms).
        let mut events = vec![(WRITE, 100, 0); 90];
        events.extend(vec![(WRITE, 1_000_000, 0); 10]);
        let t = stats_with(&events);
        let mut tr = DeltaTracker::default();
        let d = tr.update(&[(K, t)]);
        let wait = &d[0].rw[WRITE].wait;
        let [p50, p90, p99, p100] = wait.quantiles(&mut hdr, [0.5, 0.9, 0.99, 1.0]);
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

    #[test]
    fn zero_waits_give_zero_percentiles() {
        let mut hdr = new_hdr();
        let mut h = DurationHist::default();
        h.buckets[0] = 90;
        h.buckets[bucket_index(5000)] = 10;
        h.max = 5000;
        let [p50, p99] = h.quantiles(&mut hdr, [0.5, 0.99]);
        assert_eq!(p50, 0);
        assert!(p99 >= bucket_lower_ns(bucket_index(5000)) && p99 <= 5000);
    }

    #[test]
    fn percentiles_of_nothing_are_zero() {
        let mut hdr = new_hdr();
        assert_eq!(
            DurationHist::default().quantiles(&mut hdr, [0.5, 0.99]),
            [0, 0]
        );
    }
}
