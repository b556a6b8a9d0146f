//! What a thread's role is, and the rules that decide it: in this order, from ids (the main
//! thread's tid is its pid; a thread of another process is `foreign`; the profiler's own are
//! `profiler`), from the name a runtime gave it (newer Node.js: `WorkerThread` or the Worker's
//! name, `libuv-worker`, `V8Worker`, inspector threads), and otherwise from its start
//! routine's symbol and file. Pure functions: `roles` reads what they need.

use std::{path::Path, sync::Arc};

use profiler_common::COMM_LEN;
use serde::{Deserialize, Deserializer, Serialize};

use crate::registry::addonlibs::{AddonOrigin, is_addon};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Main,
    Worker,
    Libuv,
    V8,
    Inspector,
    Addon,
    Other,
    Foreign,
    /// The profiler's own threads (reading a target's /proc files and memory): counted apart
    /// from the process's own acquisitions, never offered as blockers.
    Profiler,
    /// A holder only (contention mode): the lock's readers, whom the rwsem does not name.
    Readers,
}

/// Read back from a report, a role this build does not know (a later addition) is `other`.
impl<'de> Deserialize<'de> for Role {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        Ok([
            Role::Main,
            Role::Worker,
            Role::Libuv,
            Role::V8,
            Role::Inspector,
            Role::Addon,
            Role::Foreign,
            Role::Profiler,
            Role::Readers,
        ]
        .into_iter()
        .find(|r| r.as_str() == name)
        .unwrap_or(Role::Other))
    }
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
            Role::Profiler => "profiler",
            Role::Readers => "readers",
        }
    }
}

/// A thread's role as decided, and for an `addon` thread whose start routine was read, where
/// its code came from (its addon, and the library behind it that started the thread).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decided {
    pub role: Role,
    pub origin: Option<Arc<AddonOrigin>>,
    /// Its start routine's name, when it was read: what a report groups short-lived threads
    /// by, with their role.
    pub start: Option<Arc<str>>,
}

impl From<Role> for Decided {
    fn from(role: Role) -> Self {
        Decided {
            role,
            origin: None,
            start: None,
        }
    }
}

/// A kernel comm (NUL-padded bytes) as text.
pub fn comm_str(comm: &[u8; COMM_LEN]) -> String {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(COMM_LEN);
    String::from_utf8_lossy(&comm[..end]).into_owned()
}

/// Role from ids and names alone; None when the start routine must decide.
pub(super) fn role_from_ids_and_name(
    owner: u32,
    tid: u32,
    tgid: u32,
    comm: &str,
    profiler: u32,
) -> Option<Role> {
    if tgid == profiler {
        return Some(Role::Profiler);
    }
    if tgid != owner {
        return Some(Role::Foreign);
    }
    if tid == owner {
        return Some(Role::Main);
    }
    role_from_name(comm)
}

/// The role of a thread told by its ids and name alone, `other` when they do not tell: a
/// bystander's (a thread of a profiled process that took none of its profiled locks), whose
/// start routine is not read (that read would take the process's lock).
pub fn role_by_ids_and_name(owner: u32, tid: u32, tgid: u32, comm: &str, profiler: u32) -> Role {
    role_from_ids_and_name(owner, tid, tgid, comm, profiler).unwrap_or(Role::Other)
}

/// Roles that runtimes announce in thread names (truncated to 15 bytes by the kernel; Node 26
/// prefixes some with `node-`, as `node-V8Worker`).
fn role_from_name(comm: &str) -> Option<Role> {
    let lower = comm.to_ascii_lowercase();
    let lower = lower.strip_prefix("node-").unwrap_or(&lower);
    if lower.starts_with("libuv-worker") {
        Some(Role::Libuv)
    } else if lower.starts_with("v8worker")
        || lower.starts_with("v8 defaultworke")
        || lower.starts_with("delayedtas")
    {
        // V8's platform threads, the delayed-task scheduler among them (Node 24
        // `DelayedTaskSche`, 26 `node-DelayedTask`): its start routine is not always read in
        // time (seen once: 2 munmaps under `other`).
        Some(Role::V8)
    } else if lower.starts_with("workerthread") {
        Some(Role::Worker)
    } else if lower.contains("inspector") {
        Some(Role::Inspector)
    } else {
        None
    }
}

/// Role of a thread whose start routine is `symbol` in the file `module`.
pub(super) fn role_from_start_routine(symbol: &str, module: Option<&Path>) -> Role {
    if module.is_some_and(is_addon) {
        Role::Addon
    } else if symbol.contains("worker::Worker::StartThread") {
        Role::Worker
    } else if symbol == "worker" || symbol.starts_with("uv__") && symbol.contains("worker") {
        // libuv's threadpool loop is a static function called `worker`.
        Role::Libuv
    } else if symbol.contains("PlatformWorkerThread") || symbol.contains("DelayedTaskScheduler") {
        Role::V8
    } else if symbol.to_ascii_lowercase().contains("inspector") {
        Role::Inspector
    } else {
        Role::Other
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::roles::tests::comm;

    #[test]
    fn roles_from_ids() {
        // (owner, tid, tgid, comm, the profiler's pid): role.
        for (ids, role) in [
            ((100, 100, 100, "node", 0), Some(Role::Main)),
            ((100, 101, 100, "node", 0), None),
            ((100, 200, 200, "node", 0), Some(Role::Foreign)),
            ((100, 200, 200, "WorkerThread", 0), Some(Role::Foreign)),
            // The profiler's own threads, whoever's lock they take (their own included).
            ((100, 200, 200, "mmaplock-prof", 200), Some(Role::Profiler)),
            ((200, 200, 200, "mmaplock-prof", 200), Some(Role::Profiler)),
        ] {
            let (owner, tid, tgid, comm, profiler) = ids;
            assert_eq!(
                role_from_ids_and_name(owner, tid, tgid, comm, profiler),
                role,
                "{ids:?}"
            );
        }
    }

    #[test]
    fn roles_from_runtime_thread_names() {
        let r = |c| role_from_ids_and_name(1, 2, 1, c, 0);
        assert_eq!(r("WorkerThread"), Some(Role::Worker));
        assert_eq!(r("DelayedTaskSche"), Some(Role::V8));
        assert_eq!(r("node-DelayedTas"), Some(Role::V8));
        assert_eq!(r("libuv-worker"), Some(Role::Libuv));
        assert_eq!(r("V8Worker"), Some(Role::V8));
        assert_eq!(r("V8 DefaultWorke"), Some(Role::V8));
        assert_eq!(r("node-V8Worker"), Some(Role::V8));
        assert_eq!(r("node-MainThread"), None);
        assert_eq!(r("node inspector"), Some(Role::Inspector));
        assert_eq!(Role::Libuv.as_str(), "libuv");
    }

    #[test]
    fn roles_from_node_20_start_routines() {
        let node = Some(Path::new("/usr/bin/node"));
        let r = role_from_start_routine;
        assert_eq!(
            r(
                "node::worker::Worker::StartThread(v8::FunctionCallbackInfo<v8::Value> const&)::{lambda(void*)#1}::_FUN(void*)",
                node
            ),
            Role::Worker
        );
        assert_eq!(r("worker", node), Role::Libuv);
        assert_eq!(
            r(
                "node::(anonymous namespace)::PlatformWorkerThread(void*)",
                node
            ),
            Role::V8
        );
        assert_eq!(
            r(
                "node::inspector::(anonymous namespace)::StartIoThreadMain(void*)",
                node
            ),
            Role::Inspector
        );
        assert_eq!(
            r("spin", Some(Path::new("/x/build/Release/churn.node"))),
            Role::Addon
        );
        assert_eq!(r("start_thread_of_something", node), Role::Other);
    }

    #[test]
    fn comm_bytes_to_text() {
        assert_eq!(comm_str(&comm("node")), "node");
        assert_eq!(comm_str(&[b'x'; COMM_LEN]), "x".repeat(COMM_LEN));
    }
}
