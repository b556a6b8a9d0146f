//! Distributions of durations as the kernel keeps them: exact sums and maxima, log2 bucket
//! counts (sparse, inline), and the difference between two cumulative readings.

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
    #[cfg(test)]
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

    pub fn add(&mut self, i: usize, n: u64) {
        if n == 0 {
            return;
        }
        match self.buckets.binary_search_by_key(&i, |&b| unpack(b).0) {
            Ok(pos) => {
                let (_, c) = unpack(self.buckets[pos]);
                self.buckets[pos] = pack(i, c + n);
            }
            Err(pos) => self.buckets.insert(pos, pack(i, n)),
        }
    }

    pub fn merge(&mut self, other: &DurationHist) {
        self.sum = self.sum.wrapping_add(other.sum);
        self.max = self.max.max(other.max);
        for (i, n) in other.buckets() {
            self.add(i, n);
        }
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

    /// Percentiles (0..=1 quantiles) through `hdr`, which is reset first.
    pub fn quantiles<const N: usize>(&self, hdr: &mut Histogram<u64>, qs: [f64; N]) -> [u64; N] {
        hdr.reset();
        for (i, n) in self.buckets() {
            let (lo, hi) = (bucket_lower_ns(i), bucket_upper_ns(i));
            let mid = lo + (hi - lo) / 2;
            // Bucket 0 (zero-length waits) records 0, which hdrhistogram counts exactly.
            let v = mid.min(self.max).max(lo);
            // The histogram's range covers every bucket, so this cannot fail.
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
        self.count += o.count;
        self.failed += o.failed;
        self.wait.merge(&o.wait);
        self.hold.merge(&o.hold);
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0 && self.failed == 0
    }

    /// Has the kernel entry anything new since `self` (its cumulative total)?
    pub(super) fn unchanged(&self, cur: &LockStats) -> bool {
        cur.count == self.count && cur.failed == self.failed
    }

    pub(super) fn delta(cur: &LockStats, prev: &SideStats) -> SideStats {
        SideStats {
            count: cur.count.wrapping_sub(prev.count),
            failed: cur.failed.wrapping_sub(prev.failed),
            wait: DurationHist::delta(cur.wait_sum, cur.wait_max, &cur.wait_hist, &prev.wait),
            hold: DurationHist::delta(cur.hold_sum, cur.hold_max, &cur.hold_hist, &prev.hold),
        }
    }
}
