//! How `compare` groups a run's processes (`--by`): by executable, command name, cgroup, or
//! the whole run. Two runs of one tool line up only if its processes are grouped by what stays
//! the same between them: a run whose Worker threads live in one process renamed by
//! `process.title` has no process name in common with a run of child processes. A group's
//! figures are exact sums over its processes (counts, wait sums, merged histograms),
//! those the summary lists and those it grouped by command (`minor_processes`) alike.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::{
    aggregation::{DurationHist, SideStats},
    output::{
        compare_findings::{self, RunFindings},
        report::{MinorProcesses, MinorTotals, ProcessReport, Report, Stats},
    },
};

/// What processes are grouped by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum By {
    /// The executable's path.
    Exe,
    /// The command name (`comm`), as `compare` grouped before `--by` existed.
    Comm,
    /// The cgroup (v2 path).
    Cgroup,
    /// All of a run's processes together: the default, since it lines up whatever the
    /// processes are called and however the work is split between them.
    #[default]
    Run,
}

/// The one group of `--by run`.
pub const RUN: &str = "run";

impl By {
    /// The values `--by` takes, as written.
    pub const NAMES: [&'static str; 4] = ["exe", "comm", "cgroup", "run"];

    pub fn name(self) -> &'static str {
        match self {
            By::Exe => "exe",
            By::Comm => "comm",
            By::Cgroup => "cgroup",
            By::Run => "run",
        }
    }

    pub fn parse(s: &str) -> Option<By> {
        [By::Exe, By::Comm, By::Cgroup, By::Run]
            .into_iter()
            .find(|b| b.name() == s)
    }

    /// A process's group; None when its report does not say.
    fn of(self, p: &ProcessReport) -> Option<String> {
        match self {
            By::Comm => Some(p.comm.clone()),
            By::Cgroup => p.cgroup.clone(),
            By::Exe => p.exe.clone(),
            By::Run => Some(RUN.into()),
        }
    }

    /// What a group is named after, in words.
    pub fn what(self) -> &'static str {
        match self {
            By::Exe => "executable",
            By::Comm => "command name",
            By::Cgroup => "cgroup",
            By::Run => "run",
        }
    }

    /// The group of the processes whose report does not say theirs.
    fn unknown(self) -> String {
        format!("({} unknown)", self.what())
    }

    /// The one group of a summary's grouped processes (`minor_processes`): the run, or, where
    /// their key is not kept (their cgroups; their executables, by an earlier build), a group
    /// of their own. None: each in its own key's group, by command or by executable.
    fn grouped(self, m: &MinorProcesses) -> Option<String> {
        match self {
            By::Comm => None,
            By::Exe if m.exes_complete() => None,
            By::Run => Some(RUN.into()),
            By::Cgroup | By::Exe => Some(self.not_kept()),
        }
    }

    /// The group of grouped processes whose key a summary does not keep.
    fn not_kept(self) -> String {
        format!("(grouped: {} not kept)", self.what())
    }
}

/// Acquisitions of one side (write or read) of one group in one run: the figures are its
/// count, its total and mean wait, and its p99
/// ([`DurationHist::quantiles`](crate::aggregation::DurationHist), as everywhere else).
pub type Fig = SideStats;

/// A row's acquisitions in one run: its writes and its reads (none for a cause's row: causes
/// are the writes').
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Figs {
    pub write: Fig,
    pub read: Fig,
}

/// (group, `all`|`role`|`cause`, the role or cause).
pub type Key = (String, &'static str, String);

/// One group's processes in one run.
#[derive(Clone, Debug, Default)]
pub struct RunMembers {
    pub processes: u64,
    pub comms: BTreeSet<String>,
}

/// One run, its processes grouped.
#[derive(Clone)]
pub struct Grouped {
    pub figures: BTreeMap<Key, Figs>,
    pub members: BTreeMap<String, RunMembers>,
    /// Listed processes whose report does not say their group (in the group `By::unknown`).
    pub unknown: u64,
    /// Processes the summary grouped by command (`minor_processes`), in the groups too.
    pub grouped: u64,
    /// Of those, how many are in their own command's or executable's group (its `all` row,
    /// not its role and cause rows), and how many in the group of those whose key is not kept.
    pub grouped_own: u64,
    pub grouped_apart: u64,
    /// Of those, how many come without their write STATS (a summary of a build before they
    /// were kept): their writes and wait are counted, not in any histogram (p99), role or
    /// cause.
    pub grouped_without_stats: u64,
    pub findings: RunFindings,
}

impl Grouped {
    pub fn of(summary: &Report, by: By) -> Grouped {
        let mut g = Grouped {
            figures: BTreeMap::new(),
            members: BTreeMap::new(),
            unknown: 0,
            grouped: 0,
            grouped_own: 0,
            grouped_apart: 0,
            grouped_without_stats: 0,
            findings: RunFindings::new(),
        };
        let mut group_of_pid = BTreeMap::new();
        for p in &summary.processes {
            let group = by.of(p).unwrap_or_else(|| {
                g.unknown += 1;
                by.unknown()
            });
            let m = g.members.entry(group.clone()).or_default();
            m.processes += 1;
            m.comms.insert(p.comm.clone());
            let mut add = |kind, key: String, write: &Stats, read: Option<&Stats>| {
                let f = g.figures.entry((group.clone(), kind, key)).or_default();
                f.write.merge(&write.side());
                if let Some(r) = read {
                    f.read.merge(&r.side());
                }
            };
            add("all", "all".into(), &p.lock.write, Some(&p.lock.read));
            for (t, _) in p.thread_rows() {
                add(
                    "role",
                    t.role.as_str().into(),
                    &t.lock.write,
                    Some(&t.lock.read),
                );
            }
            for c in &p.lock.causes {
                add("cause", c.cause.to_string(), &c.write, None);
            }
            group_of_pid.entry(p.pid).or_insert(group);
        }
        if let Some(m) = &summary.minor_processes {
            g.add_grouped(m, by);
        }
        // A finding is of a process: of its group (one the summary does not list, of its name
        // or its run where that is the grouping).
        g.findings = compare_findings::per_run(summary, &|f| {
            group_of_pid
                .get(&f.pid)
                .cloned()
                .or_else(|| match by {
                    By::Comm => Some(f.comm.clone()),
                    By::Run => Some(RUN.into()),
                    By::Exe | By::Cgroup => None,
                })
                .unwrap_or_else(|| by.unknown())
        });
        g
    }

    /// Processes in all.
    pub fn processes(&self) -> u64 {
        self.members.values().map(|m| m.processes).sum()
    }

    fn add(&mut self, group: &str, kind: &'static str, key: &str, write: &Fig, read: &Fig) {
        let f = self
            .figures
            .entry((group.to_string(), kind, key.to_string()))
            .or_default();
        f.write.merge(write);
        f.read.merge(read);
    }

    /// The processes the summary grouped: each command's (or executable's) in its group
    /// (`By::grouped`), its count, names and writes; the group's roles and causes where all
    /// of them are in one group (not by command or executable: a summary keeps those for the
    /// group as a whole).
    fn add_grouped(&mut self, m: &MinorProcesses, by: By) {
        let whole = by.grouped(m);
        let entries: Vec<(String, &[String], &MinorTotals)> = match &whole {
            None if by == By::Exe => m
                .by_exe
                .iter()
                .map(|e| {
                    let group = e.exe.clone().unwrap_or_else(|| by.unknown());
                    (group, e.comms.as_slice(), &e.totals)
                })
                .collect(),
            _ => m
                .by_comm
                .iter()
                .map(|c| {
                    let group = whole.clone().unwrap_or_else(|| c.comm.clone());
                    (group, std::slice::from_ref(&c.comm), &c.totals)
                })
                .collect(),
        };
        for (group, comms, t) in entries {
            let members = self.members.entry(group.clone()).or_default();
            members.processes += t.processes;
            members.comms.extend(comms.iter().cloned());
            self.grouped += t.processes;
            match &whole {
                None => self.grouped_own += t.processes,
                Some(g) if g != RUN => self.grouped_apart += t.processes,
                Some(_) => {}
            }
            // No STATS (an earlier build's summary): the counts and wait sums, which were
            // always kept, and no histogram.
            let bare = |count: u64, wait: u64| Fig {
                count,
                wait: DurationHist::from_upper_bounds(wait, 0, []),
                ..Fig::default()
            };
            let write = if t.write.count == t.writes {
                t.write.side()
            } else {
                self.grouped_without_stats += t.processes;
                bare(t.writes, t.write_wait_ns)
            };
            let read = if t.read.count == t.reads {
                t.read.side()
            } else {
                bare(t.reads, t.wait_ns.saturating_sub(t.write_wait_ns))
            };
            self.add(&group, "all", "all", &write, &read);
        }
        if let Some(group) = whole {
            for r in &m.roles {
                let read = r.read.as_ref().map(Stats::side).unwrap_or_default();
                self.add(&group, "role", r.role.as_str(), &r.write.side(), &read);
            }
            for c in &m.causes {
                self.add(&group, "cause", &c.cause, &c.write.side(), &Fig::default());
            }
        }
    }
}

/// What a side's figures leave out of the processes its summaries grouped by command, or
/// where they put them, in words.
pub(super) fn notes(by: By, (file, runs): (&str, &[super::Run])) -> Vec<String> {
    let count = |f: fn(&Grouped) -> u64| runs.iter().map(|r| f(&r.grouped)).sum::<u64>();
    let mut out = Vec::new();
    if count(|g| g.grouped) == 0 {
        return out;
    }
    let without = count(|g| g.grouped_without_stats);
    if without > 0 {
        out.push(format!(
            "{file}: {without} grouped processes (minor_processes) come without their histograms (a summary of an earlier build): their writes and wait are counted, not in the p99s nor in the role and cause rows"
        ));
    }
    // (Command or executable: the key they are grouped by, as a summary keeps it.)
    let key = if by == By::Exe {
        "executable"
    } else {
        "command"
    };
    if count(|g| g.grouped_own) > 0 {
        out.push(format!(
            "{file}: its grouped processes (minor_processes) are in their {key}'s processes and `all` row, not in its role and cause rows (a summary keeps their roles and causes for the run, not per {key}: --by run has them)"
        ));
    }
    if count(|g| g.grouped_apart) > 0 {
        let summary = if by == By::Exe {
            "a summary of a build before executables were reported"
        } else {
            "a summary"
        };
        out.push(format!(
            "{file}: its grouped processes (minor_processes) are the group {}: {summary} groups them by command only",
            by.not_kept()
        ));
    }
    out
}

#[cfg(test)]
#[path = "group_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "grouped_tests.rs"]
mod grouped_tests;
