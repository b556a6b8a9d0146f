//! A run without its summary line (the profiler was killed hard): its interval lines partition
//! the run, so summed per process they give the summary's figures, as far as interval lines
//! carry them (not the sampled stacks, which only the summary has; the time shares, whose
//! windows partition the run too, with their thread counts the most of any line). Lines are added one at a
//! time: what is kept grows with the processes and threads seen, not with the lines.

use std::collections::BTreeMap;

use crate::{
    aggregation::SideStats,
    output::{
        report::{
            CauseReport, Kind, LockReport, Lost, ProcessReport, Report, SCHEMA_VERSION, Stats,
            ThreadGroupReport, ThreadReport, TimeShare, Uncounted,
        },
        share::{self, ShareSum},
    },
    registry::roles::Role,
};

/// Write acquisitions per cause.
type Causes = BTreeMap<String, SideStats>;

fn add_causes(causes: &mut Causes, list: &[CauseReport]) {
    for c in list {
        causes
            .entry(c.cause.to_string())
            .or_default()
            .merge(&c.write.side());
    }
}

/// What one thread (or process) did, summed over lines.
#[derive(Default)]
struct Sides {
    write: SideStats,
    read: SideStats,
    downgrade: SideStats,
    causes: Causes,
}

impl Sides {
    fn add(&mut self, lock: &LockReport) {
        self.write.merge(&lock.write.side());
        self.read.merge(&lock.read.side());
        self.downgrade.merge(&lock.downgrade.side());
        add_causes(&mut self.causes, &lock.causes);
    }

    /// The sum, in the summary's shape.
    fn report(&self) -> LockReport {
        let causes = self
            .causes
            .iter()
            .map(|(c, s)| CauseReport {
                cause: c.clone().into(),
                write: Stats::new(s),
            })
            .collect();
        LockReport::new(&self.write, &self.read, &self.downgrade, causes)
    }
}

struct Thread {
    role: Role,
    /// An addon thread's addon and library (`role_addon`, `role_library`).
    origin: (Option<String>, Option<String>),
    comm: String,
    sides: Sides,
    time: Option<ShareSum>,
}

/// A group of threads (`thread_groups`) summed over lines: its threads (a thread grouped in
/// two lines counts twice, so at most), sides and time.
struct Group {
    threads: u64,
    comm: String,
    sides: Sides,
    time: Option<ShareSum>,
}

/// (why, role, taker's pid, addon, library, start routine).
type GroupKey = (
    String,
    Role,
    Option<u32>,
    Option<String>,
    Option<String>,
    Option<String>,
);

#[derive(Default)]
struct Process {
    comm: String,
    /// The last known (a line may not have them yet).
    cgroup: Option<String>,
    exe: Option<String>,
    sides: Sides,
    blocked_wait_ns: Option<u64>,
    /// By (tid, the taker's pid for a foreign thread).
    threads: BTreeMap<(u32, Option<u32>), Thread>,
    time: Option<ShareSum>,
    time_by_role: BTreeMap<Role, ShareSum>,
    groups: BTreeMap<GroupKey, Group>,
}

/// Adds a line's share, if it has one.
fn add_share(sum: &mut Option<ShareSum>, share: Option<&crate::output::report::TimeShare>) {
    if let Some(s) = share {
        sum.get_or_insert_default().add_reported(s);
    }
}

/// Interval lines summed into one line in the summary's shape.
#[derive(Default)]
pub struct Summed {
    /// By (pid, start_ticks).
    procs: BTreeMap<(u32, u64), Process>,
    lost: Lost,
    uncounted: Uncounted,
    start: Option<String>,
    end: String,
    lines: usize,
    /// The lines' mode (one run's lines share it).
    mode: crate::vocab::Mode,
}

impl Summed {
    /// Interval lines added so far.
    pub fn lines(&self) -> usize {
        self.lines
    }

    pub fn add(&mut self, line: &Report) {
        self.lines += 1;
        self.mode = line.mode;
        self.start.get_or_insert_with(|| line.start.clone());
        self.end.clone_from(&line.end);
        self.lost.add(&line.lost);
        self.uncounted.add(&line.uncounted);
        for p in &line.processes {
            let e = self.procs.entry((p.pid, p.start_ticks)).or_default();
            e.comm.clone_from(&p.comm);
            if p.cgroup.is_some() {
                e.cgroup.clone_from(&p.cgroup);
            }
            if p.exe.is_some() {
                e.exe.clone_from(&p.exe);
            }
            e.sides.add(&p.lock);
            if let Some(b) = p.blocked_wait_ns {
                let sum = e.blocked_wait_ns.get_or_insert(0);
                *sum = sum.saturating_add(b);
            }
            add_share(&mut e.time, p.time_share.as_ref());
            for r in p.time_share_by_role.iter().flatten() {
                e.time_by_role
                    .entry(r.role)
                    .or_default()
                    .add_reported(&r.share);
            }
            for g in p.thread_groups.iter().flatten() {
                let t = &g.row;
                let key = (
                    g.grouped.to_string(),
                    t.role,
                    t.pid,
                    t.role_addon.clone(),
                    t.role_library.clone(),
                    g.start_routine.clone(),
                );
                let sum = e.groups.entry(key).or_insert_with(|| Group {
                    threads: 0,
                    comm: t.comm.clone(),
                    sides: Sides::default(),
                    time: None,
                });
                sum.threads += g.threads;
                sum.sides.add(&t.lock);
                add_share(&mut sum.time, t.time_share.as_ref());
            }
            for t in &p.threads {
                let th = e.threads.entry((t.tid, t.pid)).or_insert_with(|| Thread {
                    role: t.role,
                    origin: (None, None),
                    comm: String::new(),
                    sides: Sides::default(),
                    time: None,
                });
                // The last line's role is the latest known (a thread may be named later).
                th.role = t.role;
                if t.role_addon.is_some() {
                    th.origin = (t.role_addon.clone(), t.role_library.clone());
                }
                th.comm.clone_from(&t.comm);
                th.sides.add(&t.lock);
                add_share(&mut th.time, t.time_share.as_ref());
            }
        }
    }

    /// The sum as a summary, marked as such (`summed_lines`): its `duration_s` is the span
    /// of the lines, from the first's start to the last's end (the run's own end is not
    /// known).
    pub fn report(&self) -> Report {
        let processes = self
            .procs
            .iter()
            .map(|(&(pid, start_ticks), p)| {
                let mut threads: Vec<ThreadReport> = p
                    .threads
                    .iter()
                    .map(|(&(tid, taker), t)| ThreadReport {
                        tid,
                        role: t.role,
                        role_addon: t.origin.0.clone(),
                        role_library: t.origin.1.clone(),
                        comm: t.comm.clone(),
                        pid: taker,
                        lock: t.sides.report(),
                        blocked_by: None,
                        time_share: t.time.and_then(|s| s.thread()),
                    })
                    .collect();
                threads.sort_by_key(|t| {
                    std::cmp::Reverse((t.lock.write.wait_ns.sum, t.lock.write.count))
                });
                ProcessReport {
                    pid,
                    start_ticks,
                    comm: p.comm.clone(),
                    cgroup: p.cgroup.clone(),
                    exe: p.exe.clone(),
                    lock: p.sides.report(),
                    blocked_wait_ns: p.blocked_wait_ns,
                    threads,
                    thread_groups: (!p.groups.is_empty()).then(|| {
                        p.groups
                            .iter()
                            .map(
                                |((why, role, pid, addon, library, start), g)| ThreadGroupReport {
                                    threads: g.threads,
                                    grouped: why.clone().into(),
                                    start_routine: start.clone(),
                                    row: ThreadReport {
                                        tid: 0,
                                        role: *role,
                                        comm: g.comm.clone(),
                                        pid: *pid,
                                        role_addon: addon.clone(),
                                        role_library: library.clone(),
                                        lock: g.sides.report(),
                                        blocked_by: None,
                                        time_share: g.time.and_then(|s| s.thread()).map(|s| {
                                            TimeShare {
                                                threads: Some(g.threads),
                                                ..s
                                            }
                                        }),
                                    },
                                },
                            )
                            .collect()
                    }),
                    time_share: p.time.and_then(|s| s.total()),
                    time_share_by_role: share::by_role(&p.time_by_role),
                    // What interval lines do not carry (sampled stacks, blockers by name).
                    ..ProcessReport::default()
                }
            })
            .collect();
        let start = self.start.clone().unwrap_or_default();
        let span = |t: &str| {
            humantime::parse_rfc3339(t)
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        };
        let duration_s = span(&start)
            .zip(span(&self.end))
            .map(|(a, b)| (b.saturating_sub(a).as_secs_f64() * 1000.0).round() / 1000.0);
        let mut r = Report {
            kind: Kind::Summary,
            schema_version: SCHEMA_VERSION,
            mode: self.mode,
            start,
            end: self.end.clone(),
            interval_s: None,
            duration_s,
            intervals: None,
            processes,
            lost: self.lost,
            uncounted: self.uncounted,
            overhead: None,
            stack_sample: None,
            stack_work: None,
            findings: None,
            minor_processes: None,
            trigger: None,
            show_all: false,
            summed_lines: Some(self.lines),
        };
        r.drop_unmeasured();
        r
    }
}

#[cfg(test)]
#[path = "partial_tests.rs"]
mod tests;
