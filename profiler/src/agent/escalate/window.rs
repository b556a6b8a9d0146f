//! The crossing window's report: what a process's threads did over the agent's last
//! `--escalate-window` seconds, kept interval by interval for the processes that waited, so
//! that a capture can say what crossed the threshold (its findings), not only what followed.
//!
//! Each interval of a process that waited is kept with its threads merged by role (what the
//! findings read: writes by cause and role, time by role, who made whom wait), a few
//! kilobytes; intervals older than the window go, and so, past [`MAX_SLICES`], do the oldest
//! of the process that holds the most.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    time::{Duration, Instant, SystemTime},
};

use crate::{
    aggregation::{Attribution, SideStats, Window},
    output::{
        report::{
            self, CauseReport, Kind, LockReport, Meta, ProcessReport, Report, RoleBlock,
            SCHEMA_VERSION, Stats, ThreadReport,
        },
        share::{self, ShareSum},
    },
    registry::roles::Role,
    vocab::{Mode, ids::ProcId},
};

/// Intervals kept at most, over every process (a few kilobytes each): past it, the process
/// with the most loses its oldest.
pub const MAX_SLICES: usize = 4096;

/// A role's threads of one interval, merged.
#[derive(Default)]
struct RoleAgg {
    comm: String,
    write: SideStats,
    read: SideStats,
    downgrade: SideStats,
    causes: BTreeMap<String, SideStats>,
    time: Option<ShareSum>,
}

/// One interval of one process.
struct Slice {
    at: Instant,
    start: SystemTime,
    end: SystemTime,
    comm: String,
    cgroup: Option<String>,
    exe: Option<String>,
    roles: BTreeMap<Role, RoleAgg>,
    time: Option<ShareSum>,
    time_by_role: BTreeMap<Role, ShareSum>,
    blocked: Vec<RoleBlock>,
}

fn add_causes(to: &mut BTreeMap<String, SideStats>, causes: &[CauseReport]) {
    for c in causes {
        to.entry(c.cause.to_string())
            .or_default()
            .merge(&c.write.side());
    }
}

impl Slice {
    fn of(at: Instant, start: SystemTime, end: SystemTime, p: ProcessReport) -> Slice {
        let mut roles: BTreeMap<Role, RoleAgg> = BTreeMap::new();
        for t in &p.threads {
            let r = roles.entry(t.role).or_default();
            if r.comm.is_empty() {
                r.comm.clone_from(&t.comm);
            }
            r.write.merge(&t.lock.write.side());
            r.read.merge(&t.lock.read.side());
            r.downgrade.merge(&t.lock.downgrade.side());
            add_causes(&mut r.causes, &t.lock.causes);
            if let Some(s) = &t.time_share {
                r.time.get_or_insert_default().add_reported(s);
            }
        }
        let mut time_by_role = BTreeMap::new();
        for r in p.time_share_by_role.iter().flatten() {
            time_by_role
                .entry(r.role)
                .or_insert_with(ShareSum::default)
                .add_reported(&r.share);
        }
        Slice {
            at,
            start,
            end,
            comm: p.comm,
            cgroup: p.cgroup,
            exe: p.exe,
            roles,
            time: p.time_share.as_ref().map(|s| {
                let mut sum = ShareSum::default();
                sum.add_reported(s);
                sum
            }),
            time_by_role,
            blocked: p.blocked_by_role.unwrap_or_default(),
        }
    }
}

/// The kept intervals, by process.
pub struct Windows {
    window: Duration,
    by: HashMap<ProcId, VecDeque<Slice>>,
    slices: usize,
}

impl Windows {
    pub fn new(window: Duration) -> Self {
        Windows {
            window,
            by: HashMap::new(),
            slices: 0,
        }
    }

    /// Keeps the interval (`start`..`end`, read at `now`) of the processes in `keep` (those
    /// that waited in it), and forgets what is older than the window.
    pub fn observe(
        &mut self,
        now: Instant,
        (start, end, mode): (SystemTime, SystemTime, Mode),
        window: &Window,
        attribution: &Attribution,
        keep: &[ProcId],
    ) {
        let mut sub = Window::default();
        for p in keep {
            if let Some(threads) = window.processes.get(p) {
                sub.processes.insert(*p, threads.clone());
            }
        }
        if let Some(b) = &window.blocked {
            let mut blocked = crate::aggregation::blocked::Blocked {
                holder_comms: b.holder_comms.clone(),
                ..Default::default()
            };
            for p in keep {
                if let Some(pairs) = b.owners.get(p) {
                    blocked.owners.insert(*p, pairs.clone());
                }
            }
            sub.blocked = Some(blocked);
        }
        if !sub.processes.is_empty() {
            let meta = Meta {
                kind: Kind::Interval,
                mode,
                start,
                end,
                lost: Default::default(),
                uncounted: Default::default(),
                overhead: None,
            };
            let r = report::build(&sub, attribution, meta);
            for p in r.processes {
                let id = ProcId::new(p.pid, p.start_ticks);
                self.by
                    .entry(id)
                    .or_default()
                    .push_back(Slice::of(now, start, end, p));
                self.slices += 1;
            }
        }
        self.forget(now);
    }

    fn forget(&mut self, now: Instant) {
        let since = now.checked_sub(self.window);
        let mut gone = 0;
        self.by.retain(|_, v| {
            while v.front().is_some_and(|s| since.is_some_and(|t| s.at <= t)) {
                v.pop_front();
                gone += 1;
            }
            !v.is_empty()
        });
        self.slices -= gone;
        while self.slices > MAX_SLICES {
            let Some((_, v)) = self.by.iter_mut().max_by_key(|(_, v)| v.len()) else {
                break;
            };
            v.pop_front();
            self.slices -= 1;
        }
        self.by.retain(|_, v| !v.is_empty());
    }

    /// The intervals kept (for tests).
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.slices
    }

    /// Process `p`'s window as a one-process summary (`mode` as measured), its threads by
    /// role: what its findings are computed from. None when none of its intervals is kept.
    pub fn report(&self, p: ProcId, mode: Mode) -> Option<Report> {
        let slices = self.by.get(&p)?;
        let last = slices.back()?;
        let mut roles: BTreeMap<Role, RoleAgg> = BTreeMap::new();
        let mut time: Option<ShareSum> = None;
        let mut time_by_role: BTreeMap<Role, ShareSum> = BTreeMap::new();
        let mut blocked: BTreeMap<(Role, Role, String), RoleBlock> = BTreeMap::new();
        for s in slices {
            for (role, a) in &s.roles {
                let r = roles.entry(*role).or_default();
                if r.comm.is_empty() {
                    r.comm.clone_from(&a.comm);
                }
                r.write.merge(&a.write);
                r.read.merge(&a.read);
                r.downgrade.merge(&a.downgrade);
                for (c, st) in &a.causes {
                    r.causes.entry(c.clone()).or_default().merge(st);
                }
                if let Some(t) = a.time.and_then(|t| t.thread()) {
                    r.time.get_or_insert_default().add_reported(&t);
                }
            }
            if let Some(t) = s.time.and_then(|t| t.total()) {
                time.get_or_insert_default().add_reported(&t);
            }
            for (role, t) in &s.time_by_role {
                if let Some(t) = t.total() {
                    time_by_role.entry(*role).or_default().add_reported(&t);
                }
            }
            for b in &s.blocked {
                let e = blocked
                    .entry((b.waiter_role, b.holder_role, b.cause.to_string()))
                    .or_insert_with(|| RoleBlock {
                        wait_ns: 0,
                        write_wait_ns: 0,
                        ..b.clone()
                    });
                e.wait_ns += b.wait_ns;
                e.write_wait_ns += b.write_wait_ns;
            }
        }
        let (mut write, mut read, mut downgrade) = Default::default();
        let mut causes: BTreeMap<String, SideStats> = BTreeMap::new();
        let mut threads = Vec::new();
        for (i, (role, a)) in roles.iter().enumerate() {
            if *role != Role::Profiler {
                SideStats::merge(&mut write, &a.write);
                SideStats::merge(&mut read, &a.read);
                SideStats::merge(&mut downgrade, &a.downgrade);
                for (c, st) in &a.causes {
                    causes.entry(c.clone()).or_default().merge(st);
                }
            }
            threads.push(ThreadReport {
                // One row per role: no thread's id.
                tid: i as u32,
                role: *role,
                role_addon: None,
                role_library: None,
                comm: a.comm.clone(),
                pid: None,
                lock: lock_report(&a.write, &a.read, &a.downgrade, &a.causes),
                blocked_by: None,
                time_share: a.time.and_then(|t| t.thread()),
            });
        }
        threads.sort_by_key(|t| std::cmp::Reverse(t.lock.write.wait_ns.sum));
        let mut blocked: Vec<RoleBlock> = blocked.into_values().collect();
        blocked.sort_by_key(|b| std::cmp::Reverse(b.write_wait_ns));
        let process = ProcessReport {
            pid: p.pid,
            start_ticks: p.start,
            comm: last.comm.clone(),
            cgroup: last.cgroup.clone(),
            exe: last.exe.clone(),
            lock: lock_report(&write, &read, &downgrade, &causes),
            blocked_by_role: (!blocked.is_empty()).then_some(blocked),
            threads,
            time_share: time.and_then(|t| t.total()),
            time_share_by_role: share::by_role(&time_by_role),
            ..ProcessReport::default()
        };
        let first = slices.front()?;
        let secs = (last.end)
            .duration_since(first.start)
            .unwrap_or_default()
            .as_secs_f64();
        let mut r = Report {
            kind: Kind::Summary,
            schema_version: SCHEMA_VERSION,
            mode,
            start: report::rfc3339(first.start),
            end: report::rfc3339(last.end),
            interval_s: None,
            duration_s: Some((secs * 1000.0).round() / 1000.0),
            intervals: Some(slices.len() as u64),
            processes: vec![process],
            lost: Default::default(),
            uncounted: Default::default(),
            overhead: None,
            stack_sample: None,
            stack_work: None,
            findings: None,
            minor_processes: None,
            trigger: None,
            summed_lines: None,
            show_all: false,
        };
        r.drop_unmeasured();
        Some(r)
    }
}

fn lock_report(
    write: &SideStats,
    read: &SideStats,
    downgrade: &SideStats,
    causes: &BTreeMap<String, SideStats>,
) -> LockReport {
    let causes = causes
        .iter()
        .map(|(c, s)| CauseReport {
            cause: c.clone().into(),
            write: Stats::new(s),
        })
        .collect();
    LockReport::new(write, read, downgrade, causes)
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use profiler_common::{COMM_LEN, StatsKey, cause};

    use super::*;
    use crate::{
        aggregation::ThreadDelta,
        vocab::ids::{ThreadId, ticks_of_ns},
    };

    /// An interval in which process 10's threads 11 and 12 (Workers) each made `n` mprotects
    /// waiting 1 ms each, and its main thread one mmap; process 20 one mmap.
    fn interval(n: u64) -> Window {
        let mut w = Window::default();
        let mut comm = [0u8; COMM_LEN];
        comm[..4].copy_from_slice(b"node");
        for (owner, tid, kind, count, wait) in [
            (10, 10, cause::MMAP, 1, 500),
            (10, 11, cause::MPROTECT, n, 1_000_000),
            (10, 12, cause::MPROTECT, n, 1_000_000),
            (20, 20, cause::MMAP, 1, 500),
        ] {
            let mut s = SideStats {
                count,
                ..Default::default()
            };
            s.wait.sum = wait * count;
            s.wait.max = wait;
            s.wait.add(profiler_common::bucket_index(wait), count);
            w.add(&ThreadDelta {
                key: StatsKey {
                    owner,
                    tid,
                    kind,
                    _pad: 0,
                    owner_start: 0,
                    tid_start: 0,
                },
                tgid: owner,
                comm,
                fsbase: 0,
                stats: s,
            });
        }
        w
    }

    fn attribution() -> Attribution {
        let (p, q) = (ProcId::new(10, ticks_of_ns(0)), ProcId::new(20, 0));
        let t = |tid| ThreadId::new(tid, 0);
        Attribution::with(
            &[(p, "node"), (q, "other")],
            &[
                (p, t(10), Role::Main),
                (p, t(11), Role::Worker),
                (p, t(12), Role::Worker),
            ],
        )
    }

    #[test]
    fn a_window_is_its_intervals_by_role_and_forgets_what_is_older() {
        let mut w = Windows::new(Duration::from_secs(3));
        let t0 = Instant::now();
        let (p, q) = (ProcId::new(10, 0), ProcId::new(20, 0));
        let a = attribution();
        for s in 1..=5u64 {
            let at = t0 + Duration::from_secs(s);
            let (start, end) = (
                UNIX_EPOCH + Duration::from_secs(1000 + s - 1),
                UNIX_EPOCH + Duration::from_secs(1000 + s),
            );
            // Process 20 is not kept: it did not wait (as the escalator decides).
            w.observe(at, (start, end, Mode::Full), &interval(s), &a, &[p]);
        }
        // The last three intervals (3, 4, 5 s): 12 mprotects a Worker.
        assert_eq!(w.held(), 3);
        assert!(w.report(q, Mode::Full).is_none());
        let r = w.report(p, Mode::Full).unwrap();
        assert_eq!(
            (r.start.as_str(), r.end.as_str()),
            ("1970-01-01T00:16:42.000Z", "1970-01-01T00:16:45.000Z")
        );
        assert_eq!(r.intervals, Some(3));
        let proc = &r.processes[0];
        assert_eq!(proc.lock.write.count, 2 * 12 + 3);
        assert_eq!(proc.lock.write.wait_ns.sum, 24 * 1_000_000 + 1500);
        let workers: Vec<&ThreadReport> = proc
            .threads
            .iter()
            .filter(|t| t.role == Role::Worker)
            .collect();
        assert_eq!(workers.len(), 1, "one row per role");
        assert_eq!(workers[0].lock.causes[0].cause, "mprotect");
        assert_eq!(workers[0].lock.causes[0].write.count, 24);
        // Past the cap, the oldest of the process holding the most go.
        let mut small = Windows::new(Duration::from_secs(3600));
        for s in 1..=(MAX_SLICES as u64 + 5) {
            let at = t0 + Duration::from_millis(s);
            small.observe(
                at,
                (UNIX_EPOCH, UNIX_EPOCH, Mode::Full),
                &interval(1),
                &a,
                &[p, q],
            );
        }
        assert_eq!(small.held(), MAX_SLICES);
    }
}
