//! The kernel's log2 buckets as Prometheus's: classic buckets one for one, native schema-0
//! ones a bucket lower at most (see the module doc of `prometheus`).

use profiler_common::HIST_BUCKETS;

use crate::aggregation::DurationHist;

/// Classic buckets of a cumulative histogram, `(le in seconds, count)`, not cumulative (the
/// encoder adds up).
pub(super) fn classic(h: &DurationHist) -> Vec<(f64, u64)> {
    let mut out: Vec<(f64, u64)> = (0..HIST_BUCKETS - 1)
        .map(|i| (bucket_le_seconds(i), h.bucket(i)))
        .collect();
    out.push((f64::INFINITY, h.bucket(HIST_BUCKETS - 1)));
    out
}

/// Native schema-0 buckets as (spans, deltas): kernel bucket `i >= 1` -> index `i - 30`;
/// bucket 0 (exactly 0 ns) is the zero bucket.
pub(super) fn native(h: &DurationHist) -> (Vec<(i32, u32)>, Vec<i64>) {
    let mut spans: Vec<(i32, u32)> = Vec::new();
    let mut deltas = Vec::new();
    let (mut prev_count, mut next_index) = (0i64, None::<i32>);
    for (i, n) in h.buckets().filter(|b| b.0 >= 1) {
        let k = native_index(i);
        match next_index {
            Some(next) if next == k => spans.last_mut().expect("a span").1 += 1,
            Some(next) => spans.push((k - next, 1)),
            None => spans.push((k, 1)),
        }
        next_index = Some(k + 1);
        deltas.push(n as i64 - prev_count);
        prev_count = n as i64;
    }
    (spans, deltas)
}

/// `le` of kernel bucket `i`: its exclusive upper bound, `2^i` ns, in seconds.
pub fn bucket_le_seconds(i: usize) -> f64 {
    (1u64 << i) as f64 * 1e-9
}

/// The native schema-0 bucket given the counts of kernel bucket `i` (see the module doc).
pub fn native_index(i: usize) -> i32 {
    i as i32 - 30
}
