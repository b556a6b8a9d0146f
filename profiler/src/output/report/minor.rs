//! The processes a summary does not list one by one (`minor_processes`): those that did not
//! wait materially, past the few that waited longest (which are; findings/listing.rs
//! decides), grouped by command with their exact totals, so that a run of a thousand
//! short-lived processes stays a few kilobytes and its counts still add up: the listed
//! processes' plus the group's are the run's.

use serde::{Deserialize, Serialize};

use super::{ProcessReport, Report};

/// The totals of a set of processes (the group, or one command of it).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
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
}

impl MinorTotals {
    fn add(&mut self, p: &ProcessReport) {
        let (w, r) = (&p.lock.write, &p.lock.read);
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
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct MinorComm {
    pub comm: String,
    #[serde(flatten)]
    pub totals: MinorTotals,
}

/// The processes grouped (docs/report-format.md, "Minor processes").
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
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
            .filter(|t| t.role != crate::registry::roles::Role::Profiler)
            .count() as u64;
        minor.profiler_reads += p.profiler.as_ref().map_or(0, |o| o.read.count);
        minor.sampled_writes += p.dsos.iter().flatten().map(|d| d.write.count).sum::<u64>();
        false
    });
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
    use crate::output::fixtures::{process, summary};

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
