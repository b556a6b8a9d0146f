//! Each process's executable: the path `/proc/PID/exe` links to, read while the process lives,
//! so that a report still says it once the process is gone and `compare --by exe` can group
//! by it. A process runs a new executable from its exec on (a forked child runs its parent's
//! until then), and the exec's notice is taken at the next reading, when a short process is
//! gone: so each read keeps when it was made, a read made after the exec is kept at its notice
//! and only an older one is read again (none, if the process is gone), and a thread the
//! process starts after a read (node's, right after its exec) has it read again at once.
//!
//! The kernel resolves the link from the profiler's root: a process of another mount
//! namespace (a container's) is named by its path there (`/usr/local/bin/node`), not by where
//! the file lies on the host.

use std::{collections::HashMap, path::Path};

use crate::vocab::ids::{self, ProcId};

/// What the kernel appends to the link of an executable deleted since it was started (an
/// upgraded package's old binary): the program is still the one at that path.
const DELETED: &str = " (deleted)";

/// One read of a process's executable.
struct Read {
    /// None: the process lived but had no executable to read (a zombie, whose memory is
    /// gone): not read again for every reading that sees it.
    exe: Option<String>,
    /// When it was read (before the read, boot-time clock, ns).
    at_ns: u64,
}

#[derive(Default)]
pub struct Executables {
    by_proc: HashMap<ProcId, Read>,
}

impl Executables {
    /// Reads a process's executable, if it was not read yet and the process lives.
    pub fn prime(&mut self, p: ProcId) {
        if p.pid == 0 || self.by_proc.contains_key(&p) {
            return;
        }
        if let Some(read) = read_exe(p) {
            self.by_proc.insert(p, read);
        }
    }

    /// A thread of the process's own started at `start_ns`: a read before that may be of an
    /// image it has left since (an exec whose notice is still to come), read again while the
    /// process has one (kept if it is gone or exiting, its memory gone: the exec's notice
    /// decides; a thread announced at its exit must not unlearn it).
    pub fn thread_started(&mut self, p: ProcId, start_ns: u64) {
        if self.by_proc.get(&p).is_some_and(|r| r.at_ns < start_ns)
            && let Some(read) = read_exe(p)
            && read.exe.is_some()
        {
            self.by_proc.insert(p, read);
        }
    }

    /// The process exec'd at `at_ns`: a read made before is of its old image, read again
    /// (none when the process is gone already).
    pub fn exec(&mut self, p: ProcId, at_ns: u64) {
        if self.by_proc.get(&p).is_some_and(|r| r.at_ns >= at_ns) {
            return;
        }
        self.by_proc.remove(&p);
        self.prime(p);
    }

    pub fn get(&self, p: ProcId) -> Option<&str> {
        self.by_proc.get(&p)?.exe.as_deref()
    }

    pub fn forget(&mut self, p: ProcId) {
        self.by_proc.remove(&p);
    }

    /// Learns an executable as if read from /proc at `at_ns` (tests of processes made up).
    #[cfg(test)]
    pub fn learn(&mut self, p: ProcId, path: &str, at_ns: u64) {
        let exe = Some(path.to_string());
        self.by_proc.insert(p, Read { exe, at_ns });
    }

    /// Processes in memory.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.by_proc.len()
    }
}

/// A read of `p`'s executable: None when `p` is gone (its pid free, or another process's).
fn read_exe(p: ProcId) -> Option<Read> {
    let at_ns = ids::boot_ns();
    let link = std::fs::read_link(format!("/proc/{}/exe", p.pid));
    // `p` was seen (by the kernel) before this read: alive after it, it was the one read.
    ids::is_alive(p).then(|| Read {
        exe: link.ok().map(|l| path_text(&l)),
        at_ns,
    })
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

    fn mine() -> String {
        std::env::current_exe()
            .unwrap()
            .to_str()
            .unwrap()
            .to_string()
    }

    #[test]
    fn a_live_processs_executable_is_read_once_and_forgotten() {
        let mut e = Executables::default();
        e.prime(me());
        assert_eq!(e.get(me()), Some(mine().as_str()));
        e.forget(me());
        assert_eq!((e.get(me()), e.len()), (None, 0));
    }

    #[test]
    fn an_exec_keeps_a_read_made_after_it_and_reads_an_older_one_again() {
        let mut e = Executables::default();
        let now = ids::boot_ns();
        // Read after the exec: the new image's, kept.
        e.learn(me(), "/usr/bin/node", now);
        e.exec(me(), now - 1);
        assert_eq!(e.get(me()), Some("/usr/bin/node"));
        // Read before it: the old image's, read again (here, this test binary).
        e.exec(me(), now + 1);
        assert_eq!(e.get(me()), Some(mine().as_str()));
        // A thread started after a read has the process read again; one started before not.
        e.learn(me(), "/usr/bin/node", now);
        e.thread_started(me(), now - 1);
        assert_eq!(e.get(me()), Some("/usr/bin/node"));
        e.thread_started(me(), now + 1);
        assert_eq!(e.get(me()), Some(mine().as_str()));
    }

    #[test]
    fn a_gone_process_has_none_and_is_not_kept() {
        let mut e = Executables::default();
        // Our pid, an earlier start: the process that had it is gone, its executable unknown.
        e.prime(my_predecessor());
        assert_eq!((e.get(my_predecessor()), e.len()), (None, 0));
        e.prime(ProcId::new(u32::MAX - 1, 0));
        assert_eq!(e.len(), 0);
        // A thread started since: what was read is kept (the process cannot be read again).
        e.learn(my_predecessor(), "/usr/bin/node", 10);
        e.thread_started(my_predecessor(), 20);
        assert_eq!(e.get(my_predecessor()), Some("/usr/bin/node"));
        // At its exec, what was read before (its parent's executable) is dropped.
        e.exec(my_predecessor(), 30);
        assert_eq!((e.get(my_predecessor()), e.len()), (None, 0));
    }

    /// A zombie has no executable to read: a thread announced at its exit leaves what was
    /// read of it; at an exec's notice it has none.
    #[test]
    fn a_zombie_keeps_what_was_read_of_it() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let p = ProcId::of_live(child.id()).expect("not reaped yet");
        // It exits; not waited for, it stays a zombie.
        let zombie = || ids::presence(p.pid, ids::ThreadId::new(p.pid, p.start));
        let t0 = std::time::Instant::now();
        while zombie() != ids::Presence::Zombie {
            assert!(t0.elapsed().as_secs() < 60, "{:?}", zombie());
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let mut e = Executables::default();
        e.learn(p, "/usr/bin/true", 10);
        e.thread_started(p, ids::boot_ns());
        assert_eq!(e.get(p), Some("/usr/bin/true"));
        e.exec(p, ids::boot_ns());
        assert_eq!((e.get(p), e.len()), (None, 1), "known to have none");
        child.wait().unwrap();
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
