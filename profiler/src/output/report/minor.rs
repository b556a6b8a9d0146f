//! The processes a summary does not list one by one (`minor_processes`): those that did not
//! wait materially, past the few that waited longest (which are; findings/listing.rs
//! decides), grouped by command (and by executable) with their exact totals, so that a run of a thousand
//! short-lived processes stays a few kilobytes and its counts still add up: the listed
//! processes' plus the group's are the run's.

use std::collections::{BTreeMap, BTreeSet};

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
    /// Their read STATS merged, likewise (`compare`'s read columns). Empty from a build
    /// before it was kept.
    pub read: Stats,
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
        self.read = merged(&self.read, r);
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

/// One executable's processes in the group.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MinorExe {
    /// Absent for the processes whose executable could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exe: Option<String>,
    /// Their command names, in order.
    pub comms: Vec<String>,
    #[serde(flatten)]
    pub totals: MinorTotals,
}

/// The writes and reads of the group's threads of one role (their `threads[].write` and
/// `threads[].read` merged).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MinorRole {
    pub role: Role,
    pub write: Stats,
    /// Absent from a build before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read: Option<Stats>,
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
    /// By executable, most processes first (`compare --by exe`). Empty from a build before
    /// executables were reported, and in a group that such a build began (a file read back
    /// and grouped again): see [`MinorProcesses::exes_complete`].
    pub by_exe: Vec<MinorExe>,
    /// Their writes by thread role and by cause, for the group as a whole (not per command,
    /// to stay a few STATS per run): `compare --by run` adds them to the listed processes'.
    pub roles: Vec<MinorRole>,
    pub causes: Vec<MinorCause>,
}

impl MinorProcesses {
    /// Does `by_exe` cover every process of the group?
    pub fn exes_complete(&self) -> bool {
        self.by_exe.iter().map(|e| e.totals.processes).sum::<u64>() == self.totals.processes
    }

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
    let mut roles: BTreeMap<Role, (Stats, Option<Stats>)> = minor
        .roles
        .drain(..)
        .map(|r| (r.role, (r.write, r.read)))
        .collect();
    let mut causes: BTreeMap<String, Stats> =
        minor.causes.drain(..).map(|c| (c.cause, c.write)).collect();
    // Not begun by executable (an earlier build's group): not begun now, it would miss some.
    let keep_exes = minor.exes_complete();
    let mut by_exe: BTreeMap<Option<String>, (BTreeSet<String>, MinorTotals)> = minor
        .by_exe
        .drain(..)
        .map(|e| (e.exe, (e.comms.into_iter().collect(), e.totals)))
        .collect();
    r.processes.retain(|p| {
        if listed(p) {
            return true;
        }
        minor.totals.add(p);
        by_comm.entry(p.comm.clone()).or_default().add(p);
        if keep_exes {
            let (comms, totals) = by_exe.entry(p.exe.clone()).or_default();
            comms.insert(p.comm.clone());
            totals.add(p);
        }
        minor.max_writes = minor.max_writes.max(p.lock.write.count);
        minor.max_wait_ns = minor
            .max_wait_ns
            .max(p.lock.write.wait_ns.sum + p.lock.read.wait_ns.sum);
        minor.threads += p
            .thread_rows()
            .filter(|(t, _)| t.role != Role::Profiler)
            .map(|(_, n)| n)
            .sum::<u64>();
        minor.profiler_reads += p.profiler.as_ref().map_or(0, |o| o.read.count);
        minor.sampled_writes += p.dsos.iter().flatten().map(|d| d.write.count).sum::<u64>();
        for (t, _) in p.thread_rows() {
            let (write, read) = roles
                .entry(t.role)
                .or_insert_with(|| (Stats::default(), Some(Stats::default())));
            *write = merged(write, &t.lock.write);
            // (Kept only while every process of the role had it: not from an earlier group.)
            if let Some(read) = read {
                *read = merged(read, &t.lock.read);
            }
        }
        for c in &p.lock.causes {
            let into = causes.entry(c.cause.to_string()).or_default();
            *into = merged(into, &c.write);
        }
        false
    });
    minor.roles = roles
        .into_iter()
        .map(|(role, (write, read))| MinorRole { role, write, read })
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
    minor.by_exe = by_exe
        .into_iter()
        .map(|(exe, (comms, totals))| MinorExe {
            exe,
            comms: comms.into_iter().collect(),
            totals,
        })
        .collect();
    minor.by_exe.sort_by(|a, b| {
        (b.totals.processes, b.totals.writes, &a.exe).cmp(&(
            a.totals.processes,
            a.totals.writes,
            &b.exe,
        ))
    });
    r.minor_processes = (minor.totals.processes > 0).then_some(minor);
}

#[cfg(test)]
#[path = "minor_tests.rs"]
mod tests;
