//! How threads and processes leave a profile, in one place.
//!
//! A thread is *retired* once it can take no lock any more: its kernel entries are read one
//! last time and deleted, its totals are kept apart with the role it had (so the report
//! still has it), and what the registry cached about it is forgotten. The kernel says when:
//! its exit notice (`EXITING`, then `FREED` once its pending acquisitions are in the map),
//! and /proc says when it has run its last instruction (exit_mm and the last thread's
//! exit_mmap still take the lock after the notice). Notices lost on a full ring are made up
//! for by a look at /proc.
//!
//! A process is retired (*evicted*) when its own threads are all retired and it is reaped:
//! its lock is gone, so the entries of other processes' threads on it are retired too, it
//! leaves the kernel's selection, and its name, cgroup and executable move from the registry
//! to the totals. Processes and threads are known by id *and* start time: a reused pid or tid is
//! another process or thread, retired on its own.

use std::collections::BTreeSet;

use profiler_common::{COMM_LEN, exit_record};
use rustc_hash::FxHashMap as HashMap;

use super::Profile;
use crate::{
    kernel::Kernel,
    registry::reads::Reads,
    registry::roles::{SeenThread, comm_str},
    run::SessionError,
    vocab::ids::{self, Presence, ProcId, ThreadId},
};

/// Threads and processes on their way out.
#[derive(Default)]
pub(super) struct Exits {
    /// `exits_lost` when last looked at.
    exits_lost: u64,
    /// Threads that began exiting and are not freed yet (their last acquisitions are still
    /// to be flushed), with their process.
    exiting: HashMap<ThreadId, u32>,
    /// Threads whose entries are final once they have run their last instruction (they may
    /// still take the lock after their notice: exit_mm, the last thread's exit_mmap), with
    /// their process. Retired by the first reading after /proc shows them gone.
    freeing: HashMap<ThreadId, u32>,
    /// Threads still exiting when the run ended (see `Lost::exit_pending`).
    exit_pending: u64,
    /// Processes whose own threads are all gone but which were not reaped yet.
    dying: BTreeSet<ProcId>,
    /// Processes that exec'd since [`Profile::take_execs`] was last called.
    execs: Vec<ProcId>,
}

impl Exits {
    /// Is a thread still on its way out: exiting, or freed but still running?
    pub(super) fn waiting(&self, kernel: &impl Kernel) -> bool {
        !self.exiting.is_empty()
            || self
                .freeing
                .iter()
                .any(|(&t, &tgid)| kernel.presence(tgid, t) == Presence::Alive)
    }

    /// The end of a run: the exiting threads gone from /proc without being freed may hold
    /// acquisitions back (`Lost::exit_pending`).
    pub(super) fn count_pending(&mut self, kernel: &impl Kernel) {
        self.exit_pending = self
            .exiting
            .iter()
            .filter(|&(&t, &tgid)| kernel.presence(tgid, t) == Presence::Gone)
            .count() as u64;
    }

    /// See [`Exits::count_pending`].
    pub(super) fn pending(&self) -> u64 {
        self.exit_pending
    }
}

impl<K: Kernel> Profile<K> {
    /// The freed threads /proc shows gone (or zombies).
    pub(super) fn exited_freeing(&self) -> Vec<ThreadId> {
        self.exits
            .freeing
            .iter()
            .filter(|&(&t, &tgid)| self.collector.presence(tgid, t) != Presence::Alive)
            .map(|(&t, _)| t)
            .collect()
    }

    /// Drains the exit notices: remembers exiting and freed threads; a process that exec'd is
    /// learnt anew.
    pub(super) fn take_exit_notices(&mut self) {
        let mut execs = Vec::new();
        for e in self.collector.exited_threads() {
            let t = ThreadId::new(e.tid, ids::ticks_of_ns(e.tid_start));
            if e.tag == exit_record::BYSTANDER {
                let seen = super::bystander(t, e.tid_start, e.owner_start, e.tgid, e.comm);
                self.totals
                    .note_bystander(&crate::aggregation::BystanderSeen {
                        cpu_ns: e.cpu_ns,
                        queued_ns: ids::run_delay(e.queued_ns),
                        at_ns: e.at_ns,
                        exited: true,
                        ..seen
                    });
                continue;
            }
            self.totals
                .note_cpu(t, e.cpu_ns, ids::run_delay(e.queued_ns), e.at_ns);
            // An exit ends the thread's time alive; an exec's or a fork's notice names a
            // process's main thread, which lives on.
            if matches!(e.tag, exit_record::EXITING | exit_record::FREED) {
                self.totals.note_exit(t, e.at_ns);
            }
            match e.tag {
                exit_record::EXITING => {
                    self.exits.exiting.insert(t, e.tgid);
                }
                exit_record::FREED => {
                    self.exits.exiting.remove(&t);
                    self.exits.freeing.insert(t, e.tgid);
                }
                exit_record::EXEC => {
                    let p = ProcId::new(e.tgid, t.start);
                    self.registry.cgroups.note_id(p, e.cgroup_id);
                    // The thread that exec'd is named after its new image.
                    if e.comm[0] != 0 {
                        self.totals.rename(t, e.comm);
                    }
                    execs.push((p, e.at_ns, e.comm));
                }
                exit_record::FORK => {
                    let p = ProcId::new(e.tgid, t.start);
                    self.registry.cgroups.note_id(p, e.cgroup_id);
                    self.registry.names.prime(p);
                    self.registry.exes.prime(p);
                }
                _ => {}
            }
        }
        for (p, at_ns, comm) in execs {
            self.process_exec(p, at_ns, &comm);
        }
        // The old images' V8 layouts unset for the kernel side, the new ones' set.
        self.share_v8_layouts();
    }

    /// After a reading: retires the freed threads `done` (gone from /proc before it), the
    /// processes reaped since, and, when exit notices were lost, the threads /proc shows gone.
    pub(super) fn retire_exited(&mut self, done: Vec<ThreadId>) -> Result<(), SessionError> {
        for t in done {
            self.exits.freeing.remove(&t);
            self.retire_thread(t)?;
        }
        self.reap_dying()?;
        if self.counters.exits_lost != self.exits.exits_lost {
            self.exits.exits_lost = self.counters.exits_lost;
            self.prune_by_proc()?;
        }
        Ok(())
    }

    /// The end of a run: the freed threads still running (a long exit_mmap) are retired as
    /// they stand.
    pub(super) fn retire_freeing(&mut self) -> Result<(), SessionError> {
        for t in std::mem::take(&mut self.exits.freeing).into_keys() {
            self.retire_thread(t)?;
        }
        Ok(())
    }

    /// The processes that exec'd since the last call (the agent relabels them).
    pub fn take_execs(&mut self) -> Vec<ProcId> {
        std::mem::take(&mut self.exits.execs)
    }

    /// A profiled process has exec'd: same pid and start time, a new image. Its name is the
    /// new image's (a container's process is named `node`, not `runc:[2:INIT]`, once runc has
    /// exec'd it): read again, or, for a process gone since (a short container's), the name
    /// the kernel gave it at exec. Its executable is read again unless it was read since the
    /// exec (none if it is gone already).
    /// What was learnt from its old image's memory is dropped:
    /// maps, unwinders, perf map; its threads keep their roles (see `Roles::forget_image`).
    fn process_exec(&mut self, p: ProcId, at_ns: u64, comm: &[u8; COMM_LEN]) {
        self.exits.execs.push(p);
        self.registry.names.forget(p);
        self.registry.names.prime(p);
        if self.registry.names.cached(p).is_none() && comm[0] != 0 {
            self.registry.names.learn(p, &comm_str(comm));
        }
        self.registry.exes.exec(p, at_ns);
        crate::registry::procmaps::forget_shared(p.pid);
        self.registry.roles.forget_image(p, at_ns);
        if let Some(stacks) = self.stacks.as_mut() {
            let read = stacks.forget_image(p);
            // The new image's layout, if its node's is known (none for a process gone).
            stacks.early_v8_frames(p);
            self.keep_reads(p, read);
        }
    }

    /// Keeps what was read of a process whose readers forget it, for the summary.
    fn keep_reads(&mut self, p: ProcId, read: Reads) {
        if self.totals.keep_retired && !read.is_empty() {
            *self.forgotten_reads.entry(p).or_default() += read;
        }
    }

    /// A thread is gone: reads its entries one last time, deletes them, keeps its totals with
    /// its role, and forgets what was cached about it (and about its processes once they are
    /// gone too).
    fn retire_thread(&mut self, thread: ThreadId) -> Result<(), SessionError> {
        // It waits no more: its blockers' entries were read by this poll.
        for k in self.blocked_readings.take_waiter(thread) {
            self.collector.remove_blocked(&k);
        }
        self.blocked_total.holder_comms.remove(&thread);
        for owner in self.totals.owners_of(thread) {
            self.retire_on(owner, thread)?;
            // (Owner 0, "unknown" on kernels without mm->owner, is no process.)
            if owner.pid != 0 && !self.totals.has_own_live_threads(owner) {
                if self.process_alive(owner) {
                    // A zombie not reaped yet: looked at again at each reading.
                    self.exits.dying.insert(owner);
                } else {
                    self.process_gone(owner)?;
                }
            }
        }
        Ok(())
    }

    /// Does /proc show process `p` (a zombie not reaped yet included)?
    fn process_alive(&self, p: ProcId) -> bool {
        self.collector
            .presence(p.pid, ThreadId::new(p.pid, p.start))
            != Presence::Gone
    }

    /// A process is gone: so is its lock, and with it the entries of other processes' threads
    /// that took it (a monitoring agent reading its /proc files).
    fn process_gone(&mut self, owner: ProcId) -> Result<(), SessionError> {
        self.exits.dying.remove(&owner);
        // Out of the kernel's selection (a rename's, a followed child's; the agent drops its
        // own too).
        self.collector.deselect(owner.pid, owner.start);
        for other in self.totals.threads_on(owner) {
            self.retire_on(owner, other)?;
        }
        for k in self.blocked_readings.take_owner(owner) {
            self.collector.remove_blocked(&k);
        }
        if !self.totals.keep_retired {
            self.blocked_total.forget_owner(owner);
        }
        self.forget_process(owner);
        Ok(())
    }

    /// Processes whose own threads are all gone, once they are reaped.
    fn reap_dying(&mut self) -> Result<(), SessionError> {
        let gone: Vec<ProcId> = self
            .exits
            .dying
            .iter()
            .filter(|&&p| !self.process_alive(p))
            .copied()
            .collect();
        for p in gone {
            self.process_gone(p)?;
        }
        Ok(())
    }

    /// Retires `thread`'s entries on `owner`'s lock.
    fn retire_on(&mut self, owner: ProcId, thread: ThreadId) -> Result<(), SessionError> {
        let keys = self.totals.keys_of(owner, thread);
        let mut last = Vec::with_capacity(keys.len());
        for key in &keys {
            if let Some(v) = self.collector.lookup(key)? {
                last.push((*key, v));
            }
        }
        for d in self.totals.update(&last) {
            if let Some(interval) = self.interval.as_mut() {
                interval.add(&d);
            }
        }
        for key in &keys {
            self.collector.remove(key);
        }
        let role = self
            .totals
            .identity(owner, thread)
            .map(|(tgid, comm, fsbase)| {
                self.registry.roles.decide(&SeenThread {
                    owner,
                    thread,
                    tgid,
                    comm,
                    fsbase,
                })
            });
        // The interval's copy too: its last counts keep the role decided while it lived, and
        // nothing asks the registry (which forgets it below) about it again.
        let lived = self.totals.lived_ns(owner, thread);
        if let (Some(w), Some(r)) = (self.interval.as_mut(), role.clone())
            && let Some(t) = w.processes.get_mut(&owner).and_then(|m| m.get_mut(&thread))
        {
            t.role = Some(r);
            t.lived_ns = lived;
        }
        self.totals.retire(owner, thread, role);
        self.registry.roles.forget_thread(owner, thread);
        if let Some(stacks) = self.stacks.as_mut() {
            stacks.forget_thread(thread.tid);
        }
        Ok(())
    }

    /// Drops everything cached about a process that is gone (its name stays in the
    /// report through its retired threads' totals).
    fn forget_process(&mut self, owner: ProcId) {
        // The name is part of the results: it moves to the totals.
        // And to the interval it leaves in: its last report is still to come, and its main
        // thread's name may be another image's (runc's init, before it exec'd node).
        if let Some(name) = self.registry.names.cached(owner) {
            self.totals.name_process(owner, name.to_string());
            if let Some(w) = self.interval.as_mut() {
                w.names.insert(owner, name.to_string());
            }
        }
        // Its cgroup too, in the interval as well (the agent labels it by its cgroup).
        if let Some(c) = self.registry.cgroups.get(owner) {
            self.totals.cgroup_process(owner, c.to_string());
            if let Some(w) = self.interval.as_mut() {
                w.cgroups.insert(owner, c.to_string());
            }
        }
        // And its executable (`compare --by exe`).
        if let Some(e) = self.registry.exes.get(owner) {
            self.totals.exe_process(owner, e.to_string());
            if let Some(w) = self.interval.as_mut() {
                w.exes.insert(owner, e.to_string());
            }
        }
        // And the CPUs it could use (a finding's throughput or latency).
        if let Some(c) = self.registry.cpus.get(owner) {
            self.totals.cpus_process(owner, c);
            if let Some(w) = self.interval.as_mut() {
                w.cpus.insert(owner, c);
            }
        }
        // Its bystanders whose exit notices were lost end with it.
        self.totals
            .end_bystanders_of(owner, self.collector.now_ns());
        self.registry.names.forget(owner);
        self.registry.cgroups.forget(owner);
        self.registry.cpus.forget(owner);
        self.registry.exes.forget(owner);
        let mut read = self.registry.roles.forget_process(owner);
        if let Some(stacks) = self.stacks.as_mut() {
            read += stacks.forget_process(owner);
        }
        self.keep_reads(owner, read);
    }

    /// Looks for exited threads in /proc: only needed when exit notices were lost.
    fn prune_by_proc(&mut self) -> Result<(), SessionError> {
        let dead: Vec<ThreadId> = self
            .totals
            .live_threads()
            .filter(|&(_, tid, tgid)| self.collector.presence(tgid, tid) == Presence::Gone)
            .map(|(_, tid, _)| tid)
            .collect();
        for t in dead {
            self.retire_thread(t)?;
        }
        Ok(())
    }
}
