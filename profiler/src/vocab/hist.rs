//! Distributions of durations as the kernel keeps them: exact sums and maxima, log2 bucket
//! counts (sparse, inline), and the difference between two cumulative readings.
//!
//! [`DurationHist`] is the one histogram of the program: the summary, interval lines,
//! Prometheus, `compare`, the HTML pages and runs summed from their interval lines all hold
//! their durations in it, and all take their percentiles from [`DurationHist::quantiles`], so
//! the same data gives the same p99 wherever it is shown.

use std::cell::RefCell;

use hdrhistogram::Histogram;
use profiler_common::{HIST_BUCKETS, LockStats};
use smallvec::SmallVec;

/// Exclusive upper bound, in ns, of log2 bucket `i` (bucket 0 holds exactly 0 ns).
pub fn bucket_upper_ns(i: usize) -> u64 {
    1u64 << i
}

/// Inclusive lower bound, in ns, of log2 bucket `i`.
pub fn bucket_lower_ns(i: usize) -> u64 {
    if i == 0 { 0 } else { 1u64 << (i - 1) }
}

/// The bucket whose upper bound is `upper_ns`: one of the kernel's 40, `1, 2, 4, ..., 2^39`
/// ns (the last also holds anything longer); None for any other value.
pub fn bucket_of_upper(upper_ns: u64) -> Option<usize> {
    let i = upper_ns.trailing_zeros() as usize;
    (upper_ns.is_power_of_two() && i < HIST_BUCKETS).then_some(i)
}

/// The largest count a bucket holds (58 bits: see [`PackedBucket`]); more saturates.
pub const MAX_BUCKET_COUNT: u64 = COUNT_MASK;

/// A non-empty log2 bucket, packed: index in the top 6 bits, count in the low 58.
type PackedBucket = u64;
const COUNT_BITS: u32 = 58;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;

fn pack(i: usize, n: u64) -> PackedBucket {
    ((i as u64) << COUNT_BITS) | (n & COUNT_MASK)
}

fn unpack(b: PackedBucket) -> (usize, u64) {
    ((b >> COUNT_BITS) as usize, b & COUNT_MASK)
}

/// A distribution of durations: exact sum and max, and the non-empty log2 buckets. Most
/// threads fill a handful of buckets, which are kept inline: no allocation per histogram.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DurationHist {
    pub sum: u64,
    pub max: u64,
    /// Ascending by index, counts > 0.
    buckets: SmallVec<[PackedBucket; 3]>,
}

impl DurationHist {
    /// Durations counted: the sum of the buckets.
    pub fn count(&self) -> u64 {
        self.buckets().map(|b| b.1).sum()
    }

    /// Non-empty buckets as `(index, count)`, ascending.
    pub fn buckets(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        self.buckets.iter().map(|&b| unpack(b))
    }

    /// Count of bucket `i`.
    pub fn bucket(&self, i: usize) -> u64 {
        self.buckets().find(|b| b.0 == i).map_or(0, |b| b.1)
    }

    /// Adds `n` durations to bucket `i` (a count saturates at [`MAX_BUCKET_COUNT`]).
    pub fn add(&mut self, i: usize, n: u64) {
        if n == 0 {
            return;
        }
        match self.buckets.binary_search_by_key(&i, |&b| unpack(b).0) {
            Ok(pos) => {
                let (_, c) = unpack(self.buckets[pos]);
                self.buckets[pos] = pack(i, c.saturating_add(n).min(COUNT_MASK));
            }
            Err(pos) => self.buckets.insert(pos, pack(i, n.min(COUNT_MASK))),
        }
    }

    pub fn merge(&mut self, other: &DurationHist) {
        self.sum = self.sum.wrapping_add(other.sum);
        self.max = self.max.max(other.max);
        for (i, n) in other.buckets() {
            self.add(i, n);
        }
    }

    /// Does the maximum lie in or above the highest non-empty bucket? Always so for what the
    /// kernel and the merges of this module produce; a file saying otherwise is wrong.
    pub fn max_is_consistent(&self) -> bool {
        self.buckets
            .last()
            .is_none_or(|&b| self.max >= bucket_lower_ns(unpack(b).0))
    }

    /// The change from `prev` (this key's cumulative total so far) to a kernel reading. The
    /// kernel's u32 buckets wrap; differences modulo 2^32 stay exact as long as a bucket gains
    /// fewer than 2^32 between two readings. The kernel keeps an all-time maximum: when it
    /// grew, it is this window's exact maximum; otherwise the window's maximum is bounded by
    /// its highest non-empty bucket (and by the old maximum).
    fn delta(cur_sum: u64, cur_max: u64, cur: &[u32; HIST_BUCKETS], prev: &DurationHist) -> Self {
        let mut d = DurationHist {
            sum: cur_sum.wrapping_sub(prev.sum),
            max: 0,
            buckets: SmallVec::new(),
        };
        for (i, &c) in cur.iter().enumerate() {
            let n = c.wrapping_sub(prev.bucket(i) as u32);
            if n > 0 {
                d.buckets.push(pack(i, u64::from(n)));
            }
        }
        d.max = if cur_max > prev.max {
            cur_max
        } else {
            match d.buckets.last() {
                Some(&b) => (bucket_upper_ns(unpack(b).0) - 1).min(cur_max),
                None => 0,
            }
        };
        d
    }

    /// Quantiles (0..=1), in ns: the one definition of a percentile in the program.
    ///
    /// Each bucket's count is recorded in hdrhistogram at the bucket's midpoint, capped at the
    /// maximum and floored at the bucket's lower bound (bucket 0, zero-length waits, records
    /// 0); a quantile is hdrhistogram's value at it, capped at the maximum. So a quantile
    /// falls in the bucket that holds it (resolution: the log2 bucket, a factor of two), is
    /// never above `max`, never below the lowest bucket's lower bound (when the maximum is
    /// consistent, see [`max_is_consistent`](Self::max_is_consistent)), and grows with `q`.
    pub fn quantiles<const N: usize>(&self, qs: [f64; N]) -> [u64; N] {
        let mut out = [0u64; N];
        if self.buckets.is_empty() {
            return out;
        }
        // hdrhistogram ranks in f64: counts past 2^52 in all are scaled down to stay exact.
        let shift = (u64::BITS - self.count().leading_zeros()).saturating_sub(52);
        ENGINE.with_borrow_mut(|hdr| {
            hdr.reset();
            for (i, n) in self.buckets() {
                let (lo, hi) = (bucket_lower_ns(i), bucket_upper_ns(i));
                let v = (lo + (hi - lo) / 2).min(self.max).max(lo);
                // The engine's range covers every bucket, so this cannot fail.
                let _ = hdr.record_n(v, (n >> shift).max(1));
            }
            if qs.is_sorted() {
                // One pass over the engine's counts for all of them.
                for (o, v) in out.iter_mut().zip(hdr.value_at_quantiles(qs)) {
                    *o = v.min(self.max);
                }
            } else {
                for (o, q) in out.iter_mut().zip(qs) {
                    *o = hdr.value_at_quantile(q).min(self.max);
                }
            }
        });
        out
    }

    /// A distribution from `(upper_bound_ns, count)` pairs, as reports write them; pairs whose
    /// bound is not a bucket's (see [`bucket_of_upper`]) are left out.
    pub fn from_upper_bounds(
        sum: u64,
        max: u64,
        buckets: impl IntoIterator<Item = (u64, u64)>,
    ) -> Self {
        let mut h = DurationHist {
            sum,
            max,
            buckets: SmallVec::new(),
        };
        for (upper, n) in buckets {
            if let Some(i) = bucket_of_upper(upper) {
                h.add(i, n);
            }
        }
        h
    }

    /// The non-empty buckets as `(upper_bound_ns, count)`, ascending, as reports write them.
    pub fn upper_bounds(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.buckets().map(|(i, n)| (bucket_upper_ns(i), n))
    }
}

thread_local! {
    /// The quantile engine, sized for every log2 bucket the kernel can produce and reset at
    /// each use (one per thread: reports are built on one).
    static ENGINE: RefCell<Histogram<u64>> = RefCell::new(
        Histogram::new_with_bounds(1, bucket_upper_ns(HIST_BUCKETS), 2)
            .expect("static histogram bounds are valid"),
    );
}

/// Acquisitions of one kind (reads, or writes for one cause, or all writes), over a window.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SideStats {
    pub count: u64,
    pub failed: u64,
    pub wait: DurationHist,
    pub hold: DurationHist,
}

impl SideStats {
    pub fn merge(&mut self, o: &SideStats) {
        self.count = self.count.saturating_add(o.count);
        self.failed = self.failed.saturating_add(o.failed);
        self.wait.merge(&o.wait);
        self.hold.merge(&o.hold);
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0 && self.failed == 0
    }

    /// Has the kernel entry anything new since `self` (its cumulative total)?
    pub(crate) fn unchanged(&self, cur: &LockStats) -> bool {
        cur.count == self.count && cur.failed == self.failed
    }

    pub(crate) fn delta(cur: &LockStats, prev: &SideStats) -> SideStats {
        SideStats {
            count: cur.count.wrapping_sub(prev.count),
            failed: cur.failed.wrapping_sub(prev.failed),
            wait: DurationHist::delta(cur.wait_sum, cur.wait_max, &cur.wait_hist, &prev.wait),
            hold: DurationHist::delta(cur.hold_sum, cur.hold_max, &cur.hold_hist, &prev.hold),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QS: [f64; 8] = [0.0, 0.1, 0.5, 0.9, 0.99, 0.999, 0.9999, 1.0];

    /// The bucket holding the `q` quantile by rank, as hdrhistogram counts it (after the
    /// scaling of huge counts).
    fn bucket_at(h: &DurationHist, q: f64) -> usize {
        let shift = (u64::BITS - h.count().leading_zeros()).saturating_sub(52);
        let scaled = |n: u64| (n >> shift).max(1);
        let total: u64 = h.buckets().map(|b| scaled(b.1)).sum();
        let want = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (i, n) in h.buckets() {
            seen += scaled(n);
            if seen >= want {
                return i;
            }
        }
        unreachable!("want {want} of {}", h.count())
    }

    /// Every property a quantile promises, for one distribution.
    fn check(h: &DurationHist) {
        let ps = h.quantiles(QS);
        let lowest = bucket_lower_ns(h.buckets().next().unwrap().0);
        for (k, (&p, q)) in ps.iter().zip(QS).enumerate() {
            assert!(p <= h.max, "p{q} = {p} above max {} in {h:?}", h.max);
            assert!(
                p >= lowest,
                "p{q} = {p} below the lowest bucket {lowest} in {h:?}"
            );
            if k > 0 {
                assert!(p >= ps[k - 1], "not monotone at {q}: {ps:?} in {h:?}");
            }
            // In the bucket that holds it, or the maximum (which is in the highest bucket).
            let b = bucket_at(h, q);
            assert!(
                (bucket_lower_ns(b) <= p && p < bucket_upper_ns(b).max(1)) || p == h.max,
                "p{q} = {p} outside bucket {b} in {h:?}"
            );
        }
    }

    #[test]
    fn every_bucket_alone_keeps_its_quantiles_within_it_and_below_max() {
        for i in 0..HIST_BUCKETS {
            let (lo, hi) = (bucket_lower_ns(i), bucket_upper_ns(i));
            let mut maxima = vec![lo, lo + (hi - lo) / 2, hi - 1];
            if i == HIST_BUCKETS - 1 {
                // The last bucket also holds anything longer.
                maxima.extend([hi, u64::MAX]);
            }
            for max in maxima {
                for n in [1, 7, 1000, MAX_BUCKET_COUNT] {
                    let mut h = DurationHist {
                        max,
                        ..Default::default()
                    };
                    h.add(i, n);
                    check(&h);
                }
            }
        }
    }

    #[test]
    fn random_mixes_of_buckets_keep_every_promise() {
        // A fixed xorshift: the same cases every run.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..3000 {
            let mut h = DurationHist::default();
            for _ in 0..1 + next() % 8 {
                let i = (next() % HIST_BUCKETS as u64) as usize;
                // Mostly small counts, now and then a huge one.
                let n = if next() % 10 == 0 {
                    next() % MAX_BUCKET_COUNT
                } else {
                    1 + next() % 5000
                };
                h.add(i, n);
            }
            let top = h.buckets().last().unwrap().0;
            let (lo, hi) = (bucket_lower_ns(top), bucket_upper_ns(top));
            h.max = lo + next() % (hi - lo);
            check(&h);
        }
    }

    #[test]
    fn zero_waits_give_zero_percentiles_and_nothing_gives_zeros() {
        let mut h = DurationHist::default();
        h.add(0, 90);
        h.add(profiler_common::bucket_index(5000), 10);
        h.max = 5000;
        let [p50, p99] = h.quantiles([0.5, 0.99]);
        assert_eq!(p50, 0);
        assert!((4096..=5000).contains(&p99), "{p99}");
        assert_eq!(DurationHist::default().quantiles([0.5, 0.99]), [0, 0]);
    }

    #[test]
    fn a_maximum_below_the_midpoint_is_where_the_top_bucket_counts() {
        // 100 waits in [1024, 2048) whose longest took 1100 ns: every percentile is 1100 at
        // most, not the bucket's middle (1536) or its bound.
        let mut h = DurationHist::from_upper_bounds(110_000, 1100, [(2048, 100)]);
        assert_eq!(h.quantiles([0.5, 0.99]), [1100, 1100]);
        h.merge(&DurationHist::from_upper_bounds(64, 64, [(128, 1)]));
        assert_eq!(h.count(), 101);
        // The lowest, in [64, 128), counts at its middle.
        assert_eq!(h.quantiles([0.0]), [96]);
    }

    #[test]
    fn only_the_kernels_bucket_bounds_are_bucket_bounds() {
        assert_eq!(bucket_of_upper(1), Some(0));
        assert_eq!(bucket_of_upper(1024), Some(10));
        assert_eq!(bucket_of_upper(1 << 39), Some(39));
        for bad in [0, 3, 1000, 1 << 40, u64::MAX] {
            assert_eq!(bucket_of_upper(bad), None, "{bad}");
        }
        let h = DurationHist::from_upper_bounds(0, 0, [(1, 2), (1000, 5), (1, 1)]);
        assert_eq!(h.upper_bounds().collect::<Vec<_>>(), [(1, 3)]);
    }

    #[test]
    fn counts_saturate_instead_of_spilling_into_the_index() {
        let mut h = DurationHist::default();
        h.add(3, MAX_BUCKET_COUNT);
        h.add(3, 5);
        h.add(4, 1);
        assert_eq!(
            h.buckets().collect::<Vec<_>>(),
            [(3, MAX_BUCKET_COUNT), (4, 1)]
        );
        let max = DurationHist {
            max: 9,
            ..Default::default()
        };
        assert!(max.max_is_consistent());
        assert!(!DurationHist::from_upper_bounds(0, 3, [(1024, 1)]).max_is_consistent());
        assert!(DurationHist::from_upper_bounds(0, 512, [(1024, 1)]).max_is_consistent());
    }
}
