//! Each process's executable: the path `/proc/PID/exe` links to, read while the process lives
//! (when it is first seen, and again when it execs, since a forked child runs its parent's
//! executable until then), so that a report still says it once the process is gone and
//! `compare --by exe` can group by it. The kernel resolves the link from the profiler's root:
//! a process of another mount namespace (a container's) is named by its path there
//! (`/usr/local/bin/node`), not by where the file lies on the host.

use std::{collections::HashMap, path::Path};

use crate::vocab::ids::{self, ProcId};

/// What the kernel appends to the link of an executable deleted since it was started (an
/// upgraded package's old binary): the program is still the one at that path.
const DELETED: &str = " (deleted)";

#[derive(Default)]
pub struct Executables {
    /// None: the process lived but had no executable to read (a zombie, whose memory is
    /// gone): not read again for every reading that sees it.
    by_proc: HashMap<ProcId, Option<String>>,
}

impl Executables {
    /// Reads a process's executable, if it was not read yet and the process lives.
    pub fn prime(&mut self, p: ProcId) {
        if p.pid == 0 || self.by_proc.contains_key(&p) {
            return;
        }
        if let Some(exe) = read_exe(p) {
            self.by_proc.insert(p, exe);
        }
    }

    /// The process exec'd: its executable is the new image's, read again (none when the
    /// process is gone already: what was read before was the old image's).
    pub fn exec(&mut self, p: ProcId) {
        self.by_proc.remove(&p);
        self.prime(p);
    }

    pub fn get(&self, p: ProcId) -> Option<&str> {
        self.by_proc.get(&p)?.as_deref()
    }

    pub fn forget(&mut self, p: ProcId) {
        self.by_proc.remove(&p);
    }

    /// Learns an executable as if read from /proc (tests of processes made up).
    #[cfg(test)]
    pub fn learn(&mut self, p: ProcId, path: &str) {
        self.by_proc.insert(p, Some(path.to_string()));
    }

    /// Processes in memory.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.by_proc.len()
    }
}

/// `p`'s executable: None when `p` is gone (its pid free, or another process's); Some(None)
/// when it lives without one to read.
fn read_exe(p: ProcId) -> Option<Option<String>> {
    let link = std::fs::read_link(format!("/proc/{}/exe", p.pid));
    // `p` was seen (by the kernel) before this read: alive after it, it was the one read.
    ids::is_alive(p).then(|| link.ok().map(|l| path_text(&l)))
}

/// The link as text, without the mark of a deleted file.
fn path_text(link: &Path) -> String {
    let s = link.to_string_lossy();
    s.strip_suffix(DELETED).unwrap_or(&s).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::roles::tests::{me, my_predecessor};

    #[test]
    fn a_live_processs_executable_is_read_once_and_forgotten() {
        let mut e = Executables::default();
        e.prime(me());
        let mine = std::env::current_exe().unwrap();
        assert_eq!(e.get(me()), Some(mine.to_str().unwrap()));
        e.exec(me());
        assert_eq!(e.get(me()), Some(mine.to_str().unwrap()), "read again");
        e.forget(me());
        assert_eq!((e.get(me()), e.len()), (None, 0));
    }

    #[test]
    fn a_gone_process_has_none_and_is_not_kept() {
        let mut e = Executables::default();
        // Our pid, an earlier start: the process that had it is gone, its executable unknown.
        e.prime(my_predecessor());
        assert_eq!((e.get(my_predecessor()), e.len()), (None, 0));
        e.prime(ProcId::new(u32::MAX - 1, 0));
        assert_eq!(e.len(), 0);
        // At its exec, what was known of it before (its parent's executable) is dropped.
        e.learn(my_predecessor(), "/usr/bin/node");
        e.exec(my_predecessor());
        assert_eq!((e.get(my_predecessor()), e.len()), (None, 0));
    }

    #[test]
    fn a_deleted_executable_keeps_its_path() {
        assert_eq!(
            path_text(Path::new("/usr/bin/node (deleted)")),
            "/usr/bin/node"
        );
        assert_eq!(path_text(Path::new("/usr/bin/node")), "/usr/bin/node");
    }
}
