//! Which processes the agent profiles: selectors (command name, executable glob, cgroup
//! subtree, pid). The kernel matches them itself at every exec and fork (see
//! `kernel/selectors.rs`), so that a process is profiled from its first instruction; here,
//! a scan of /proc at start (and now and then, for what the kernel cannot see: a renamed
//! process, one moved to another cgroup, an executable glob it cannot match) selects the
//! processes already running, and the processes the kernel selected are labelled. The
//! result is the kernel's `SELECTED` map: the selection changes without reloading any
//! program.//!
//! Here the live selection (`Selection`: scans, adoptions, exits); the selectors themselves,
//! from the command line and `--config`, and what they match are `selectors.rs`.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
};

use crate::vocab::ids::{self, ProcId, stat_start_ticks};

mod selectors;
#[cfg(test)]
mod tests;

pub use selectors::{SelectionError, Selectors, cgroup_of, read_config};

/// What the agent knows of a selected process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selected {
    pub comm: String,
    pub cgroup: String,
    /// Its executable, as `/proc/PID/exe` says.
    pub exe: Option<String>,
}

/// The processes the selectors match, kept current by [`Selection::scan`].
#[derive(Default)]
pub struct Selection {
    pub selectors: Selectors,
    selected: BTreeMap<ProcId, Selected>,
    /// Processes seen not to match, with the name they had (re-checked when it changes:
    /// an exec keeps the pid and start time).
    rejected: BTreeMap<ProcId, String>,
    /// The selectors changed: the next scan checks the selected processes again too.
    recheck_selected: bool,
    /// Processes that left the selection at the last scan: their last interval is still to
    /// be labelled.
    departed: BTreeMap<ProcId, Selected>,
}

/// A scan's changes, for the kernel's map.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub added: Vec<ProcId>,
    pub removed: Vec<ProcId>,
}

impl Selection {
    pub fn new(selectors: Selectors) -> Self {
        Selection {
            selectors,
            ..Default::default()
        }
    }

    /// Replaces the selectors (SIGHUP); the next scan applies them to every process.
    pub fn reload(&mut self, selectors: Selectors) {
        self.selectors = selectors;
        self.rejected.clear();
        // The selected stay until the scan decides, so that nothing is removed and re-added
        // needlessly.
        self.recheck_selected = true;
    }

    pub fn get(&self, p: ProcId) -> Option<&Selected> {
        self.selected.get(&p).or_else(|| self.departed.get(&p))
    }

    pub fn len(&self) -> usize {
        self.selected.len()
    }

    /// How many selected processes each selector matches now, by its label.
    pub fn matches_by_selector(&self) -> Vec<(String, u64)> {
        let mut counts: Vec<(String, u64)> = (self.selectors.labels().into_iter())
            .map(|l| (l, 0))
            .collect();
        for (p, s) in &self.selected {
            let each = self
                .selectors
                .matches_each(p.pid, &s.comm, s.exe.as_deref(), &s.cgroup);
            for (c, m) in counts.iter_mut().zip(each) {
                c.1 += u64::from(m);
            }
        }
        counts
    }

    /// Looks at every process in /proc: new ones that match are added, exited ones removed.
    pub fn scan(&mut self) -> Changes {
        let mut seen = BTreeSet::new();
        let mut changes = Changes::default();
        self.departed.clear();
        let recheck = std::mem::take(&mut self.recheck_selected);
        for pid in proc_pids() {
            let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            let Some(start) = stat_start_ticks(&stat) else {
                continue;
            };
            let p = ProcId::new(pid, start);
            seen.insert(p);
            if !recheck && self.selected.contains_key(&p) {
                continue;
            }
            let comm = fs::read_to_string(format!("/proc/{pid}/comm"))
                .map(|c| c.trim_end().to_string())
                .unwrap_or_default();
            if self.rejected.get(&p) == Some(&comm) {
                continue;
            }
            let exe = fs::read_link(format!("/proc/{pid}/exe"))
                .ok()
                .map(|e| e.to_string_lossy().into_owned());
            let cgroup = cgroup_of(pid).unwrap_or_default();
            if self.selectors.matches(pid, &comm, exe.as_deref(), &cgroup) {
                self.rejected.remove(&p);
                let s = Selected { comm, cgroup, exe };
                if self.selected.insert(p, s).is_none() {
                    changes.added.push(p);
                }
            } else {
                self.rejected.insert(p, comm);
                if let Some(s) = self.selected.remove(&p) {
                    self.departed.insert(p, s);
                    changes.removed.push(p);
                }
            }
        }
        // Gone from /proc: exited (or their pid now names another process).
        let gone: Vec<ProcId> = self
            .selected
            .keys()
            .filter(|p| !seen.contains(p))
            .copied()
            .collect();
        for p in gone {
            if let Some(s) = self.selected.remove(&p) {
                self.departed.insert(p, s);
            }
            changes.removed.push(p);
        }
        self.rejected.retain(|p, _| seen.contains(p));
        changes
    }
}

impl Selection {
    /// Takes in the processes the kernel selected at exec or fork since the last call (the
    /// pids in its map the selection does not know), reading their labels while they live;
    /// returns them.
    pub fn adopt(&mut self, in_kernel: &[(u32, u64)]) -> Vec<ProcId> {
        let mut added = Vec::new();
        for &(pid, start) in in_kernel {
            let p = ProcId::new(pid, start);
            if self.selected.contains_key(&p) || !ids::is_alive(p) {
                continue;
            }
            let labels = labels_of(pid);
            // Gone while it was read: its labels come from the kernel's notices instead.
            if labels.cgroup.is_empty() && !ids::is_alive(p) {
                continue;
            }
            self.selected.insert(p, labels);
            added.push(p);
        }
        added
    }

    /// Drops the processes that have exited (their pid's start time changed, or it is
    /// gone); returns them.
    pub fn prune_exited(&mut self) -> Vec<ProcId> {
        let gone: Vec<ProcId> = self
            .selected
            .keys()
            .filter(|p| !ids::is_alive(**p))
            .copied()
            .collect();
        for p in &gone {
            if let Some(s) = self.selected.remove(p) {
                self.departed.insert(*p, s);
            }
        }
        gone
    }

    /// A selected process exec'd: its labels are its new image's (a container's node, not
    /// runc's init).
    pub fn relabel(&mut self, p: ProcId) {
        if let Some(s) = self.selected.get_mut(&p) {
            *s = labels_of(p.pid);
        }
    }

    /// Forgets the processes that left at the last reading (their last interval is
    /// labelled).
    pub fn clear_departed(&mut self) {
        self.departed.clear();
    }
}

/// A process's labels, read from /proc (neither takes its mmap_lock).
fn labels_of(pid: u32) -> Selected {
    Selected {
        comm: fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|c| c.trim_end().to_string())
            .unwrap_or_default(),
        cgroup: cgroup_of(pid).unwrap_or_default(),
        exe: fs::read_link(format!("/proc/{pid}/exe"))
            .ok()
            .map(|e| e.to_string_lossy().into_owned()),
    }
}

/// The numeric entries of /proc.
fn proc_pids() -> impl Iterator<Item = u32> {
    fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
}
