//! STATS, the report's shape of one kind of acquisition (docs/report-format.md): counts and
//! two distributions, built from a [`SideStats`] and read back into one.
//!
//! Reading checks what the shape promises (every bucket bound one of the kernel's 40, counts
//! in range, the maximum in or above the highest bucket) and recomputes what is derived
//! (`mean`, the percentiles) from the rest, so that a file's figures are always those of
//! [`DurationHist::quantiles`], whoever wrote it.

use serde::{
    Deserialize, Deserializer, Serialize,
    de::{self, SeqAccess, Visitor},
};

use crate::aggregation::{
    DurationHist, MAX_BUCKET_COUNT, SideStats, bucket_of_upper, bucket_upper_ns,
};

/// A distribution of durations, in ns.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Dist {
    pub sum: u64,
    pub max: u64,
    pub mean: f64,
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub p999: u64,
    /// `[upper_bound_ns, count]` for each non-empty log2 bucket; a bucket holds durations
    /// `upper_bound/2 <= d < upper_bound` (the first, upper bound 1, holds 0 ns).
    pub buckets: Vec<(u64, u64)>,
}

impl Dist {
    /// `count` acquisitions (the mean's divisor) whose durations `h` holds.
    pub fn new(h: &DurationHist, count: u64) -> Self {
        let [p50, p90, p99, p999] = h.quantiles([0.5, 0.9, 0.99, 0.999]);
        Dist {
            sum: h.sum,
            max: h.max,
            mean: if count == 0 {
                0.0
            } else {
                (h.sum as f64 / count as f64 * 10.0).round() / 10.0
            },
            p50,
            p90,
            p99,
            p999,
            buckets: h.upper_bounds().collect(),
        }
    }

    /// The distribution as the program computes with it.
    pub fn hist(&self) -> DurationHist {
        DurationHist::from_upper_bounds(self.sum, self.max, self.buckets.iter().copied())
    }
}

/// Acquisitions of one kind: STATS.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(from = "StatsFields")]
pub struct Stats {
    pub count: u64,
    pub failed_trylocks: u64,
    pub wait_ns: Dist,
    /// Absent where holds were not measured (contention mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hold_ns: Option<Dist>,
}

impl Stats {
    pub fn new(s: &SideStats) -> Self {
        Stats {
            count: s.count,
            failed_trylocks: s.failed,
            wait_ns: Dist::new(&s.wait, s.count),
            hold_ns: Some(Dist::new(&s.hold, s.count)),
        }
    }

    /// Back to what they were built from, to be added up or compared.
    pub fn side(&self) -> SideStats {
        SideStats {
            count: self.count,
            failed: self.failed_trylocks,
            wait: self.wait_ns.hist(),
            hold: self.hold_ns.as_ref().map(Dist::hist).unwrap_or_default(),
        }
    }

    /// The hold distribution, empty where holds were not measured.
    pub fn hold(&self) -> Dist {
        self.hold_ns
            .clone()
            .unwrap_or_else(|| Dist::new(&DurationHist::default(), 0))
    }
}

impl Default for Stats {
    fn default() -> Self {
        Stats::new(&SideStats::default())
    }
}

/// STATS as a file has them; the derived figures are recomputed.
#[derive(Deserialize)]
struct StatsFields {
    count: u64,
    failed_trylocks: u64,
    wait_ns: CheckedDist,
    /// Absent in contention mode, whose holds are not measured.
    #[serde(default)]
    hold_ns: Option<CheckedDist>,
}

impl From<StatsFields> for Stats {
    fn from(f: StatsFields) -> Self {
        let measured = f.hold_ns.is_some();
        let mut s = Stats::new(&SideStats {
            count: f.count,
            failed: f.failed_trylocks,
            wait: f.wait_ns.0,
            hold: f.hold_ns.map(|h| h.0).unwrap_or_default(),
        });
        if !measured {
            s.hold_ns = None;
        }
        s
    }
}

/// A distribution read from a file, checked.
#[derive(Deserialize)]
#[serde(try_from = "DistFields")]
struct CheckedDist(DurationHist);

/// A distribution's fields. `mean` and the percentiles are derived: they must have their
/// type when present, and are then recomputed.
#[derive(Deserialize)]
struct DistFields {
    sum: u64,
    max: u64,
    buckets: Buckets,
    #[serde(rename = "mean", default)]
    _mean: Option<f64>,
    #[serde(rename = "p50", default)]
    _p50: Option<u64>,
    #[serde(rename = "p90", default)]
    _p90: Option<u64>,
    #[serde(rename = "p99", default)]
    _p99: Option<u64>,
    #[serde(rename = "p999", default)]
    _p999: Option<u64>,
}

impl TryFrom<DistFields> for CheckedDist {
    type Error = String;

    fn try_from(f: DistFields) -> Result<Self, String> {
        let mut h = f.buckets.0;
        h.sum = f.sum;
        h.max = f.max;
        if !h.max_is_consistent() {
            let top = h.buckets().last().map_or(0, |b| b.0);
            return Err(format!(
                "max {} is below its highest bucket (upper bound {} ns, from {} ns)",
                f.max,
                bucket_upper_ns(top),
                bucket_upper_ns(top) / 2
            ));
        }
        Ok(CheckedDist(h))
    }
}

/// `[[upper_bound_ns, count], ...]`, added into a histogram as they come: a long list costs
/// no memory, and a bound or count out of range is named by its index.
struct Buckets(DurationHist);

impl<'de> Deserialize<'de> for Buckets {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Buckets;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a sequence of [upper_bound_ns, count] pairs")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Buckets, A::Error> {
                let mut h = DurationHist::default();
                while let Some(Bucket(i, n)) = seq.next_element()? {
                    h.add(i, n);
                }
                Ok(Buckets(h))
            }
        }
        d.deserialize_seq(V)
    }
}

/// One `[upper_bound_ns, count]` pair: the bucket's index and count.
struct Bucket(usize, u64);

impl<'de> Deserialize<'de> for Bucket {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let (upper, n) = <(u64, u64)>::deserialize(d)?;
        let Some(i) = bucket_of_upper(upper) else {
            return Err(de::Error::custom(format!(
                "{upper} is not the upper bound of a log2 bucket (1, 2, 4, ... 2^39 ns)"
            )));
        };
        if n > MAX_BUCKET_COUNT {
            return Err(de::Error::custom(format!(
                "count {n} is out of range (at most 2^58 - 1)"
            )));
        }
        Ok(Bucket(i, n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_read_back_as_they_were_written_and_derived_figures_are_recomputed() {
        let mut s = SideStats {
            count: 12,
            failed: 1,
            ..Default::default()
        };
        s.wait = DurationHist::from_upper_bounds(30_000, 5000, [(1, 2), (1024, 9), (8192, 1)]);
        s.hold = DurationHist::from_upper_bounds(1200, 200, [(256, 12)]);
        let stats = Stats::new(&s);
        let json = serde_json::to_string(&stats).unwrap();
        let back: Stats = serde_json::from_str(&json).unwrap();
        assert_eq!(back, stats);
        assert_eq!(back.side(), s);
        // A file's own percentiles give way to the buckets'.
        let edited = json.replace(&format!("\"p99\":{}", stats.wait_ns.p99), "\"p99\":7");
        assert_ne!(edited, json);
        let again: Stats = serde_json::from_str(&edited).unwrap();
        assert_eq!(again.wait_ns.p99, stats.wait_ns.p99);
        assert!(stats.wait_ns.p99 <= 5000 && stats.wait_ns.p99 >= 4096);
    }
}
