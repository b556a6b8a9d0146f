//! Which cgroup (v2) each process is in, by path (`/system.slice/api.service`, a container's
//! scope): read from /proc while the process lives, or, for one gone before that, from the
//! cgroup id the kernel side reported when it exec'd or forked (the id is the inode number
//! of the cgroup's directory; the hierarchy is walked to find it: at once for an id not
//! searched for yet, since a short container's cgroup is removed soon after its process
//! exits, and again for the same id at most once a second).

use std::{
    collections::HashMap,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use crate::{kernel::selectors::cgroup2_mount, vocab::ids::ProcId};

/// The hierarchy is walked again for the same unknown id at most this often.
const WALK_EVERY: Duration = Duration::from_secs(1);
/// And for any id, at most this often (a burst of new cgroups is one walk).
const WALK_FLOOR: Duration = Duration::from_millis(50);
/// Unknown ids remembered as searched for, at most (then forgotten together).
const MAX_SEARCHED: usize = 4096;
/// Directories visited by one walk, at most (a host has hundreds of cgroups).
const WALK_MAX: usize = 100_000;

#[derive(Default)]
pub struct CgroupNames {
    by_proc: HashMap<ProcId, String>,
    by_id: HashMap<u64, String>,
    walked: Option<Instant>,
    /// Ids the last walks did not find, and when they were searched for.
    searched: HashMap<u64, Instant>,
}

impl CgroupNames {
    /// A process's cgroup, read now if it was not known yet (and the process lives).
    pub fn prime(&mut self, p: ProcId) {
        if p.pid == 0 || self.by_proc.contains_key(&p) {
            return;
        }
        if let Some(path) = read_cgroup(p.pid) {
            self.by_proc.insert(p, path);
        }
    }

    /// The kernel reported the process in cgroup `id` (it exec'd or forked): its path, found
    /// from the id, replaces what was known (an exec'd container process has left runc's
    /// cgroup for its own).
    pub fn note_id(&mut self, p: ProcId, id: u64) {
        if id == 0 {
            return;
        }
        if !self.by_id.contains_key(&id) {
            self.walk_for(id);
        }
        if let Some(path) = self.by_id.get(&id) {
            self.by_proc.insert(p, path.clone());
        } else if let Some(path) = read_cgroup(p.pid) {
            self.by_proc.insert(p, path);
        }
    }

    pub fn get(&self, p: ProcId) -> Option<&str> {
        self.by_proc.get(&p).map(String::as_str)
    }

    pub fn forget(&mut self, p: ProcId) {
        self.by_proc.remove(&p);
    }

    /// Learns a cgroup as if read from /proc (tests of processes made up).
    #[cfg(test)]
    pub fn learn(&mut self, p: ProcId, path: &str) {
        self.by_proc.insert(p, path.to_string());
    }

    /// Learns the id of every cgroup in the hierarchy, looking for `id`: at once if it was
    /// not searched for yet, else at most once a second.
    fn walk_for(&mut self, id: u64) {
        let again = self
            .searched
            .get(&id)
            .is_some_and(|t| t.elapsed() < WALK_EVERY);
        if again || self.walked.is_some_and(|t| t.elapsed() < WALK_FLOOR) {
            return;
        }
        if self.searched.len() >= MAX_SEARCHED {
            self.searched.clear();
        }
        self.searched.insert(id, Instant::now());
        self.walked = Some(Instant::now());
        let Some(mount) = cgroup2_mount() else {
            return;
        };
        self.by_id.clear();
        walk_under(&mount, &mount, &mut self.by_id);
    }
}

/// Every directory under `root`, by inode, as a path relative to the mount (`/` for the
/// root itself).
fn walk_under(mount: &Path, root: &Path, out: &mut HashMap<u64, String>) {
    let mut stack: Vec<PathBuf> = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        if out.len() >= WALK_MAX {
            return;
        }
        let Ok(meta) = std::fs::symlink_metadata(&dir) else {
            continue;
        };
        let rel = dir.strip_prefix(mount).unwrap_or(Path::new(""));
        out.insert(meta.ino(), format!("/{}", rel.display()));
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(e.path());
            }
        }
    }
}

/// `/proc/PID/cgroup`'s v2 line (`0::/system.slice/api.service`).
fn read_cgroup(pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This process's cgroup, by the id the kernel would report (its directory's inode), as
    /// /proc names it.
    #[test]
    fn a_cgroup_id_is_named_by_its_path() {
        let Some(mount) = cgroup2_mount() else {
            profiler_common::skip::skip_because("no cgroup v2 hierarchy");
            return;
        };
        let me = ProcId::new(std::process::id(), 1);
        let path = read_cgroup(me.pid).expect("our cgroup");
        let id = std::fs::metadata(mount.join(path.trim_start_matches('/')))
            .unwrap()
            .ino();
        let mut c = CgroupNames::default();
        c.note_id(me, id);
        assert_eq!(c.get(me), Some(path.as_str()));
        c.forget(me);
        assert_eq!(c.get(me), None);
        c.prime(me);
        assert_eq!(c.get(me), Some(path.as_str()));
    }
}
