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
    cli,
    kernel::selectors::{KernelSelectors, cgroup_selector, comm_key, exe_selector},
    vocab::ids::{self, ProcId, stat_start_ticks},
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

/// The largest `--config` file read (an operator's file; a few selectors a line each).
const MAX_CONFIG_BYTES: u64 = 1 << 20;

impl Selectors {
    /// Adds the selectors of a config file: one per line, `comm NAME`, `exe GLOB`,
    /// `cgroup PATH` or `pid PID`; blank lines and `#` comments are skipped. Each value is
    /// checked as on the command line (`cli::parse_*`).
    pub fn add_file(&mut self, path: &Path) -> Result<(), SelectionError> {
        let read = || -> std::io::Result<String> {
            let f = fs::File::open(path)?;
            if f.metadata()?.len() > MAX_CONFIG_BYTES {
                return Err(std::io::Error::other(format!(
                    "larger than {MAX_CONFIG_BYTES} bytes: not a selection"
                )));
            }
            std::io::read_to_string(f)
        };
        let text = read().map_err(|e| SelectionError::Read(path.into(), e))?;
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
            let bad = |what: String| (i + 1, format!("{kind}: {what}"));
            match kind {
                "comm" => self.comms.push(cli::parse_comm(value).map_err(bad)?),
                "exe" => self.exes.push(cli::parse_glob(value).map_err(bad)?),
                "cgroup" => self.cgroups.push(cli::parse_cgroup(value).map_err(bad)?),
                "pid" => self.pids.push(cli::parse_pid(value).map_err(bad)?),
                _ => {
                    return Err((
                        i + 1,
                        format!("unknown selector {kind:?} (comm, exe, cgroup or pid)"),
                    ));
                }
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

    /// Each selector as written (`comm node`, `cgroup /a`; the default selection is
    /// `exe node`), in the order [`Selectors::matches_each`] answers for them: the
    /// `selector` label of `mmaplock_selector_matches`, bounded by what the operator wrote.
    pub fn labels(&self) -> Vec<String> {
        if self.is_default() {
            return vec!["exe node".into()];
        }
        let each = |kind: &str, v: &[String]| -> Vec<String> {
            v.iter().map(|x| format!("{kind} {x}")).collect()
        };
        let pids: Vec<String> = self.pids.iter().map(u32::to_string).collect();
        [
            each("comm", &self.comms),
            each("exe", &self.exes),
            each("cgroup", &self.cgroups),
            each("pid", &pids),
        ]
        .concat()
    }

    /// Whether each selector (in the order of [`Selectors::labels`]) matches a process with
    /// this name, executable and cgroup.
    pub fn matches_each(&self, pid: u32, comm: &str, exe: Option<&str>, cgroup: &str) -> Vec<bool> {
        if self.is_default() {
            return vec![exe.is_some_and(|e| basename(e) == "node")];
        }
        let exe_matches = |g: &String| {
            exe.is_some_and(|e| {
                glob::Pattern::new(g).is_ok_and(|p| p.matches(e) || p.matches(basename(e)))
            })
        };
        (self.comms.iter().map(|c| c == comm))
            .chain(self.exes.iter().map(exe_matches))
            .chain(self.cgroups.iter().map(|c| in_subtree(cgroup, c)))
            .chain(self.pids.iter().map(|&p| p == pid))
            .collect()
    }

    /// Does a process with this name, executable and cgroup match?
    pub fn matches(&self, pid: u32, comm: &str, exe: Option<&str>, cgroup: &str) -> bool {
        self.matches_each(pid, comm, exe, cgroup)
            .into_iter()
            .any(|m| m)
    }

    /// What is probably a mistake though valid: a `--cgroup` that does not exist (now), or
    /// that is written with the cgroup file system's mount point. One line each.
    pub fn warnings(&self) -> Vec<String> {
        let mounts = cgroup2_mounts();
        let mut out = Vec::new();
        for c in &self.cgroups {
            if let Some(rest) = mounts
                .iter()
                .chain([&PathBuf::from("/sys/fs/cgroup")])
                .find_map(|m| Path::new(c).strip_prefix(m).ok())
            {
                out.push(format!(
                    "--cgroup {c}: a cgroup is written as /proc/PID/cgroup shows it, without the cgroup file system's mount point: --cgroup /{}",
                    rest.display()
                ));
            } else if !mounts.is_empty()
                && !mounts
                    .iter()
                    .any(|m| m.join(c.trim_start_matches('/')).is_dir())
            {
                out.push(format!(
                    "--cgroup {c}: no such cgroup now (under {}); it selects nothing until it is created",
                    mounts[0].display()
                ));
            }
        }
        out
    }
}

/// Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on
/// a hybrid host), from our mountinfo.
fn cgroup2_mounts() -> Vec<PathBuf> {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let mount = left.split_whitespace().nth(4)?;
            (right.split_whitespace().next()? == "cgroup2").then(|| PathBuf::from(mount))
        })
        .collect()
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
        // Each value as the command line checks it, with the same words.
        for (line, needle) in [
            ("cgroup relative/path", "a cgroup v2 path is absolute"),
            (
                "comm sixteen-bytes-xx",
                "longer than the 15 the kernel keeps",
            ),
            ("pid 2", "kernel thread"),
            ("pid 0", "not a process id"),
            ("exe [", "not a glob"),
            ("bogus 1", "unknown selector \"bogus\""),
        ] {
            let (n, what) = s.add_text(line).unwrap_err();
            assert_eq!(n, 1);
            assert!(what.contains(needle), "{line}: {what}");
        }
    }

    #[test]
    fn cgroups_with_the_mount_point_or_not_there_are_warned_about() {
        let Some(mount) = cgroup2_mounts().into_iter().next() else {
            return;
        };
        let s = Selectors {
            cgroups: vec![
                format!("{}/system.slice/x.service", mount.display()),
                "/no-such-cgroup-mlp".into(),
                "/".into(),
            ],
            ..Default::default()
        };
        let w = s.warnings();
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(
            w[0].ends_with("--cgroup /system.slice/x.service"),
            "{}",
            w[0]
        );
        assert!(w[1].contains("no such cgroup now"), "{}", w[1]);
    }

    #[test]
    fn each_selector_is_counted_apart() {
        let s = Selectors {
            comms: vec!["api".into()],
            pids: vec![7],
            ..Default::default()
        };
        assert_eq!(s.labels(), ["comm api", "pid 7"]);
        assert_eq!(s.matches_each(7, "api", None, "/"), [true, true]);
        assert_eq!(s.matches_each(8, "api", None, "/"), [true, false]);
        assert_eq!(Selectors::default().labels(), ["exe node"]);
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
