//! The evidence chain of a process's wait: writers -> mechanism -> waiters. Each sampled
//! write stack says what its write was for ([`Mechanism`]); the threads' exact writes by role
//! and cause, shared out by those stacks, say how many writes each mechanism made and who
//! made them; the waits charged to their holds (who made whom wait: contention mode, or full
//! mode with `--blockers`) say whom they made wait and how long. Without charged waits, the
//! process's contended waits are shared out by the writes' hold time, and the chain says it
//! estimated them.

use std::collections::BTreeMap;

use super::{
    mechanism::{Mechanism, classify, code_frame, frame_text, js_frame},
    view::own,
};
use crate::{
    output::report::{FrameReport, ProcessReport, Stats},
    registry::roles::Role,
};

/// A (role, cause) pair: whose writes, of what.
type Writers = (Role, String);

/// Weights per mechanism.
type Shares = BTreeMap<Mechanism, f64>;

/// One mechanism's part of a process's wait.
#[derive(Clone, Debug, Default)]
pub(super) struct Link {
    /// Sampled stacks that show it (the writes' own, and holders' in contention mode).
    pub stacks: u64,
    /// Its writes, estimated: each (role, cause)'s exact count times its sampled share.
    pub writes: f64,
    pub writes_by_role: BTreeMap<Role, f64>,
    pub writes_by_cause: BTreeMap<String, f64>,
    /// The code that called the C runtime (or V8's page allocator), by sampled stacks.
    pub code: BTreeMap<String, u64>,
    /// The innermost application JavaScript function on those stacks, by sampled stacks.
    pub js: BTreeMap<String, u64>,
    /// Its writes' hold time, estimated (full mode), ns.
    pub hold_ns: f64,
    /// The wait its holds made each role's threads wait, ns: (all, writers').
    pub victims: BTreeMap<Role, (f64, f64)>,
    /// Its own writes' wait behind read holds (page faults), ns: writers need the lock
    /// alone, and wait for every reader in.
    pub behind_readers: f64,
    /// The part of `victims`' wait spent behind its unmaps' read holds after they downgraded
    /// the lock (the kernel freeing the pages of what was unmapped), ns.
    pub behind_unmaps: f64,
}

impl Link {
    /// The wait it explains: what it made others wait, and its own writes' wait for readers.
    pub fn cost(&self) -> f64 {
        self.victims.values().map(|v| v.0).sum::<f64>() + self.behind_readers
    }

    /// Most first, at most `n`, each on a tenth of the stacks or more (a frame on a few
    /// stacks of many is not what makes these writes).
    pub fn top(&self, m: &BTreeMap<String, u64>, n: usize) -> Vec<String> {
        let mut v: Vec<(&String, &u64)> =
            m.iter().filter(|(_, c)| **c * 10 >= self.stacks).collect();
        v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        v.into_iter().take(n).map(|(k, _)| k.clone()).collect()
    }
}

/// A process's chain.
#[derive(Debug, Default)]
pub(super) struct Chain {
    pub links: BTreeMap<Mechanism, Link>,
    /// Whether the victims' wait was charged to holds (else shared by hold time).
    pub charged: bool,
    /// The wait the chain shares out: charged (`blocked_wait_ns`), or the contended wait.
    pub wait_ns: f64,
    /// Whether the summary has sampled stacks at all.
    pub sampled: bool,
}

/// Waits of at most this long found the lock free (the fast path takes a few hundred ns):
/// without charged waits, they are no one's cost.
pub(super) const UNCONTENDED_NS: u64 = 2048;

/// A STATS' wait in acquisitions that waited longer than [`UNCONTENDED_NS`], at least: its
/// sum less each shorter bucket's count times its upper bound.
pub(super) fn contended(s: &Stats) -> u64 {
    let short: u64 = (s.wait_ns.buckets.iter())
        .filter(|b| b.0 <= UNCONTENDED_NS)
        .map(|b| b.0.saturating_mul(b.1))
        .sum();
    s.wait_ns.sum.saturating_sub(short)
}

fn normalised(w: &Shares) -> Option<Shares> {
    let total: f64 = w.values().sum();
    (total > 0.0).then(|| w.iter().map(|(m, x)| (*m, x / total)).collect())
}

/// The sampled stacks' weights of one (role, cause), by what they weigh.
#[derive(Default)]
struct Weights {
    count: BTreeMap<Writers, Shares>,
    hold: BTreeMap<Writers, Shares>,
    /// Holders' stacks (contention mode, `--blockers`): the waits charged to them.
    charged: BTreeMap<Writers, Shares>,
}

impl Weights {
    /// The shares of one (role, cause): charged waits first (they are the holds that made
    /// others wait), then hold time, then counts.
    fn of_holder(&self, w: &Writers) -> Option<Shares> {
        [&self.charged, &self.hold, &self.count]
            .into_iter()
            .find_map(|m| m.get(w).and_then(normalised))
    }

    /// A role's own writes that waited: each cause's contended wait (exact) shared out by
    /// that cause's sampled stacks (by count: a sampled wait's length says little of the
    /// others').
    fn of_waiter(&self, role: Role, exact: &BTreeMap<Writers, Exact>) -> Option<Shares> {
        let mut all = Shares::new();
        for ((r, cause), e) in exact.iter().filter(|((r, _), _)| *r == role) {
            let Some(s) = self.count.get(&(*r, cause.clone())).and_then(normalised) else {
                continue;
            };
            for (k, x) in s {
                *all.entry(k).or_default() += x * e.wait as f64;
            }
        }
        normalised(&all)
    }
}

fn add(m: &mut BTreeMap<Writers, Shares>, w: &Writers, k: Mechanism, x: f64) {
    *m.entry(w.clone()).or_default().entry(k).or_default() += x;
}

/// What a summary's `samples` say of each mechanism: weights per (role, cause), and each
/// mechanism's stacks, code and JavaScript.
fn read_samples(p: &ProcessReport, links: &mut BTreeMap<Mechanism, Link>) -> Weights {
    let mut w = Weights::default();
    let Some(s) = p.samples.as_ref() else {
        return w;
    };
    for row in s.stacks.iter().filter(|r| r.op == "write") {
        let frames: Vec<&FrameReport> = (row.frames.iter())
            .filter_map(|&i| s.frames.get(i as usize))
            .collect();
        let Some(m) = classify(&frames, &row.cause) else {
            continue;
        };
        let key = (row.role, row.cause.to_string());
        if row.holder {
            add(&mut w.charged, &key, m, row.wait_ns_sum as f64);
        } else {
            add(&mut w.count, &key, m, row.count as f64);
            if let Some(h) = row.hold_ns_sum.filter(|&h| h > 0) {
                add(&mut w.hold, &key, m, h as f64);
            }
        }
        let link = links.entry(m).or_default();
        link.stacks += row.count;
        if let Some(c) = code_frame(&frames, m) {
            *link.code.entry(frame_text(c)).or_default() += row.count;
        }
        if let Some(js) = js_frame(&frames) {
            *link.js.entry(js).or_default() += row.count;
        }
    }
    w
}

/// A (role, cause)'s writes as the threads' figures have them, exactly.
#[derive(Clone, Copy, Debug, Default)]
struct Exact {
    count: u64,
    hold: u64,
    /// Their contended wait.
    wait: u64,
}

/// The writes of a process's own threads by (role, cause).
fn writes(p: &ProcessReport) -> BTreeMap<Writers, Exact> {
    let mut out: BTreeMap<Writers, Exact> = BTreeMap::new();
    for t in own(p) {
        for c in &t.lock.causes {
            let e = out.entry((t.role, c.cause.to_string())).or_default();
            e.count += c.write.count;
            e.hold += c.write.hold_ns.as_ref().map_or(0, |h| h.sum);
            e.wait += contended(&c.write);
        }
    }
    out
}

/// The causes whose stacks a holder's cause is read from: a downgraded write's read hold is
/// the rest of a munmap (or mremap, brk).
fn holder_causes(cause: &str) -> &[&str] {
    match cause {
        "downgrade" => &["munmap", "mremap", "brk"],
        "mmap" => &["mmap"],
        "munmap" => &["munmap"],
        "mprotect" => &["mprotect"],
        "brk" => &["brk"],
        "mremap" => &["mremap"],
        "madvise" => &["madvise"],
        _ => &[],
    }
}

fn shares_of_holder(w: &Weights, role: Role, cause: &str) -> Option<Shares> {
    let mut all = Shares::new();
    for c in holder_causes(cause) {
        if let Some(s) = w.of_holder(&(role, (*c).to_string())) {
            for (k, x) in s {
                *all.entry(k).or_default() += x;
            }
        }
    }
    normalised(&all)
}

/// The chain of one process of a summary.
pub(super) fn chain(p: &ProcessReport) -> Chain {
    let mut links: BTreeMap<Mechanism, Link> = BTreeMap::new();
    let w = read_samples(p, &mut links);
    let exact = writes(p);
    // Writes and holds: each (role, cause)'s exact figures shared out by its stacks.
    for ((role, cause), e) in &exact {
        let (count, hold) = (&e.count, &e.hold);
        let Some(shares) = w
            .count
            .get(&(*role, cause.clone()))
            .and_then(normalised)
            .or_else(|| w.of_holder(&(*role, cause.clone())))
        else {
            continue;
        };
        for (m, s) in shares {
            let link = links.entry(m).or_default();
            link.writes += *count as f64 * s;
            *link.writes_by_role.entry(*role).or_default() += *count as f64 * s;
            *link.writes_by_cause.entry(cause.clone()).or_default() += *count as f64 * s;
            link.hold_ns += *hold as f64 * s;
        }
    }
    let mut chain = Chain {
        charged: false,
        wait_ns: 0.0,
        sampled: p.samples.as_ref().is_some_and(|s| !s.stacks.is_empty()),
        links: BTreeMap::new(),
    };
    match p.blocked_by_role.as_ref() {
        Some(rows) => {
            chain.charged = true;
            chain.wait_ns = p.blocked_wait_ns.unwrap_or(0) as f64;
            // Readers that waited for readers: a writer was queued between them (an rwsem
            // lets no reader past a waiting writer), so they are that writer's victims.
            let mut behind_queued: BTreeMap<Role, f64> = BTreeMap::new();
            for r in rows {
                if r.cause == "read" {
                    // Writers waiting for readers: the writers' own mechanism's cost.
                    if let Some(shares) = w.of_waiter(r.waiter_role, &exact) {
                        for (m, s) in shares {
                            links.entry(m).or_default().behind_readers +=
                                r.write_wait_ns as f64 * s;
                        }
                    }
                    let readers = r.wait_ns.saturating_sub(r.write_wait_ns);
                    if readers > 0 {
                        *behind_queued.entry(r.waiter_role).or_default() += readers as f64;
                    }
                    continue;
                }
                let Some(shares) = shares_of_holder(&w, r.holder_role, &r.cause) else {
                    continue;
                };
                for (m, s) in shares {
                    let link = links.entry(m).or_default();
                    if r.cause == "downgrade" {
                        link.behind_unmaps += r.wait_ns as f64 * s;
                    }
                    let v = link.victims.entry(r.waiter_role).or_default();
                    v.0 += r.wait_ns as f64 * s;
                    v.1 += r.write_wait_ns as f64 * s;
                }
            }
            // Which writers were queued is not recorded: those that waited for readers, in
            // proportion.
            let queued: Shares = links.iter().map(|(m, l)| (*m, l.behind_readers)).collect();
            if let Some(shares) = normalised(&queued) {
                for (role, wait) in behind_queued {
                    for (m, s) in &shares {
                        let v = (links.entry(*m).or_default().victims)
                            .entry(role)
                            .or_default();
                        v.0 += wait * s;
                    }
                }
            }
        }
        None => {
            // No waits charged: the contended waits, shared by the writes' hold time (or,
            // where none was timed, their count).
            let by: Vec<(Mechanism, f64)> = links
                .iter()
                .map(|(m, l)| (*m, if l.hold_ns > 0.0 { l.hold_ns } else { 0.0 }))
                .collect();
            let held: f64 = by.iter().map(|b| b.1).sum();
            let total: f64 = exact.values().map(|v| v.hold as f64).sum();
            let mut per_role: BTreeMap<Role, (f64, f64)> = BTreeMap::new();
            for t in own(p) {
                let e = per_role.entry(t.role).or_default();
                let wr = contended(&t.lock.write) as f64;
                e.0 += wr + contended(&t.lock.read) as f64;
                e.1 += wr;
            }
            chain.wait_ns = per_role.values().map(|v| v.0).sum();
            if held > 0.0 && total > 0.0 {
                for (m, h) in by {
                    let s = h / total;
                    let link = links.entry(m).or_default();
                    for (role, (all, wr)) in &per_role {
                        let v = link.victims.entry(*role).or_default();
                        v.0 += all * s;
                        v.1 += wr * s;
                    }
                }
            }
        }
    }
    chain.links = links;
    chain
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::{
        blockers::RoleBlock,
        report::{SampleReport, SampledStacks},
    };

    fn native(function: &str, dso: &str) -> FrameReport {
        FrameReport {
            function: function.into(),
            dso: Some(dso.into()),
            ..FrameReport::default()
        }
    }

    #[test]
    fn contended_wait_leaves_out_the_fast_paths() {
        use crate::aggregation::{DurationHist, SideStats};
        // 1000 waits of about 200 ns and 3 of 1 ms.
        let s = Stats::new(&SideStats {
            count: 1003,
            failed: 0,
            wait: DurationHist::from_upper_bounds(
                200_000 + 3_000_000,
                1_000_000,
                [(256, 1000), (1 << 20, 3)],
            ),
            hold: DurationHist::default(),
        });
        assert_eq!(contended(&s), 3_000_000 + 200_000 - 256_000);
    }

    /// A holder's rows are shared out by its stacks: a libuv thread's mmaps, 3 of 4 sampled
    /// under pthread_create, the rest under malloc.
    #[test]
    fn charged_waits_follow_the_holders_stacks() {
        let frames = vec![
            native("mmap64", "/lib/libc.so.6"),
            native("pthread_create", "/lib/libc.so.6"),
            native("malloc", "/lib/libc.so.6"),
            native("hash_lanes", "/srv/lanes.node"),
        ];
        let row = |frames: Vec<u32>, count| SampleReport {
            frames,
            role: Role::Libuv,
            comm: "node".into(),
            cause: "mmap".into(),
            op: "write".into(),
            count,
            wait_ns_sum: 100 * count,
            hold_ns_sum: Some(1000 * count),
            holder: false,
        };
        let p = ProcessReport {
            samples: Some(SampledStacks {
                frames,
                stacks: vec![row(vec![0, 1, 3], 3), row(vec![0, 2, 3], 1)],
                ..SampledStacks::default()
            }),
            blocked_by_role: Some(vec![
                RoleBlock {
                    waiter_role: Role::Addon,
                    holder_role: Role::Libuv,
                    cause: "mmap".into(),
                    wait_ns: 4_000,
                    write_wait_ns: 0,
                },
                RoleBlock {
                    waiter_role: Role::Libuv,
                    holder_role: Role::Readers,
                    cause: "read".into(),
                    wait_ns: 800,
                    write_wait_ns: 800,
                },
            ]),
            blocked_wait_ns: Some(4_800),
            threads: vec![crate::output::findings::tests::writer(
                7,
                Role::Libuv,
                &[("mmap", crate::output::findings::tests::stats(4, 400_000))],
            )],
            ..ProcessReport::default()
        };
        let c = chain(&p);
        assert!(c.charged);
        let t = &c.links[&Mechanism::Threads];
        assert_eq!(t.stacks, 3);
        assert_eq!(t.victims[&Role::Addon], (3_000.0, 0.0));
        assert_eq!(t.behind_readers, 600.0);
        assert_eq!(t.cost(), 3_600.0);
        assert_eq!(t.top(&t.code, 3), ["hash_lanes (lanes.node)"]);
        let l = &c.links[&Mechanism::LargeAlloc];
        assert_eq!(l.cost(), 1_200.0);
    }
}
