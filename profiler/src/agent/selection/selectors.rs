//! The agent's selectors: read from the command line and `--config` files (each value checked
//! as the CLI checks it), what they match in a process (name, executable, cgroup, pid), and
//! their form for the kernel, which matches them itself at every exec and fork.

use std::{
    fs,
    path::{Path, PathBuf},
};

use crate::{
    cli,
    kernel::selectors::{KernelSelectors, cgroup_selector, comm_key, exe_selector, exec_name},
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

/// A `--config` file's text (bounded: an operator's file of a few lines).
pub fn read_config(path: &Path) -> Result<String, SelectionError> {
    let read = || -> std::io::Result<String> {
        let f = fs::File::open(path)?;
        if f.metadata()?.len() > MAX_CONFIG_BYTES {
            return Err(std::io::Error::other(format!(
                "larger than {MAX_CONFIG_BYTES} bytes: not a selection"
            )));
        }
        std::io::read_to_string(f)
    };
    read().map_err(|e| SelectionError::Read(path.into(), e))
}

impl Selectors {
    /// Adds the selectors of a config file: one per line, `comm NAME`, `exe GLOB`,
    /// `cgroup PATH` or `pid PID`; blank lines and `#` comments are skipped. Each value is
    /// checked as on the command line (`cli::parse_*`).
    pub fn add_file(&mut self, path: &Path) -> Result<(), SelectionError> {
        let text = read_config(path)?;
        self.add_text(&text)
            .map_err(|(line, what)| SelectionError::Syntax {
                path: path.into(),
                line,
                what,
            })
    }

    pub(super) fn add_text(&mut self, text: &str) -> Result<(), (usize, String)> {
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
                // The push settings' lines, read by agent/push/settings.rs.
                k if crate::agent::push::settings::KEYS.contains(&k) => {}
                _ => {
                    return Err((
                        i + 1,
                        format!(
                            "unknown selector {kind:?} (comm, exe, cgroup or pid; or a push setting: {})",
                            crate::agent::push::settings::KEYS.join(", ")
                        ),
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
        // A name matches the process's now, or the one its exec gave it (a node that set
        // `process.title` before it was found: the kernel selected those at their exec).
        let exec_name = exe.map(exec_name);
        (self
            .comms
            .iter()
            .map(|c| c == comm || exec_name == Some(c.as_bytes())))
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
pub(super) fn cgroup2_mounts() -> Vec<PathBuf> {
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
