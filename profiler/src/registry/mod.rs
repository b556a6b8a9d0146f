//! Per-process state, keyed by (pid, start time) and (tid, start time): names, thread roles
//! (start routines), mappings, unwinders and sampled stacks. Filled while processes live,
//! evicted when they exit; it attributes what the kernel side counted.

pub mod ids;
pub mod procmaps;
pub mod roles;
pub mod stacks;
pub mod threadstart;
pub mod unwind;

use std::collections::{BTreeMap, HashMap};

use crate::aggregation::{ThreadAgg, Window};
use ids::{ProcId, ThreadId};
use roles::{ProcessNames, Role, Roles, comm_str};

/// The registry's caches that reports draw on: process names and thread roles.
#[derive(Default)]
pub struct Registry {
    pub names: ProcessNames,
    pub roles: Roles,
}

/// Names and roles for one window, resolved by the registry (which reads /proc and
/// symbolizes) before a report is built from them.
#[derive(Clone, Debug, Default)]
pub struct Attribution {
    names: BTreeMap<ProcId, String>,
    roles: HashMap<(ProcId, ThreadId), Role>,
}

impl Attribution {
    /// A process's name: resolved, else its main thread's name as the kernel saw it.
    pub fn name(&self, p: ProcId, threads: &BTreeMap<ThreadId, ThreadAgg>) -> String {
        if let Some(n) = self.names.get(&p) {
            return n.clone();
        }
        threads
            .iter()
            .find(|(t, _)| t.tid == p.pid)
            .map_or_else(|| "?".to_string(), |(_, t)| comm_str(&t.comm))
    }

    /// A thread's role: decided when it retired, or resolved; `other` if neither.
    pub fn role(&self, p: ProcId, t: ThreadId, agg: &ThreadAgg) -> Role {
        agg.role
            .or_else(|| self.roles.get(&(p, t)).copied())
            .unwrap_or(Role::Other)
    }

    #[cfg(test)]
    pub fn with(names: &[(ProcId, &str)], roles: &[(ProcId, ThreadId, Role)]) -> Self {
        Attribution {
            names: names.iter().map(|(p, n)| (*p, n.to_string())).collect(),
            roles: roles.iter().map(|(p, t, r)| ((*p, *t), *r)).collect(),
        }
    }
}

impl Registry {
    /// Resolves the names and roles a report of `window` needs (reading /proc for processes
    /// still alive, symbolizing start routines).
    pub fn attribute(&mut self, window: &Window) -> Attribution {
        self.roles.resolve_pending();
        let mut a = Attribution::default();
        for (&p, threads) in &window.processes {
            let name = match window.names.get(&p) {
                Some(n) => n.clone(),
                None => {
                    let main = threads
                        .iter()
                        .find(|(t, _)| t.tid == p.pid)
                        .map(|(_, t)| comm_str(&t.comm));
                    self.names.get(p, main.as_deref())
                }
            };
            a.names.insert(p, name);
            for (&t, agg) in threads {
                if agg.role.is_none() {
                    let r = self.roles.role(p, t, agg.tgid, &agg.comm, agg.fsbase);
                    a.roles.insert((p, t), r);
                }
            }
        }
        a
    }
}
