//! A run without its summary line (the profiler was killed hard): its interval lines partition
//! the run, so summed per process they give the summary's figures, as far as interval lines
//! carry them (not the sampled stacks, which only the summary has).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::u;

/// One duration distribution summed over lines.
#[derive(Default)]
struct Dist {
    sum: u64,
    max: u64,
    buckets: BTreeMap<u64, u64>,
}

impl Dist {
    fn add(&mut self, d: &Value) {
        self.sum += u(&d["sum"]);
        self.max = self.max.max(u(&d["max"]));
        for b in d["buckets"].as_array().into_iter().flatten() {
            *self.buckets.entry(u(&b[0])).or_default() += u(&b[1]);
        }
    }

    /// The `q` quantile at bucket resolution: the middle of its bucket (as the summary counts
    /// a bucket at its midpoint), never above the maximum.
    fn quantile(&self, q: f64) -> u64 {
        let total: u64 = self.buckets.values().sum();
        let want = ((total as f64 * q).ceil() as u64).max(1);
        let mut seen = 0;
        for (&ub, &n) in &self.buckets {
            seen += n;
            if seen >= want {
                let mid = if ub <= 1 { 0 } else { ub / 2 + ub / 4 };
                return mid.min(self.max);
            }
        }
        0
    }

    fn to_json(&self, count: u64) -> Value {
        let mean = if count == 0 {
            0.0
        } else {
            (self.sum as f64 / count as f64 * 10.0).round() / 10.0
        };
        json!({"sum": self.sum, "max": self.max, "mean": mean,
               "p50": self.quantile(0.5), "p90": self.quantile(0.9),
               "p99": self.quantile(0.99), "p999": self.quantile(0.999),
               "buckets": self.buckets.iter().map(|(b, n)| [b, n]).collect::<Vec<_>>()})
    }
}

/// STATS summed over lines.
#[derive(Default)]
struct Stats {
    count: u64,
    failed_trylocks: u64,
    wait: Dist,
    hold: Dist,
}

impl Stats {
    fn add(&mut self, s: &Value) {
        self.count += u(&s["count"]);
        self.failed_trylocks += u(&s["failed_trylocks"]);
        self.wait.add(&s["wait_ns"]);
        self.hold.add(&s["hold_ns"]);
    }

    fn to_json(&self) -> Value {
        json!({"count": self.count, "failed_trylocks": self.failed_trylocks,
               "wait_ns": self.wait.to_json(self.count), "hold_ns": self.hold.to_json(self.count)})
    }
}

/// Write STATS per cause.
type Causes = BTreeMap<String, Stats>;

fn add_causes(causes: &mut Causes, list: &Value) {
    for c in list.as_array().into_iter().flatten() {
        let name = c["cause"].as_str().unwrap_or("other").to_string();
        causes.entry(name).or_default().add(&c["write"]);
    }
}

/// Largest total write wait first, as in the summary.
fn causes_json(causes: &Causes) -> Value {
    let mut v: Vec<(&String, &Stats)> = causes.iter().collect();
    v.sort_by_key(|(_, s)| std::cmp::Reverse(s.wait.sum));
    v.into_iter()
        .map(|(c, s)| json!({"cause": c, "write": s.to_json()}))
        .collect()
}

#[derive(Default)]
struct Thread {
    role: String,
    comm: String,
    write: Stats,
    read: Stats,
    downgrade: Stats,
    causes: Causes,
}

#[derive(Default)]
struct Process {
    comm: String,
    write: Stats,
    read: Stats,
    downgrade: Stats,
    causes: Causes,
    blocked_wait_ns: Option<u64>,
    /// By (tid, the taker's pid for a foreign thread).
    threads: BTreeMap<(u64, Option<u64>), Thread>,
}

/// The interval lines summed into one line in the summary's shape (`processes`, `start`,
/// `end`, `lost`).
pub fn summed(intervals: &[Value]) -> Value {
    let mut procs: BTreeMap<(u64, u64), Process> = BTreeMap::new();
    let mut lost: BTreeMap<String, u64> = BTreeMap::new();
    for l in intervals {
        for (k, v) in l["lost"].as_object().into_iter().flatten() {
            *lost.entry(k.clone()).or_default() += u(v);
        }
        for p in l["processes"].as_array().into_iter().flatten() {
            let e = procs
                .entry((u(&p["pid"]), u(&p["start_ticks"])))
                .or_default();
            if let Some(c) = p["comm"].as_str() {
                e.comm = c.to_string();
            }
            e.write.add(&p["write"]);
            e.read.add(&p["read"]);
            e.downgrade.add(&p["downgrade"]);
            add_causes(&mut e.causes, &p["causes"]);
            if let Some(b) = p["blocked_wait_ns"].as_u64() {
                *e.blocked_wait_ns.get_or_insert(0) += b;
            }
            for t in p["threads"].as_array().into_iter().flatten() {
                let th = e
                    .threads
                    .entry((u(&t["tid"]), t["pid"].as_u64()))
                    .or_default();
                // The last line's role is the latest known (a thread may be named later).
                if let Some(r) = t["role"].as_str() {
                    th.role = r.to_string();
                }
                if let Some(c) = t["comm"].as_str() {
                    th.comm = c.to_string();
                }
                th.write.add(&t["write"]);
                th.read.add(&t["read"]);
                th.downgrade.add(&t["downgrade"]);
                add_causes(&mut th.causes, &t["causes"]);
            }
        }
    }
    let processes: Vec<Value> = procs
        .iter()
        .map(|(&(pid, start_ticks), p)| {
            let mut threads: Vec<(&(u64, Option<u64>), &Thread)> = p.threads.iter().collect();
            threads.sort_by_key(|(_, t)| std::cmp::Reverse((t.write.wait.sum, t.write.count)));
            let threads: Vec<Value> = threads
                .into_iter()
                .map(|(&(tid, taker), t)| {
                    let mut v = json!({"tid": tid, "role": t.role, "comm": t.comm,
                        "write": t.write.to_json(), "read": t.read.to_json(),
                        "downgrade": t.downgrade.to_json(), "causes": causes_json(&t.causes)});
                    if let Some(pid) = taker {
                        v["pid"] = pid.into();
                    }
                    v
                })
                .collect();
            let mut v = json!({"pid": pid, "comm": p.comm, "start_ticks": start_ticks,
                "write": p.write.to_json(), "read": p.read.to_json(),
                "downgrade": p.downgrade.to_json(), "causes": causes_json(&p.causes),
                "threads": threads});
            if let Some(b) = p.blocked_wait_ns {
                v["blocked_wait_ns"] = b.into();
            }
            v
        })
        .collect();
    json!({
        "type": "summary",
        "start": intervals.first().map_or(Value::Null, |l| l["start"].clone()),
        "end": intervals.last().map_or(Value::Null, |l| l["end"].clone()),
        "processes": processes,
        "lost": lost,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(wait_buckets: &[(u64, u64)], mprotect: u64, role: &str) -> Value {
        let count: u64 = wait_buckets.iter().map(|b| b.1).sum();
        let sum: u64 = wait_buckets.iter().map(|b| b.0 / 2 * b.1).sum();
        let stats = json!({"count": count, "failed_trylocks": 1,
            "wait_ns": {"sum": sum, "max": wait_buckets.last().unwrap().0 - 1,
                        "buckets": wait_buckets.iter().map(|b| [b.0, b.1]).collect::<Vec<_>>()},
            "hold_ns": {"sum": 0, "max": 0, "buckets": []}});
        json!({"type": "interval", "start": "a", "end": "b", "lost": {"events": 2},
            "processes": [{"pid": 7, "start_ticks": 99, "comm": "node",
                "write": stats, "read": {"count": 0},
                "causes": [{"cause": "mprotect", "write": {"count": mprotect, "wait_ns": {"sum": 0}}}],
                "threads": [{"tid": 8, "role": role, "comm": "node", "write": stats}]}]})
    }

    #[test]
    fn interval_lines_add_up_per_process_thread_and_cause() {
        let a = line(&[(1024, 3), (4096, 1)], 2, "main");
        let b = line(&[(1024, 1), (1 << 20, 1)], 5, "worker");
        let s = summed(&[a, b]);
        let p = &s["processes"][0];
        assert_eq!(s["processes"].as_array().unwrap().len(), 1);
        assert_eq!(p["write"]["count"], 6);
        assert_eq!(p["write"]["failed_trylocks"], 2);
        assert_eq!(p["write"]["wait_ns"]["sum"], 512 * 4 + 2048 + (1 << 19));
        assert_eq!(p["write"]["wait_ns"]["max"], (1 << 20) - 1);
        assert_eq!(
            p["write"]["wait_ns"]["buckets"],
            json!([[1024, 4], [4096, 1], [1 << 20, 1]])
        );
        // 6 waits: the median is in the 1024 bucket, the p99 in the last one.
        assert_eq!(p["write"]["wait_ns"]["p50"], 768);
        assert_eq!(p["write"]["wait_ns"]["p99"], (1 << 19) + (1 << 18));
        assert_eq!(p["causes"][0]["write"]["count"], 7);
        // One thread, its latest role.
        assert_eq!(p["threads"].as_array().unwrap().len(), 1);
        assert_eq!(p["threads"][0]["role"], "worker");
        assert_eq!(p["threads"][0]["write"]["count"], 6);
        assert_eq!(s["lost"]["events"], 4);
    }
}
