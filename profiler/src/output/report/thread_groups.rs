//! Threads a report groups rather than lists, in a process of more than [`LISTED_THREADS`]
//! threads: those that lived less than a second (an addon that starts a thread per call
//! starts thousands), and those past the [`LISTED_THREADS`] that waited longest; never the
//! main thread. A group is one row of the threads' role, start routine and addon,
//! with their exact totals (counts, waits, histograms merged, causes, time), so that the
//! listed threads and the groups add up to the process; what a group does not keep is each
//! thread's own `blocked_by` (the process's `blockers` and `blocked_by_role` have their waits).

use std::{
    borrow::Cow,
    collections::{BTreeMap, HashMap},
};

use serde::{Deserialize, Serialize};

use super::{CauseReport, LockReport, ProcessReport, Stats, ThreadReport, TimeShare};
use crate::{aggregation::SideStats, registry::roles::Role};

/// Threads that lived less than this (start to exit) are grouped, but for those among the
/// [`ALWAYS_LISTED`] that waited longest that waited [`LISTED_WAIT_NS`] or more.
pub const SHORT_LIVED_NS: u64 = 1_000_000_000;
/// Threads listed whatever their life: those that waited longest (a short-lived one, if it
/// waited [`LISTED_WAIT_NS`] or more).
pub const ALWAYS_LISTED: usize = 10;
pub const LISTED_WAIT_NS: u64 = 1_000_000;
/// Threads listed at most per process (a summary line then stays bounded whatever the
/// threads).
pub const LISTED_THREADS: usize = 100;

/// Why a group's threads are not listed one by one.
pub const SHORT_LIVED: &str = "short_lived";
pub const PAST_LISTED: &str = "past_listed";

/// A group of a process's threads, in the shape of a thread row (`tid` 0) with how many
/// threads it stands for.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ThreadGroupReport {
    /// Threads in the group.
    pub threads: u64,
    /// [`SHORT_LIVED`] or [`PAST_LISTED`].
    pub grouped: Cow<'static, str>,
    /// Their start routine, when it was read.
    pub start_routine: Option<String>,
    /// Their totals: role, name (`*` when they differ), addon, acquisitions, causes, time
    /// share (with their count).
    #[serde(flatten)]
    pub row: ThreadReport,
}

/// What a report knows of a thread beyond its row, to group it.
#[derive(Clone, Debug, Default)]
pub struct ThreadFacts {
    /// It exited, having lived this long.
    pub lived_ns: Option<u64>,
    pub start_routine: Option<String>,
}

/// All a thread's wait on this lock.
fn wait(t: &ThreadReport) -> u64 {
    t.lock.write.wait_ns.sum + t.lock.read.wait_ns.sum
}

/// The order in which threads are listed: the main thread first (the one a person looks for,
/// whatever it waited), then the longest wait (write and read), then the most writes.
fn importance(t: &ThreadReport) -> std::cmp::Reverse<(bool, u64, u64)> {
    std::cmp::Reverse((t.role == Role::Main, wait(t), t.lock.write.count))
}

/// The threads listed, the groups, and each grouped thread's role and name by tid.
pub type Grouping = (
    Vec<ThreadReport>,
    Vec<ThreadGroupReport>,
    HashMap<u32, (Role, String)>,
);

/// A group being made.
#[derive(Default)]
struct Sum {
    threads: u64,
    comm: Option<String>,
    write: SideStats,
    read: SideStats,
    downgrade: SideStats,
    causes: BTreeMap<String, SideStats>,
    /// The time shares of the threads that have one, summed.
    time: Option<TimeSum>,
}

/// Wait, alive, CPU-known wait, CPU and run-queue delay, summed.
type TimeSum = (u64, u64, u64, Option<u64>, Option<u64>);

impl Sum {
    fn add(&mut self, t: &ThreadReport) {
        self.threads += 1;
        match &self.comm {
            None => self.comm = Some(t.comm.clone()),
            Some(c) if *c != t.comm => self.comm = Some("*".into()),
            Some(_) => {}
        }
        self.write.merge(&t.lock.write.side());
        self.read.merge(&t.lock.read.side());
        self.downgrade.merge(&t.lock.downgrade.side());
        for c in &t.lock.causes {
            self.causes
                .entry(c.cause.to_string())
                .or_default()
                .merge(&c.write.side());
        }
        if let Some(s) = &t.time_share {
            let (w, a, cw, cpu, queued) = self.time.get_or_insert((0, 0, 0, None, None));
            *w += s.wait_ns;
            *a += s.alive_ns;
            if let Some(c) = s.cpu_ns {
                *cw += s.wait_ns;
                *cpu = Some(cpu.unwrap_or(0) + c);
            }
            if let Some(q) = s.queued_ns {
                *queued = Some(queued.unwrap_or(0) + q);
            }
        }
    }

    /// A group made before (its thread count, sums and time share), to add to.
    fn add_group(&mut self, g: &ThreadGroupReport) {
        let threads = self.threads;
        self.add(&g.row);
        self.threads = threads + g.threads;
    }

    fn time_share(&self) -> Option<TimeShare> {
        let (wait, alive, cpu_wait, cpu, queued) = self.time?;
        let ratio = |a: u64, b: u64| (a as f64 / b as f64 * 1e6).round() / 1e6;
        (alive > 0).then(|| TimeShare {
            wait_ns: wait,
            alive_ns: alive,
            wall: ratio(wait, alive),
            cpu_ns: cpu,
            cpu: cpu.filter(|&c| c > 0).map(|c| ratio(cpu_wait, c)),
            queued_ns: queued,
            threads: Some(self.threads),
        })
    }
}

/// The key of a group: why, role, the taker's process (foreign threads), addon, library,
/// start routine.
type Key = (
    &'static str,
    Role,
    Option<u32>,
    Option<String>,
    Option<String>,
    Option<String>,
);

/// Splits a process's thread rows (in the report's order, each with its facts) into those
/// listed, at most `listed` and the [`ALWAYS_LISTED`] that waited longest among them (and
/// the main thread, always), and the groups of the others, the longest wait first. Also
/// returns each grouped thread's role and name by tid (its sampled stacks are labelled by
/// them).
pub fn group(rows: Vec<(ThreadReport, ThreadFacts)>, listed: usize) -> Grouping {
    let mut rank: Vec<usize> = (0..rows.len()).collect();
    rank.sort_by_key(|&i| importance(&rows[i].0));
    let mut why: Vec<Option<&'static str>> = vec![None; rows.len()];
    // A process of few threads lists them all, whatever their lives.
    if rows.len() <= listed {
        let out = rows.into_iter().map(|(t, _)| t).collect();
        return (out, Vec::new(), HashMap::new());
    }
    let mut kept = 0;
    for (n, &i) in rank.iter().enumerate() {
        let short = rows[i].1.lived_ns.is_some_and(|l| l < SHORT_LIVED_NS);
        let top = n < ALWAYS_LISTED.min(listed);
        let list = if rows[i].0.role == Role::Main {
            true
        } else if short {
            top && wait(&rows[i].0) >= LISTED_WAIT_NS
        } else {
            top || kept < listed
        };
        if list {
            kept += 1;
        } else {
            why[i] = Some(if short { SHORT_LIVED } else { PAST_LISTED });
        }
    }
    let mut out = Vec::new();
    let mut sums: BTreeMap<Key, Sum> = BTreeMap::new();
    let mut tids = HashMap::new();
    for ((t, facts), why) in rows.into_iter().zip(why) {
        let Some(why) = why else {
            out.push(t);
            continue;
        };
        tids.insert(t.tid, (t.role, t.comm.clone()));
        let key = (
            why,
            t.role,
            t.pid,
            t.role_addon.clone(),
            t.role_library.clone(),
            facts.start_routine,
        );
        sums.entry(key).or_default().add(&t);
    }
    (out, made(sums), tids)
}

/// The groups of these sums, the longest wait first.
fn made(sums: BTreeMap<Key, Sum>) -> Vec<ThreadGroupReport> {
    let mut groups: Vec<ThreadGroupReport> = sums
        .into_iter()
        .map(
            |((why, role, pid, addon, library, start), s)| ThreadGroupReport {
                threads: s.threads,
                grouped: why.into(),
                start_routine: start,
                row: ThreadReport {
                    tid: 0,
                    role,
                    comm: s.comm.clone().unwrap_or_default(),
                    pid,
                    role_addon: addon,
                    role_library: library,
                    lock: LockReport::new(
                        &s.write,
                        &s.read,
                        &s.downgrade,
                        s.causes
                            .iter()
                            .map(|(c, w)| CauseReport {
                                cause: c.clone().into(),
                                write: Stats::new(w),
                            })
                            .collect(),
                    ),
                    blocked_by: None,
                    time_share: s.time_share(),
                },
            },
        )
        .collect();
    groups.sort_by_key(|g| std::cmp::Reverse((wait(&g.row), g.row.lock.write.count)));
    groups
}

/// The key of a group made before.
fn key_of(g: &ThreadGroupReport) -> Key {
    let why = if g.grouped == SHORT_LIVED {
        SHORT_LIVED
    } else {
        PAST_LISTED
    };
    (
        why,
        g.row.role,
        g.row.pid,
        g.row.role_addon.clone(),
        g.row.role_library.clone(),
        g.start_routine.clone(),
    )
}

/// Keeps `keep` of a process's listed threads, those that waited longest, in their order, and
/// groups the others (`past_listed`) with its groups.
pub fn regroup(p: &mut ProcessReport, keep: usize) {
    if p.threads.len() <= keep {
        return;
    }
    let mut rank: Vec<usize> = (0..p.threads.len()).collect();
    rank.sort_by_key(|&i| importance(&p.threads[i]));
    let mut listed = vec![false; p.threads.len()];
    for &i in rank.iter().take(keep) {
        listed[i] = true;
    }
    let mut sums: BTreeMap<Key, Sum> = BTreeMap::new();
    for g in p.thread_groups.take().into_iter().flatten() {
        sums.entry(key_of(&g)).or_default().add_group(&g);
    }
    let mut kept = Vec::with_capacity(keep);
    for (t, listed) in std::mem::take(&mut p.threads).into_iter().zip(listed) {
        if listed {
            kept.push(t);
            continue;
        }
        p.grouped_tids.insert(t.tid, (t.role, t.comm.clone()));
        let key = (
            PAST_LISTED,
            t.role,
            t.pid,
            t.role_addon.clone(),
            t.role_library.clone(),
            None,
        );
        sums.entry(key).or_default().add(&t);
    }
    p.threads = kept;
    p.thread_groups = Some(made(sums));
}

impl ProcessReport {
    /// Its thread rows and what each stands for: a listed thread is one, a group as many
    /// threads as it has. Sums over them are the process's threads' whatever is grouped.
    pub fn thread_rows(&self) -> impl Iterator<Item = (&ThreadReport, u64)> {
        self.threads.iter().map(|t| (t, 1)).chain(
            self.thread_groups
                .iter()
                .flatten()
                .map(|g| (&g.row, g.threads)),
        )
    }

    /// Threads grouped, in all.
    pub fn grouped_threads(&self) -> u64 {
        self.thread_groups.iter().flatten().map(|g| g.threads).sum()
    }
}

#[cfg(test)]
#[path = "thread_groups_tests.rs"]
mod tests;
