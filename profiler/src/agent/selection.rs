//! Which processes the agent profiles: selectors (command name, executable glob, cgroup
//! subtree, pid). The kernel matches them itself at every exec and fork (see
//! `kernel/selectors.rs`), so that a process is profiled from its first instruction; here,
//! a scan of /proc at start (and now and then, for what the kernel cannot see: a renamed
//! process, one moved to another cgroup, an executable glob it cannot match) selects the
//! processes already running, and the processes the kernel selected are labelled. The
//! result is the kernel's `SELECTED` map: the selection changes without reloading any
//! program.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

use crate::{
    kernel::selectors::{KernelSelectors, cgroup_selector, comm_key, exe_selector},
    registry::ids::{self, ProcId, stat_start_ticks},
};

#[derive(Debug, thiserror::Error)]
pub enum SelectionError {
    #[error("cannot read {0}: {1}")]
    Read(PathBuf, std::io::Error),
    #[error("{path}:{line}: {what}")]
    Syntax {
        path: PathBuf,
        line: usize,
        what: String,
    },
}

/// What to profile. Empty: every process whose executable is node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selectors {
    pub comms: Vec<String>,
    pub exes: Vec<String>,
    pub cgroups: Vec<String>,
    pub pids: Vec<u32>,
}

impl Selectors {
    /// Adds the selectors of a config file: one per line, `comm NAME`, `exe GLOB`,
    /// `cgroup PATH` or `pid PID`; blank lines and `#` comments are skipped.
    pub fn add_file(&mut self, path: &Path) -> Result<(), SelectionError> {
        let text = fs::read_to_string(path).map_err(|e| SelectionError::Read(path.into(), e))?;
        self.add_text(&text)
            .map_err(|(line, what)| SelectionError::Syntax {
                path: path.into(),
                line,
                what,
            })
    }

    fn add_text(&mut self, text: &str) -> Result<(), (usize, String)> {
        for (i, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let (kind, value) = line
                .split_once(char::is_whitespace)
                .map(|(k, v)| (k, v.trim()))
                .ok_or((i + 1, format!("expected `KIND VALUE`, got {line:?}")))?;
            match kind {
                "comm" => self.comms.push(value.to_string()),
                "exe" => {
                    glob::Pattern::new(value).map_err(|e| (i + 1, format!("bad glob: {e}")))?;
                    self.exes.push(value.to_string());
                }
                "cgroup" if value.starts_with('/') => {
                    self.cgroups.push(value.trim_end_matches('/').to_string())
                }
                "pid" => self.pids.push(
                    value
                        .parse()
                        .map_err(|_| (i + 1, format!("bad pid {value:?}")))?,
                ),
                _ => return Err((i + 1, format!("unknown selector {line:?}"))),
            }
        }
        Ok(())
    }

    fn is_default(&self) -> bool {
        self.comms.is_empty()
            && self.exes.is_empty()
            && self.cgroups.is_empty()
            && self.pids.is_empty()
    }

    /// What the kernel matches at exec and fork (no selector: executables named `node`), and
    /// whether that is all of it (else an executable glob it cannot match, or a cgroup that
    /// does not exist yet, is left to the scans).
    pub fn kernel(&self) -> (KernelSelectors, bool) {
        let mut k = KernelSelectors::default();
        let mut complete = true;
        let exes: Vec<&str> = if self.is_default() {
            vec!["node"]
        } else {
            self.exes.iter().map(String::as_str).collect()
        };
        for e in exes {
            match exe_selector(e) {
                Some(sel) => k.exes.push(sel),
                None => complete = false,
            }
        }
        for c in &self.comms {
            match comm_key(c) {
                Some(key) => k.comms.push(key),
                None => complete = false,
            }
        }
        for c in &self.cgroups {
            match cgroup_selector(c) {
                Ok(sel) => k.cgroups.push(sel),
                Err(_) => complete = false,
            }
        }
        (k, complete)
    }

    /// Was a process selected by a rule (comm, executable, cgroup), not by its pid? Its
    /// children are then selected too, and a later exec decides again.
    pub fn by_rule(&self, pid: u32) -> bool {
        !self.pids.contains(&pid)
    }

    /// Does a process with this name, executable and cgroup match?
    pub fn matches(&self, pid: u32, comm: &str, exe: Option<&str>, cgroup: &str) -> bool {
        if self.is_default() {
            return exe.is_some_and(|e| basename(e) == "node");
        }
        self.pids.contains(&pid)
            || self.comms.iter().any(|c| c == comm)
            || exe.is_some_and(|e| {
                self.exes.iter().any(|g| {
                    glob::Pattern::new(g).is_ok_and(|p| p.matches(e) || p.matches(basename(e)))
                })
            })
            || self.cgroups.iter().any(|c| in_subtree(cgroup, c))
    }
}

fn basename(path: &str) -> &str {
    // A replaced binary reads as "/usr/bin/node (deleted)".
    let path = path.strip_suffix(" (deleted)").unwrap_or(path);
    path.rsplit('/').next().unwrap_or(path)
}

/// Is `cgroup` the subtree root `root` or below it (component-wise)?
fn in_subtree(cgroup: &str, root: &str) -> bool {
    root == "/"
        || cgroup == root
        || cgroup
            .strip_prefix(root)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// The cgroup v2 path of a process (`0::/system.slice/api.service`).
pub fn cgroup_of(pid: u32) -> Option<String> {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::to_string)
}

/// What the agent knows of a selected process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selected {
    pub comm: String,
    pub cgroup: String,
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
                if self.selected.insert(p, Selected { comm, cgroup }).is_none() {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_selects_node_executables_only() {
        let s = Selectors::default();
        assert!(s.matches(1, "node", Some("/usr/bin/node"), "/"));
        assert!(s.matches(
            1,
            "MainThread",
            Some("/opt/node-v20/bin/node (deleted)"),
            "/"
        ));
        assert!(!s.matches(1, "node", Some("/usr/bin/nodejs-helper"), "/"));
        assert!(!s.matches(1, "node", None, "/"));
    }

    #[test]
    fn selectors_by_name_exe_cgroup_and_pid() {
        let s = Selectors {
            comms: vec!["api".into()],
            exes: vec!["*/bin/deno".into()],
            cgroups: vec!["/system.slice/web.service".into()],
            pids: vec![42],
        };
        assert!(s.matches(7, "api", None, "/"));
        assert!(s.matches(7, "x", Some("/usr/local/bin/deno"), "/"));
        assert!(s.matches(7, "x", None, "/system.slice/web.service"));
        assert!(s.matches(7, "x", None, "/system.slice/web.service/worker"));
        assert!(!s.matches(7, "x", None, "/system.slice/web.service2"));
        assert!(s.matches(42, "x", None, "/"));
        assert!(!s.matches(7, "node", Some("/usr/bin/node"), "/"));
    }

    #[test]
    fn config_files_name_the_bad_line() {
        let mut s = Selectors::default();
        s.add_text("# node services\ncomm node\nexe */bin/node  # any\n\ncgroup /a/b/\npid 12\n")
            .unwrap();
        assert_eq!(s.comms, vec!["node"]);
        assert_eq!(s.exes, vec!["*/bin/node"]);
        assert_eq!(s.cgroups, vec!["/a/b"]);
        assert_eq!(s.pids, vec![12]);
        assert_eq!(s.add_text("comm x\nbogus 1\n").unwrap_err().0, 2);
        assert_eq!(s.add_text("pid x\n").unwrap_err().0, 1);
        assert_eq!(s.add_text("cgroup relative\n").unwrap_err().0, 1);
    }

    #[test]
    fn a_scan_finds_this_process_by_pid_and_forgets_it_when_deselected() {
        let me = std::process::id();
        let mut sel = Selection::new(Selectors {
            pids: vec![me],
            ..Default::default()
        });
        let c = sel.scan();
        assert_eq!(c.added.len(), 1, "{c:?}");
        assert_eq!(c.added[0].pid, me);
        assert!(sel.scan().added.is_empty(), "found once");
        sel.reload(Selectors {
            comms: vec!["no-such-comm-xyz".into()],
            ..Default::default()
        });
        let c = sel.scan();
        assert_eq!(c.removed.len(), 1);
        assert_eq!(sel.len(), 0);
    }
}
