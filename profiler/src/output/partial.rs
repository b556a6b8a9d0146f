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
            ThreadReport, Uncounted,
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
mod tests {
    use super::*;
    use crate::output::fixtures::{interval, stats};

    #[test]
    fn interval_lines_add_up_per_process_thread_and_cause() {
        let mut a = interval("2026-01-01T00:00:01.000Z", 100);
        let mut b = interval("2026-01-01T00:00:02.000Z", 100);
        a.processes[0].lock.write = stats(4, 4096, 3000, &[(1024, 3), (4096, 1)]);
        b.processes[0].lock.write = stats(2, 1 << 19, (1 << 20) - 1, &[(1024, 1), (1 << 20, 1)]);
        b.processes[0].threads[1].role = Role::Libuv;
        // An addon thread named in the first line only: it stays named.
        a.processes[0].threads[0].role = Role::Addon;
        a.processes[0].threads[0].role_addon = Some("/app/a.node".into());
        a.processes[0].threads[0].role_library = Some("/app/liba.so".into());
        b.processes[0].threads[0].role = Role::Addon;
        // The cgroup and executable of the first line only: kept (`compare --by` reads them).
        a.processes[0].cgroup = Some("/app.slice/a.scope".into());
        a.processes[0].exe = Some("/usr/bin/node".into());
        a.lost.nested = 2;
        b.lost.nested = 3;
        b.uncounted.fork_child = 4;
        let mut s = Summed::default();
        s.add(&a);
        s.add(&b);
        let r = s.report();
        assert_eq!(
            (r.start.as_str(), r.end.as_str()),
            ("2026-01-01T00:00:00.000Z", "2026-01-01T00:00:02.000Z")
        );
        // The lines' span and count, which the text and the page say.
        assert_eq!((r.duration_s, r.summed_lines), (Some(2.0), Some(2)));
        let p = &r.processes[0];
        assert_eq!(r.processes.len(), 1);
        assert_eq!(p.lock.write.count, 6);
        assert_eq!(p.lock.write.wait_ns.sum, 4096 + (1 << 19));
        assert_eq!(p.lock.write.wait_ns.max, (1 << 20) - 1);
        assert_eq!(
            p.lock.write.wait_ns.buckets,
            [(1024, 4), (4096, 1), (1 << 20, 1)]
        );
        // The percentiles of the sum, by the one definition: 6 waits, the median in the
        // 1024 bucket, the p99 in the last one (at its middle, within hdrhistogram's 1%).
        let (p50, p99) = (p.lock.write.wait_ns.p50, p.lock.write.wait_ns.p99);
        assert!((768..776).contains(&p50), "{p50}");
        assert!(
            ((1 << 19) + (1 << 18)..(1 << 20) - 1).contains(&p99),
            "{p99}"
        );
        assert_eq!([p50, p99], p.lock.write.side().wait.quantiles([0.5, 0.99]));
        assert_eq!(p.lock.causes[0].cause, "mprotect");
        assert_eq!(p.lock.causes[0].write.count, 14);
        // Two threads, the worker's latest role.
        assert_eq!(p.threads.len(), 2);
        assert_eq!(p.threads[0].role, Role::Libuv);
        assert_eq!(p.threads[0].lock.write.count, 12);
        assert_eq!(p.threads[1].role, Role::Addon);
        assert_eq!(
            (
                p.threads[1].role_addon.as_deref(),
                p.threads[1].role_library.as_deref()
            ),
            (Some("/app/a.node"), Some("/app/liba.so"))
        );
        assert_eq!(p.cgroup.as_deref(), Some("/app.slice/a.scope"));
        assert_eq!(p.exe.as_deref(), Some("/usr/bin/node"));
        assert_eq!((r.lost.nested, r.uncounted.fork_child), (5, 4));
    }

    /// The time shares of the lines add up: waits and times summed, the ratios of the sums.
    #[test]
    fn interval_lines_time_shares_add_up() {
        use crate::output::report::{RoleShare, TimeShare};
        let share = |wait_ns, alive_ns, cpu_ns: Option<u64>, threads| TimeShare {
            wait_ns,
            alive_ns,
            wall: wait_ns as f64 / alive_ns as f64,
            cpu_ns,
            cpu: cpu_ns.map(|c| wait_ns as f64 / c as f64),
            threads,
        };
        let mut lines = Vec::new();
        for (wait, cpu) in [(100, Some(400)), (300, None)] {
            let mut l = interval("2026-01-01T00:00:01.000Z", 100);
            let p = &mut l.processes[0];
            p.threads[1].time_share = Some(share(wait, 1000, cpu, None));
            p.time_share = Some(share(wait, 2000, cpu, Some(2)));
            p.time_share_by_role = Some(vec![RoleShare {
                role: Role::Worker,
                share: share(wait, 1000, cpu, Some(1)),
            }]);
            lines.push(l);
        }
        // A line from before time shares: nothing to add.
        lines.push(interval("2026-01-01T00:00:02.000Z", 100));
        let mut s = Summed::default();
        lines.iter().for_each(|l| s.add(l));
        let r = s.report();
        let p = &r.processes[0];
        let all = p.time_share.as_ref().unwrap();
        assert_eq!((all.wait_ns, all.alive_ns, all.wall), (400, 4000, 0.1));
        // Over CPU: only the line whose CPU time was known.
        assert_eq!(
            (all.cpu_ns, all.cpu, all.threads),
            (Some(400), Some(0.25), Some(2))
        );
        let w = &p.time_share_by_role.as_ref().unwrap()[0];
        assert_eq!(
            (w.role, w.share.wall, w.share.threads),
            (Role::Worker, 0.2, Some(1))
        );
        let t = p.threads.iter().find(|t| t.role == Role::Worker).unwrap();
        let ts = t.time_share.as_ref().unwrap();
        assert_eq!((ts.wait_ns, ts.alive_ns, ts.threads), (400, 2000, None));
        // A thread whose lines had no share has none.
        assert!(
            p.threads
                .iter()
                .any(|t| t.role == Role::Main && t.time_share.is_none())
        );
    }
}
