//! Who took the lock: process names and thread roles.
//!
//! At this stage a role comes from ids and names: the main thread is the one whose tid is its
//! process id, a thread of another process is `foreign`, and runtimes that name their threads
//! (newer Node.js: `WorkerThread` or the Worker's name, `libuv-worker`, `V8Worker`, inspector
//! threads) are recognised by name. Node 20 calls every thread `node`, so its other threads are
//! `other` here.

use std::{collections::HashMap, fs};

use profiler_common::COMM_LEN;
use serde::Serialize;

use crate::aggregation::ThreadAgg;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Main,
    Worker,
    Libuv,
    V8,
    Inspector,
    /// Reported by stack-based classification (not yet: Node 20 names no threads).
    #[allow(dead_code)]
    Addon,
    Other,
    Foreign,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Main => "main",
            Role::Worker => "worker",
            Role::Libuv => "libuv",
            Role::V8 => "v8",
            Role::Inspector => "inspector",
            Role::Addon => "addon",
            Role::Other => "other",
            Role::Foreign => "foreign",
        }
    }
}

/// A kernel comm (NUL-padded bytes) as text.
pub fn comm_str(comm: &[u8; COMM_LEN]) -> String {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(COMM_LEN);
    String::from_utf8_lossy(&comm[..end]).into_owned()
}

/// Role of thread `tid` (of process `tgid`, named `comm`) taking the lock of process `owner`.
pub fn role(owner: u32, tid: u32, tgid: u32, comm: &str) -> Role {
    if tgid != owner {
        return Role::Foreign;
    }
    if tid == owner {
        return Role::Main;
    }
    role_from_name(comm).unwrap_or(Role::Other)
}

/// Roles that runtimes announce in thread names (truncated to 15 bytes by the kernel).
fn role_from_name(comm: &str) -> Option<Role> {
    let lower = comm.to_ascii_lowercase();
    if lower.starts_with("libuv-worker") {
        Some(Role::Libuv)
    } else if lower.starts_with("v8worker") || lower.starts_with("v8 defaultworke") {
        Some(Role::V8)
    } else if lower.starts_with("workerthread") {
        Some(Role::Worker)
    } else if lower.contains("inspector") {
        Some(Role::Inspector)
    } else {
        None
    }
}

/// Thread roles, decided once per thread.
#[derive(Default)]
pub struct Roles {
    known: HashMap<(u32, u32), Role>,
}

impl Roles {
    /// Role of thread `tid` (described by `t`, named `comm`) on the lock of process `owner`.
    pub fn role(&mut self, owner: u32, tid: u32, t: &ThreadAgg, comm: &str) -> Role {
        *self
            .known
            .entry((owner, tid))
            .or_insert_with(|| role(owner, tid, t.tgid, comm))
    }
}

/// Process names, read once from /proc while the process lives.
#[derive(Default)]
pub struct ProcessNames {
    names: HashMap<u32, String>,
}

impl ProcessNames {
    /// The process's command name; `fallback` (a name seen in the kernel data) once it is gone.
    pub fn get(&mut self, pid: u32, fallback: Option<&str>) -> String {
        if let Some(n) = self.names.get(&pid) {
            return n.clone();
        }
        let name = match fs::read_to_string(format!("/proc/{pid}/comm")) {
            Ok(s) => s.trim_end().to_string(),
            Err(_) => return fallback.unwrap_or("?").to_string(),
        };
        self.names.insert(pid, name.clone());
        name
    }

    /// Remember a live process's name now (before it can exit).
    pub fn prime(&mut self, pid: u32) {
        let _ = self.get(pid, None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_from_ids() {
        assert_eq!(role(100, 100, 100, "node"), Role::Main);
        assert_eq!(role(100, 101, 100, "node"), Role::Other);
        assert_eq!(role(100, 200, 200, "node"), Role::Foreign);
        assert_eq!(role(100, 200, 200, "WorkerThread"), Role::Foreign);
    }

    #[test]
    fn roles_from_runtime_thread_names() {
        assert_eq!(role(1, 2, 1, "WorkerThread"), Role::Worker);
        assert_eq!(role(1, 2, 1, "libuv-worker"), Role::Libuv);
        assert_eq!(role(1, 2, 1, "V8Worker"), Role::V8);
        assert_eq!(role(1, 2, 1, "V8 DefaultWorke"), Role::V8);
        assert_eq!(role(1, 2, 1, "node inspector"), Role::Inspector);
        assert_eq!(Role::Libuv.as_str(), "libuv");
    }

    #[test]
    fn comm_bytes_to_text() {
        let mut c = [0u8; COMM_LEN];
        c[..4].copy_from_slice(b"node");
        assert_eq!(comm_str(&c), "node");
        assert_eq!(comm_str(&[b'x'; COMM_LEN]), "x".repeat(COMM_LEN));
    }

    #[test]
    fn own_process_name_from_proc() {
        let mut names = ProcessNames::default();
        let me = std::process::id();
        let expected = fs::read_to_string("/proc/self/comm").unwrap();
        assert_eq!(names.get(me, None), expected.trim_end());
        assert_eq!(names.get(u32::MAX - 1, Some("gone")), "gone");
    }
}
