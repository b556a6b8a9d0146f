//! The processes a summary does not list one by one (`minor_processes`): those that did not
//! wait materially, past the few that waited longest (which are; findings/listing.rs
//! decides), grouped by command with their exact totals, so that a run of a thousand
//! short-lived processes stays a few kilobytes and its counts still add up: the listed
//! processes' plus the group's are the run's.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{ProcessReport, Report, Stats};
use crate::{aggregation::SideStats, registry::roles::Role};

/// The totals of a set of processes (the group, or one command of it).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MinorTotals {
    pub processes: u64,
    /// Their write and read acquisitions (`write.count`, `read.count` summed).
    pub writes: u64,
    pub reads: u64,
    /// Their wait for their locks, write and read (`write.wait_ns.sum + read.wait_ns.sum`).
    pub wait_ns: u64,
    /// Of which the writes'.
    pub write_wait_ns: u64,
    /// Their own threads' wall time alive (their `time_share.alive_ns` summed; 0 from older
    /// builds): with `wait_ns`, their share of it spent waiting, together.
    pub alive_ns: u64,
    /// Their write STATS merged (counts added, histograms merged bucket by bucket; no
    /// `hold_ns`), so that `compare` sets the same mean and p99 beside the listed processes'
    /// as if each were listed. Empty from a build before it was kept.
    pub write: Stats,
}

/// `a` and `b` merged, as STATS of waits only: the group keeps no holds, which nothing reads
/// of it and which would double its size.
fn merged(a: &Stats, b: &Stats) -> Stats {
    let mut s: SideStats = a.side();
    s.merge(&b.side());
    let mut m = Stats::new(&s);
    m.hold_ns = None;
    m
}

impl MinorTotals {
    fn add(&mut self, p: &ProcessReport) {
        let (w, r) = (&p.lock.write, &p.lock.read);
        self.write = merged(&self.write, w);
        self.processes += 1;
        self.writes = self.writes.saturating_add(w.count);
        self.reads = self.reads.saturating_add(r.count);
        self.write_wait_ns = self.write_wait_ns.saturating_add(w.wait_ns.sum);
        self.wait_ns = self
            .wait_ns
            .saturating_add(w.wait_ns.sum.saturating_add(r.wait_ns.sum));
        self.alive_ns = self
            .alive_ns
            .saturating_add(p.time_share.as_ref().map_or(0, |s| s.alive_ns));
    }

    /// Their wait over their time alive, when known.
    pub fn share(&self) -> Option<f64> {
        (self.alive_ns > 0).then(|| self.wait_ns as f64 / self.alive_ns as f64)
    }
}

/// One command's processes in the group.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MinorComm {
    pub comm: String,
    #[serde(flatten)]
    pub totals: MinorTotals,
}

/// The writes of the group's threads of one role (their `threads[].write` merged).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MinorRole {
    pub role: Role,
    pub write: Stats,
}

/// The group's writes for one cause (their `causes[].write` merged).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MinorCause {
    pub cause: String,
    pub write: Stats,
}

/// The processes grouped (docs/report-format.md, "Minor processes").
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MinorProcesses {
    #[serde(flatten)]
    pub totals: MinorTotals,
    /// The most writes and the longest wait of any one of them.
    pub max_writes: u64,
    pub max_wait_ns: u64,
    /// Their threads that took a lock (the profiler's left out).
    pub threads: u64,
    /// The profiler's own read acquisitions of their locks (their `profiler.read.count`).
    pub profiler_reads: u64,
    /// Their sampled writes (the sum over their `dsos`): in a pprof profile of the run, not in
    /// the summary's `dsos`.
    pub sampled_writes: u64,
    /// By command name, most processes first.
    pub by_comm: Vec<MinorComm>,
    /// Their writes by thread role and by cause, for the group as a whole (not per command,
    /// to stay a few STATS per run): `compare --by run` adds them to the listed processes'.
    pub roles: Vec<MinorRole>,
    pub causes: Vec<MinorCause>,
}

impl MinorProcesses {
    /// The commands, most processes first, as `sh, esbuild, node` (the first `n`, then how
    /// many more).
    pub fn comms_text(&self, n: usize) -> String {
        let mut names: Vec<&str> = self
            .by_comm
            .iter()
            .take(n)
            .map(|c| c.comm.as_str())
            .collect();
        let more = self.by_comm.len().saturating_sub(n);
        let more = format!("{more} more");
        if self.by_comm.len() > n {
            names.push(&more);
        }
        names.join(", ")
    }
}

/// Moves the processes `listed` says no of out of `r.processes` into `r.minor_processes`
/// (absent when none is), keeping the others in their order.
pub fn group(r: &mut Report, mut listed: impl FnMut(&ProcessReport) -> bool) {
    let mut minor = r.minor_processes.take().unwrap_or_default();
    let mut by_comm: std::collections::BTreeMap<String, MinorTotals> = minor
        .by_comm
        .drain(..)
        .map(|c| (c.comm, c.totals))
        .collect();
    let mut roles: BTreeMap<Role, Stats> =
        minor.roles.drain(..).map(|r| (r.role, r.write)).collect();
    let mut causes: BTreeMap<String, Stats> =
        minor.causes.drain(..).map(|c| (c.cause, c.write)).collect();
    r.processes.retain(|p| {
        if listed(p) {
            return true;
        }
        minor.totals.add(p);
        by_comm.entry(p.comm.clone()).or_default().add(p);
        minor.max_writes = minor.max_writes.max(p.lock.write.count);
        minor.max_wait_ns = minor
            .max_wait_ns
            .max(p.lock.write.wait_ns.sum + p.lock.read.wait_ns.sum);
        minor.threads += p
            .threads
            .iter()
            .filter(|t| t.role != Role::Profiler)
            .count() as u64;
        minor.profiler_reads += p.profiler.as_ref().map_or(0, |o| o.read.count);
        minor.sampled_writes += p.dsos.iter().flatten().map(|d| d.write.count).sum::<u64>();
        for t in &p.threads {
            let into = roles.entry(t.role).or_default();
            *into = merged(into, &t.lock.write);
        }
        for c in &p.lock.causes {
            let into = causes.entry(c.cause.to_string()).or_default();
            *into = merged(into, &c.write);
        }
        false
    });
    minor.roles = roles
        .into_iter()
        .map(|(role, write)| MinorRole { role, write })
        .collect();
    minor.causes = causes
        .into_iter()
        .map(|(cause, write)| MinorCause { cause, write })
        .collect();
    minor.by_comm = by_comm
        .into_iter()
        .map(|(comm, totals)| MinorComm { comm, totals })
        .collect();
    minor.by_comm.sort_by(|a, b| {
        (b.totals.processes, b.totals.writes, &a.comm).cmp(&(
            a.totals.processes,
            a.totals.writes,
            &b.comm,
        ))
    });
    r.minor_processes = (minor.totals.processes > 0).then_some(minor);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::fixtures::{process, stats, summary};

    /// The STATS of `f` of each process merged, computed apart from `group`.
    fn merge_of<'a>(ps: impl IntoIterator<Item = &'a Stats>) -> SideStats {
        ps.into_iter().fold(SideStats::default(), |mut m, s| {
            m.merge(&s.side());
            m
        })
    }

    /// What `compare` reads of a STATS: count, wait sum and max, buckets, p99; and no hold.
    fn waits(s: &Stats) -> (u64, u64, u64, Vec<(u64, u64)>, u64, bool) {
        let d = &s.wait_ns;
        (
            s.count,
            d.sum,
            d.max,
            d.buckets.clone(),
            d.p99,
            s.hold_ns.is_some(),
        )
    }

    fn expect(m: &SideStats) -> (u64, u64, u64, Vec<(u64, u64)>, u64, bool) {
        let d = crate::output::report::Dist::new(&m.wait, m.count);
        (m.count, d.sum, d.max, d.buckets, d.p99, false)
    }

    #[test]
    fn the_group_keeps_its_writes_merged_per_command_role_and_cause() {
        // Waits in buckets that differ per process, so that the buckets and the p99 depend
        // on which processes were merged.
        let all: Vec<ProcessReport> = (1..=60u32)
            .map(|pid| {
                let comm = ["sh", "node"][pid as usize % 2];
                let slow = 1u64 << (10 + pid % 8);
                let mut p = process(pid, comm, 100 * u64::from(pid), false);
                p.lock.write = stats(10, 5 * 600 + 5 * slow, slow, &[(1024, 5), (2 * slow, 5)]);
                p.threads[1].lock.write = stats(5, 5 * slow, slow, &[(2 * slow, 5)]);
                p
            })
            .collect();
        let mut r = summary(all.clone());
        group(&mut r, |p| p.pid <= 5);
        let grouped: Vec<&ProcessReport> = all.iter().filter(|p| p.pid > 5).collect();
        let m = r.minor_processes.clone().unwrap();
        let whole = merge_of(grouped.iter().map(|p| &p.lock.write));
        assert_eq!(waits(&m.totals.write), expect(&whole));
        assert_eq!(m.totals.write.count, m.totals.writes);
        assert_eq!(m.totals.write.wait_ns.sum, m.totals.write_wait_ns);
        for c in &m.by_comm {
            let of = merge_of(
                grouped
                    .iter()
                    .filter(|p| p.comm == c.comm)
                    .map(|p| &p.lock.write),
            );
            assert_eq!(waits(&c.totals.write), expect(&of), "{}", c.comm);
        }
        // By role (main and worker, in the fixture) and by cause, for the group.
        let roles: Vec<Role> = m.roles.iter().map(|r| r.role).collect();
        assert_eq!(roles, [Role::Main, Role::Worker]);
        for mr in &m.roles {
            let of = merge_of(
                grouped
                    .iter()
                    .flat_map(|p| &p.threads)
                    .filter(|t| t.role == mr.role)
                    .map(|t| &t.lock.write),
            );
            assert_eq!(waits(&mr.write), expect(&of), "{:?}", mr.role);
        }
        let causes: Vec<&str> = m.causes.iter().map(|c| c.cause.as_str()).collect();
        assert_eq!(causes, ["mprotect", "munmap"]);
        for mc in &m.causes {
            let of = merge_of(
                grouped
                    .iter()
                    .flat_map(|p| &p.lock.causes)
                    .filter(|c| c.cause == mc.cause)
                    .map(|c| &c.write),
            );
            assert_eq!(waits(&mc.write), expect(&of), "{}", mc.cause);
        }
        // Grouped in two steps (a file read back and grouped again), the same.
        let mut twice = summary(all);
        group(&mut twice, |p| p.pid <= 30);
        group(&mut twice, |p| p.pid <= 5);
        assert_eq!(twice.minor_processes, r.minor_processes);
        // The JSON: STATS without holds, read back the same.
        let line = serde_json::to_string(&r).unwrap();
        let back: Report = serde_json::from_str(&line).unwrap();
        assert_eq!(back.minor_processes, r.minor_processes);
        let json: serde_json::Value = serde_json::from_str(&line).unwrap();
        let mp = &json["minor_processes"];
        assert!(mp["write"]["wait_ns"]["buckets"].is_array(), "{mp}");
        assert!(mp["write"].get("hold_ns").is_none(), "{mp}");
        assert_eq!(mp["roles"][1]["role"], "worker");
        assert_eq!(mp["causes"][0]["cause"], "mprotect");
        assert!(mp["by_comm"][0]["write"]["count"].is_u64(), "{mp}");
    }

    #[test]
    fn grouped_processes_keep_their_exact_totals_by_command() {
        let mut r = summary(
            (0..1000)
                .map(|i| {
                    let comm = ["sh", "esbuild", "node"][i % 3];
                    process(i as u32 + 1, comm, 1000 + i as u64, i % 2 == 0)
                })
                .collect(),
        );
        let total = |r: &Report| {
            let p = r.processes.iter().fold(MinorTotals::default(), |mut t, p| {
                t.add(p);
                t
            });
            let m = r.minor_processes.clone().unwrap_or_default().totals;
            (
                p.processes + m.processes,
                p.writes + m.writes,
                p.reads + m.reads,
                p.wait_ns + m.wait_ns,
                p.write_wait_ns + m.write_wait_ns,
            )
        };
        let before = total(&r);
        group(&mut r, |p| p.pid <= 7);
        assert_eq!(total(&r), before, "listed and grouped add up to the run");
        assert_eq!(r.processes.len(), 7);
        let m = r.minor_processes.as_ref().unwrap();
        assert_eq!(m.totals.processes, 993);
        // By command: their sums are the group's, most processes first.
        let sum = |f: fn(&MinorTotals) -> u64| m.by_comm.iter().map(|c| f(&c.totals)).sum::<u64>();
        assert_eq!(sum(|t| t.processes), 993);
        assert_eq!(sum(|t| t.writes), m.totals.writes);
        assert_eq!(sum(|t| t.wait_ns), m.totals.wait_ns);
        assert_eq!(sum(|t| t.reads), m.totals.reads);
        let comms: Vec<&str> = m.by_comm.iter().map(|c| c.comm.as_str()).collect();
        assert_eq!(
            comms,
            ["esbuild", "node", "sh"],
            "331 each, as many writes: by name"
        );
        assert_eq!(m.comms_text(2), "esbuild, node, 1 more");
        // The fixture's processes: 10 writes, 2 threads, the wait given plus 10 ns of reads.
        assert_eq!((m.max_writes, m.threads), (10, 993 * 2));
        assert_eq!(m.max_wait_ns, 1999 + 10);
        // Grouping again (a file read back) adds to what is there.
        group(&mut r, |p| p.pid <= 3);
        assert_eq!(total(&r), before);
        assert_eq!(r.minor_processes.as_ref().unwrap().totals.processes, 997);
        // Read back from its JSON, the same.
        let line = serde_json::to_string(&r).unwrap();
        assert!(
            line.contains(r#""minor_processes":{"processes":997,"#),
            "{line}"
        );
        let back: Report = serde_json::from_str(&line).unwrap();
        assert_eq!(back.minor_processes, r.minor_processes);
        // Nothing to group: no group.
        let mut few = summary(vec![process(1, "node", 5, false)]);
        group(&mut few, |_| true);
        assert!(few.minor_processes.is_none());
        assert!(
            !serde_json::to_string(&few)
                .unwrap()
                .contains("minor_processes")
        );
    }
}
