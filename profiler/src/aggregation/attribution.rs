//! What the registry knows about the processes and threads of one window (names, cgroups,
//! executables, roles), resolved before a report is built from it. It lives here, above the registry,
//! because resolving it reads the window: the registry itself never sees aggregated data.

use std::collections::{BTreeMap, HashMap};

use crate::{
    aggregation::{ThreadAgg, Window},
    registry::{
        Registry,
        addonlibs::AddonOrigin,
        cpus::CpuAllowance,
        roles::{Decided, Role, comm_str},
    },
    vocab::ids::{ProcId, ThreadId},
};

/// Names, cgroups, executables and roles for one window, resolved by the registry (which reads /proc and
/// symbolizes) before a report is built from them.
#[derive(Clone, Debug, Default)]
pub struct Attribution {
    names: BTreeMap<ProcId, String>,
    cgroups: BTreeMap<ProcId, String>,
    exes: BTreeMap<ProcId, String>,
    cpus: BTreeMap<ProcId, CpuAllowance>,
    roles: HashMap<(ProcId, ThreadId), Decided>,
}

impl Attribution {
    /// A process's cgroup (v2 path), when known.
    pub fn cgroup(&self, p: ProcId) -> Option<&str> {
        self.cgroups.get(&p).map(String::as_str)
    }

    /// A process's executable (the path `/proc/PID/exe` links to), when known.
    pub fn exe(&self, p: ProcId) -> Option<&str> {
        self.exes.get(&p).map(String::as_str)
    }

    /// The CPUs a process may use, when known.
    pub fn cpus(&self, p: ProcId) -> Option<CpuAllowance> {
        self.cpus.get(&p).copied()
    }

    /// A process's name: resolved, else its main thread's name as the kernel saw it.
    pub fn name(&self, p: ProcId, threads: &BTreeMap<ThreadId, ThreadAgg>) -> String {
        if let Some(n) = self.names.get(&p) {
            return n.clone();
        }
        // Its main thread's name, else any of its own threads' (a process gone before its
        // name was read).
        threads
            .iter()
            .find(|(t, _)| t.tid == p.pid)
            .or_else(|| threads.iter().find(|(_, a)| a.tgid == p.pid))
            .map_or_else(|| "?".to_string(), |(_, t)| comm_str(&t.comm))
    }

    /// A thread's role: decided when it retired, or resolved; `other` if neither.
    pub fn role(&self, p: ProcId, t: ThreadId, agg: &ThreadAgg) -> Role {
        self.decided(p, t, agg).map_or(Role::Other, |d| d.role)
    }

    /// Where an `addon` thread's code came from (its addon, and the library behind it that
    /// started it), when its start routine was read.
    pub fn origin<'a>(
        &'a self,
        p: ProcId,
        t: ThreadId,
        agg: &'a ThreadAgg,
    ) -> Option<&'a AddonOrigin> {
        self.decided(p, t, agg)?.origin.as_deref()
    }

    /// A thread's start routine, when it was read.
    pub fn start_routine<'a>(
        &'a self,
        p: ProcId,
        t: ThreadId,
        agg: &'a ThreadAgg,
    ) -> Option<&'a str> {
        self.decided(p, t, agg)?.start.as_deref()
    }

    fn decided<'a>(&'a self, p: ProcId, t: ThreadId, agg: &'a ThreadAgg) -> Option<&'a Decided> {
        agg.role.as_ref().or_else(|| self.roles.get(&(p, t)))
    }

    /// A thread's resolved role, if the registry knew it.
    pub fn role_of(&self, p: ProcId, t: ThreadId) -> Option<Role> {
        self.roles.get(&(p, t)).map(|d| d.role)
    }

    #[cfg(test)]
    pub fn with(names: &[(ProcId, &str)], roles: &[(ProcId, ThreadId, Role)]) -> Self {
        Attribution {
            names: names.iter().map(|(p, n)| (*p, n.to_string())).collect(),
            cgroups: BTreeMap::new(),
            exes: BTreeMap::new(),
            cpus: BTreeMap::new(),
            roles: roles
                .iter()
                .map(|(p, t, r)| ((*p, *t), (*r).into()))
                .collect(),
        }
    }

    /// Resolves the names and roles a report of `window` needs (reading /proc for processes
    /// still alive, symbolizing start routines). It adds nothing to the caches: a process or
    /// thread that is gone stays forgotten.
    pub fn of(registry: &mut Registry, window: &Window) -> Attribution {
        registry.roles.resolve_pending();
        let mut a = Attribution::default();
        for (&p, threads) in &window.processes {
            let name = match window.names.get(&p) {
                Some(n) => n.clone(),
                None => {
                    let main = threads
                        .iter()
                        .find(|(t, _)| t.tid == p.pid)
                        .map(|(_, t)| comm_str(&t.comm));
                    registry.names.get(p, main.as_deref())
                }
            };
            a.names.insert(p, name);
            a.learn_process(p, registry, window);
            for (&t, agg) in threads {
                // Live threads were observed as they came; retired ones carry their role.
                // Never `role()` here: it would note a forgotten thread again, for good.
                if agg.role.is_none()
                    && let Some(r) = registry.roles.cached_role(p, t)
                {
                    a.roles.insert((p, t), r);
                }
            }
        }
        // Blockers and their waiters may have taken nothing else in the window, nor their
        // lock's owner (its waits read before the charges that came with them).
        for (&p, pairs) in window.blocked.iter().flat_map(|b| &b.owners) {
            if let std::collections::btree_map::Entry::Vacant(e) = a.names.entry(p) {
                e.insert(match window.names.get(&p) {
                    Some(n) => n.clone(),
                    None => registry.names.get(p, None),
                });
                a.learn_process(p, registry, window);
            }
            for pair in pairs.keys() {
                for t in [pair.waiter, pair.holder] {
                    if !a.roles.contains_key(&(p, t))
                        && let Some(r) = registry.roles.cached_role(p, t)
                    {
                        a.roles.insert((p, t), r);
                    }
                }
            }
        }
        a
    }

    /// A process's cgroup and executable: kept in the window if it is gone, else cached.
    fn learn_process(&mut self, p: ProcId, registry: &Registry, window: &Window) {
        let kept = |gone: &BTreeMap<ProcId, String>, live: Option<&str>| {
            gone.get(&p)
                .map(String::as_str)
                .or(live)
                .map(str::to_string)
        };
        if let Some(c) = kept(&window.cgroups, registry.cgroups.get(p)) {
            self.cgroups.insert(p, c);
        }
        if let Some(e) = kept(&window.exes, registry.exes.get(p)) {
            self.exes.insert(p, e);
        }
        if let Some(c) = window.cpus.get(&p).copied().or(registry.cpus.get(p)) {
            self.cpus.insert(p, c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{aggregation::ThreadDelta, registry::roles::SeenThread};
    use profiler_common::{COMM_LEN, StatsKey, cause};

    #[test]
    fn attributing_a_window_brings_back_no_forgotten_thread_or_process() {
        let mut r = Registry::default();
        // Process 4242 at start tick 7 never existed here: nothing about it can be read.
        let (p, t) = (ProcId::new(4242, 7), ThreadId::new(4243, 7));
        let mut w = Window::default();
        w.add(&ThreadDelta {
            key: StatsKey {
                owner: p.pid,
                tid: t.tid,
                kind: cause::MMAP,
                _pad: 0,
                owner_start: 70_000_000,
                tid_start: 70_000_000,
            },
            tgid: p.pid,
            comm: [0; COMM_LEN],
            fsbase: 0,
            stats: Default::default(),
        });
        let seen = SeenThread {
            owner: p,
            thread: t,
            tgid: p.pid,
            comm: [0; COMM_LEN],
            fsbase: 0,
        };
        r.roles.observe(&seen, 0);
        r.roles.forget_thread(p, t);
        r.roles.forget_process(p);
        assert_eq!(
            (r.roles.cached_processes(), r.roles.cached_threads()),
            (0, 0)
        );
        let a = Attribution::of(&mut r, &w);
        assert_eq!(
            (r.roles.cached_processes(), r.roles.cached_threads()),
            (0, 0),
            "the report put them back"
        );
        // The forgotten thread is `other` in the report.
        let agg = &w.processes[&p][&t];
        assert_eq!(a.role(p, t, agg), Role::Other);
    }

    /// A lock's owner with charged waits only in a window (contention mode reads its waits
    /// and their charges apart): it is named, not left out (the agent labelled it by a
    /// lookup that panicked).
    #[test]
    fn a_lock_owner_with_only_charged_waits_is_named() {
        use crate::aggregation::blocked::{Blocked, Charged, Pair};
        let mut r = Registry::default();
        let p = ProcId::new(4242, 7);
        let mut w = Window::default();
        w.names.insert(p, "node".into());
        let mut b = Blocked::default();
        let [waiter, holder] = ThreadId::made_up([4243, 4244]);
        b.add(
            p,
            Pair {
                waiter,
                waiter_op: profiler_common::WRITE as u32,
                holder,
                holder_pid: p.pid,
                holder_kind: cause::MPROTECT,
            },
            Charged {
                waits: 1,
                wait_ns: 5000,
            },
        );
        w.blocked = Some(b);
        let a = Attribution::of(&mut r, &w);
        assert_eq!(a.name(p, &Default::default()), "node");
    }
}
