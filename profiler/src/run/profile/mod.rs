//! What a run accumulates: the kernel's readings folded into totals and intervals, the
//! registry kept current (threads classified while they live, forgotten when gone), and the
//! reports built from them.
//!
//! A profile reads the kernel through the [`Kernel`] trait only: the real collector in a run,
//! a scripted kernel in the unit tests (`tests.rs`), which drive the whole lifecycle
//! (`lifecycle.rs`) with synthetic readings. The reports are in `reports.rs`.

use std::{
    collections::HashMap,
    time::{Duration, SystemTime},
};

use profiler_common::{NewThread, thread_cpu};

use crate::{
    aggregation::{
        BystanderSeen, Totals, Window,
        blocked::{Blocked, BlockedReadings},
        ids_of,
    },
    kernel::{
        Kernel,
        collector::{Collector, Counters, ProgramStats},
    },
    registry::Registry,
    registry::reads::Reads,
    registry::roles::{SeenThread, comm_str, role_by_ids_and_name},
    registry::stacks::{Progress, StackAttribution},
    vocab::ids::{self, ProcId, ThreadId},
};

use crate::run::SessionError;

#[cfg(test)]
mod exec_tests;
mod lifecycle;
mod reports;
mod selection;
#[cfg(test)]
mod tests;

use lifecycle::Exits;
use selection::Selections;

/// Everything a run accumulates between two readings of the kernel maps; `K` is the kernel
/// it reads (the real [`Collector`] unless a test scripts one).
pub struct Profile<K = Collector> {
    pub collector: K,
    totals: Totals,
    /// Activity since the last interval report; None without interval reports.
    interval: Option<Window>,
    pub registry: Registry,
    start: SystemTime,
    interval_start: SystemTime,
    counters_at_interval: Counters,
    counters: Counters,
    /// Threads and processes on their way out (see `lifecycle.rs`).
    exits: Exits,
    /// BPF statistics at the start of the interval and now; None when not collected.
    programs_at_interval: Option<Vec<ProgramStats>>,
    programs: Option<Vec<ProgramStats>>,
    /// With stack sampling: writes by code.
    pub stacks: Option<StackAttribution>,
    polls: u64,
    /// With blockers: the kernel's charged waits as last read, and their run totals.
    blocked_readings: BlockedReadings,
    blocked_total: Blocked,
    /// Why each process is profiled, when the run names its selection.
    selections: Option<Selections>,
    /// What was read of processes forgotten since (gone, or exec'd: their unwinders
    /// dropped), for the summary (`read_by_profiler`); not kept with `forget_history`.
    forgotten_reads: HashMap<ProcId, Reads>,
}

/// Every this many readings, all entries are read (see `Profile::poll`).
const FULL_READ_EVERY: u64 = 30;

/// How long the end of a run waits for exiting threads to be freed (an RCU grace period or
/// two: a few milliseconds, but over a second at times in an emulated guest, where 1 s left
/// a thread of the kernel matrix's churn test in `lost.exit_pending`). Only a run that ends
/// with threads on their way out waits at all.
const EXIT_WAIT: Duration = Duration::from_secs(3);

impl<K: Kernel> Profile<K> {
    /// `intervals`: whether interval reports are wanted (otherwise no interval window is kept).
    pub fn new(collector: K, intervals: bool) -> Self {
        let now = SystemTime::now();
        // Threads' time counts from when the kernel began counting their acquisitions.
        let totals = Totals::starting_at(collector.attached_ns());
        Profile {
            collector,
            totals,
            interval: intervals.then(Window::default),
            registry: Registry::default(),
            start: now,
            interval_start: now,
            counters_at_interval: Counters::default(),
            counters: Counters::default(),
            exits: Exits::default(),
            programs_at_interval: None,
            programs: None,
            stacks: None,
            polls: 0,
            blocked_readings: BlockedReadings::default(),
            blocked_total: Blocked::default(),
            selections: None,
            forgotten_reads: HashMap::new(),
        }
        .with_blocked_interval()
    }

    /// A new interval window charges waits to blockers when the kernel does.
    fn with_blocked_interval(mut self) -> Self {
        if self.collector.blockers()
            && let Some(w) = self.interval.as_mut()
        {
            w.blocked = Some(Blocked::default());
        }
        self
    }

    /// Folds the kernel's charged waits into the interval and the totals.
    fn read_blocked(&mut self) -> Result<(), SessionError> {
        if !self.collector.blockers() {
            return Ok(());
        }
        let snapshot = self.collector.read_blocked()?;
        let mut delta = Blocked::default();
        self.blocked_readings.update(&snapshot, &mut delta);
        // The holders' names while their entries live (a hold's thread may be gone later).
        for (&owner, pairs) in &delta.owners {
            for pair in pairs.keys() {
                if !self.blocked_total.holder_comms.contains_key(&pair.holder)
                    && let Some((_, comm, _)) = self.totals.identity(owner, pair.holder)
                {
                    delta.holder_comms.insert(pair.holder, comm);
                }
            }
        }
        if let Some(w) = self.interval.as_mut() {
            w.blocked.get_or_insert_default().merge(&delta);
        }
        self.blocked_total.merge(&delta);
        Ok(())
    }

    /// Reads the kernel maps and folds what changed into the interval and total windows.
    /// First the kernel flushes every live thread's pending acquisitions (so that a thread
    /// idle since its last acquisition is counted now, not whenever it next locks). `all`:
    /// read every kernel entry, not only those noted as changed (see `Kernel::read_stats`);
    /// done every few readings and at the end.
    pub fn poll(&mut self, all: bool) -> Result<(), SessionError> {
        self.polls += 1;
        let all = all || self.polls.is_multiple_of(FULL_READ_EVERY);
        // Before this reading retires a gone process, which leaves the selection then.
        self.note_selection(all);
        self.collector.flush_pending(all)?;
        self.note_cpu_times();
        // Exit notices before the reading: a freed thread's last acquisitions were flushed
        // and noted before its notice was sent, so the reading below has them.
        self.take_exit_notices();
        // Freed threads that have run their last instruction before the reading below: what
        // they did after their notice (exit_mm, exit_mmap) is in it too.
        let done = self.exited_freeing();
        // Read once per poll: a lost DIRTY note means reading every entry.
        let counters = self.collector.counters()?;
        let all = all || counters.dirty_lost != self.counters.dirty_lost;
        let (totals, interval, registry) =
            (&mut self.totals, &mut self.interval, &mut self.registry);
        self.collector.read_stats(all, |chunk| {
            for d in totals.update(chunk) {
                let (owner, thread) = ids_of(&d.key);
                // Learn a process's name, cgroup and executable and a thread's role while
                // they are alive.
                registry.names.prime(owner);
                registry.cgroups.prime(owner);
                registry.exes.prime(owner);
                registry.cpus.prime(owner);
                let seen = SeenThread {
                    owner,
                    thread,
                    tgid: d.tgid,
                    comm: d.comm,
                    fsbase: d.fsbase,
                };
                registry.roles.observe(&seen, 0);
                if let Some(interval) = interval.as_mut() {
                    interval.add(&d);
                }
            }
        })?;
        // The notices of execs that happened while the reading ran: what it read of a
        // process's new image is labelled after that image (a container's node, not the
        // runtime's init that exec'd it), since the interval is attributed before the next.
        self.take_exit_notices();
        self.counters = counters;
        // The threads' time alive and on CPU, before the exited ones are retired.
        self.totals
            .tick(self.collector.now_ns(), self.interval.as_mut());
        self.read_blocked()?;
        self.programs = self.collector.program_stats();
        self.retire_exited(done)
    }

    /// The CPU times the last iterator pass reported: profiled threads' and bystanders'.
    fn note_cpu_times(&mut self) {
        for c in self.collector.take_cpu_times() {
            let t = ThreadId::new(c.tid, ids::ticks_of_ns(c.tid_start));
            if c.flags & thread_cpu::BYSTANDER != 0 {
                let seen = bystander(t, c.tid_start, c.owner_start, c.tgid, c.comm);
                self.totals.note_bystander(&BystanderSeen {
                    cpu_ns: c.cpu_ns,
                    queued_ns: ids::run_delay(c.queued_ns),
                    at_ns: c.at_ns,
                    ..seen
                });
            } else {
                self.totals
                    .note_cpu(t, c.cpu_ns, ids::run_delay(c.queued_ns), c.at_ns);
            }
        }
    }

    /// The end of a run: the kernel flushes every live thread's pending acquisitions, and
    /// threads that began exiting are waited for (briefly) until they are freed, so that
    /// their last acquisitions are in; then everything is read.
    pub async fn finish(&mut self) -> Result<(), SessionError> {
        self.collector.flush_pending(true)?;
        let waited_since = tokio::time::Instant::now();
        self.take_exit_notices();
        // An exiting thread is freed within an RCU grace period of being reaped, and done
        // with the lock once its exit_mmap is; only an unreaped zombie leader keeps us waiting
        // the whole time.
        while self.exits.waiting(&self.collector) && waited_since.elapsed() < EXIT_WAIT {
            tokio::time::sleep(Duration::from_millis(5)).await;
            self.take_exit_notices();
        }
        // A thread still listed in /proc (an unreaped zombie) was flushed by the iterator;
        // one that is gone from /proc but not freed yet may still hold acquisitions back.
        self.collector.flush_pending(true)?;
        self.take_exit_notices();
        self.exits.count_pending(&self.collector);
        // The last reading retires the freed threads that are done; the rest (still in a
        // long exit_mmap) are retired as they stand: the run is over.
        self.poll(true)?;
        self.retire_freeing()
    }

    /// Classifies the threads announced on the ring buffer, while they run. The exit
    /// notices are taken first, after the announcements were read: an exec's notice is
    /// sent before any announcement of the new image's threads, so a thread of a process
    /// that exec'd (a container's runtime into node) is placed in the new image's maps,
    /// never in the old one's read before the exec (whose C library may not be ours).
    pub fn note_new_threads(&mut self, threads: &[NewThread]) {
        if threads.is_empty() {
            return;
        }
        self.take_exit_notices();
        for t in threads {
            self.note_new_thread(t);
        }
        // Their processes' V8 frame layouts for the kernel side now, before their first
        // samples, where their node's is known (`StackAttribution::early_v8_frames`).
        if let Some(stacks) = self.stacks.as_mut() {
            for t in threads.iter().filter(|t| t.tgid == t.owner) {
                stacks.early_v8_frames(ProcId::new(t.owner, ids::ticks_of_ns(t.owner_start)));
            }
            self.share_v8_layouts();
        }
    }

    fn note_new_thread(&mut self, t: &NewThread) {
        let owner = ProcId::new(t.owner, ids::ticks_of_ns(t.owner_start));
        self.registry.names.prime(owner);
        // Its executable now, before a short process is gone, or again if the process may
        // have exec'd since it was read (a thread started after that).
        self.registry.exes.prime(owner);
        if t.tgid == t.owner {
            self.registry.exes.thread_started(owner, t.tid_start);
        }
        let seen = SeenThread {
            owner,
            thread: ThreadId::new(t.tid, ids::ticks_of_ns(t.tid_start)),
            tgid: t.tgid,
            comm: t.comm,
            fsbase: t.fsbase,
        };
        self.registry.roles.observe(&seen, t.start_routine);
    }

    /// With stack sampling, reads the unwind information of the given processes now.
    pub fn prepare_stacks(&mut self, pids: &[u32]) {
        if self.collector.stack_sample() == 0 {
            return;
        }
        let mut stacks = StackAttribution::at_rate(self.collector.stack_sample());
        for p in pids.iter().filter_map(|&pid| ProcId::of_live(pid)) {
            stacks.prepare(p);
        }
        self.stacks = Some(stacks);
        self.share_v8_frames();
    }

    /// With stack sampling, reads the unwind information of processes selected since the
    /// start (the agent's, as it selects them) now, not at their first sample: the kernel
    /// side copies a process's V8 frames' objects at its samples only once its unwinder has
    /// given their layout, and a first burst sampled before that is named from the heap
    /// hundreds of milliseconds later (a first unwinder of node takes that long to make),
    /// when the young objects of its frames (a new Worker's functions) have moved.
    pub fn prepare_stacks_of(&mut self, processes: &[ProcId]) {
        let Some(stacks) = self.stacks.as_mut() else {
            return;
        };
        for &p in processes {
            stacks.prepare(p);
        }
        self.share_v8_frames();
    }

    /// Folds sampled stack records into the stack attribution, then ends their batch.
    pub fn take_stacks(&mut self, records: impl Iterator<Item = Vec<u8>>) {
        let Some(stacks) = self.stacks.as_mut() else {
            return;
        };
        for r in records {
            stacks.on_record(&r);
        }
        stacks.flush();
        self.share_v8_frames();
    }

    /// Gives the kernel side the V8 frame layouts of the processes whose unwinders were made
    /// or forgotten since (see `StackAttribution::take_v8_frames`), and the functions named
    /// since, whose names it then stops copying.
    pub fn share_v8_frames(&mut self) {
        self.share_v8_layouts();
        if let Some(stacks) = self.stacks.as_mut() {
            for (pid, named) in stacks.take_v8_named() {
                self.collector.note_v8_named(pid, &named);
            }
        }
    }

    /// The layouts only (see [`share_v8_frames`](Self::share_v8_frames)): as threads are
    /// announced and processes exec, without looking at every unwinder for names.
    pub(super) fn share_v8_layouts(&mut self) {
        if let Some(stacks) = self.stacks.as_mut() {
            for (pid, frames) in stacks.take_v8_frames() {
                self.collector.set_v8_frames(pid, frames);
            }
        }
    }

    /// The stacks' records stand `at`: processes and threads gone whose records are all
    /// unwound are forgotten by the stack attribution (see `StackAttribution::retire_due`).
    pub fn retire_stacks(&mut self, at: Progress) {
        if let Some(stacks) = self.stacks.as_mut() {
            stacks.retire_due(at);
        }
    }

    /// Takes sampled stack records without unwinding them (the end of a run, out of time):
    /// counted as lost stacks.
    pub fn discard_stacks(&mut self, records: impl Iterator<Item = Vec<u8>>) {
        let Some(stacks) = self.stacks.as_mut() else {
            return;
        };
        for r in records {
            stacks.discard(&r);
        }
    }

    /// Threads with live entries in the kernel's map, and those entries.
    pub fn live(&self) -> (usize, usize) {
        (
            self.totals.live_threads().count(),
            self.totals.live_entries(),
        )
    }

    /// A long-running agent keeps no history of exited threads (its metrics hold their
    /// counts): memory stays bounded whatever the churn.
    pub fn forget_history(&mut self) {
        self.totals.keep_retired = false;
    }
}

/// A bystander as the kernel side named it, its CPU time and exit yet to be said: its role
/// told by its ids and name (its start routine is not read: that would take its process's
/// lock).
pub(super) fn bystander(
    thread: ThreadId,
    start_ns: u64,
    owner_start_ns: u64,
    tgid: u32,
    comm: [u8; profiler_common::COMM_LEN],
) -> BystanderSeen {
    BystanderSeen {
        thread,
        start_ns,
        owner: ProcId::new(tgid, ids::ticks_of_ns(owner_start_ns)),
        tgid,
        comm,
        role: role_by_ids_and_name(tgid, thread.tid, tgid, &comm_str(&comm), std::process::id()),
        cpu_ns: 0,
        queued_ns: None,
        at_ns: 0,
        exited: false,
    }
}
