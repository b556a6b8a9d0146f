//! Process names, read once from /proc while a process lives (its pid may be another
//! process's later), so that a report can still name a process that has exited.

use std::{collections::HashMap, fs};

use crate::vocab::ids::{self, ProcId};

/// Process names, read once from /proc while the process lives.
#[derive(Default)]
pub struct ProcessNames {
    names: HashMap<ProcId, String>,
}

impl ProcessNames {
    /// The process's command name; `fallback` (a name seen in the kernel data) once it is
    /// gone, or when its pid is another process's now.
    pub fn get(&mut self, p: ProcId, fallback: Option<&str>) -> String {
        if let Some(n) = self.names.get(&p) {
            return n.clone();
        }
        match read_comm(p) {
            Some(name) => {
                self.names.insert(p, name.clone());
                name
            }
            None => fallback.unwrap_or("?").to_string(),
        }
    }

    /// The name, if already known.
    pub fn cached(&self, p: ProcId) -> Option<&str> {
        self.names.get(&p).map(String::as_str)
    }

    /// Remember a live process's name now (before it can exit).
    pub fn prime(&mut self, p: ProcId) {
        if !self.names.contains_key(&p)
            && let Some(name) = read_comm(p)
        {
            self.names.insert(p, name);
        }
    }

    /// Forget a process that exited (after its last report needed its name).
    pub fn forget(&mut self, p: ProcId) {
        self.names.remove(&p);
    }

    /// Names in memory.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Learns a name as if read from /proc: the one a process exec'd under, as the kernel
    /// reported it (the process may be gone before /proc could be read), or a made-up
    /// process's in tests.
    pub fn learn(&mut self, p: ProcId, name: &str) {
        self.names.insert(p, name.to_string());
    }
}

/// `/proc/PID/comm` of process `p`, if that pid is still `p`'s.
fn read_comm(p: ProcId) -> Option<String> {
    let name = fs::read_to_string(format!("/proc/{}/comm", p.pid)).ok()?;
    // `p` was seen (by the kernel) before this read: alive after it, it was the one read.
    ids::is_alive(p).then(|| name.trim_end().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::roles::tests::{me, my_predecessor};

    #[test]
    fn own_process_name_from_proc() {
        let mut names = ProcessNames::default();
        let expected = fs::read_to_string("/proc/self/comm").unwrap();
        assert_eq!(names.get(me(), None), expected.trim_end());
        assert_eq!(names.cached(me()), Some(expected.trim_end()));
        assert_eq!(
            names.get(ProcId::new(u32::MAX - 1, 0), Some("gone")),
            "gone"
        );
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn a_reused_pid_does_not_name_the_process_before_it() {
        let mut names = ProcessNames::default();
        // The process that had our pid before us is gone: its name is what the kernel said.
        names.prime(my_predecessor());
        assert_eq!(names.cached(my_predecessor()), None);
        assert_eq!(names.get(my_predecessor(), Some("old")), "old");
        assert_eq!(names.get(my_predecessor(), None), "?");
        assert_eq!(names.len(), 0);
        // We are named from /proc, and forgotten on exit.
        names.prime(me());
        assert!(names.cached(me()).is_some());
        assert_eq!(names.len(), 1);
        names.forget(my_predecessor());
        assert_eq!(names.len(), 1);
        names.forget(me());
        assert_eq!(names.len(), 0);
        assert_eq!(names.cached(me()), None);
    }
}
