//! What a run accumulates: the kernel's readings folded into totals and intervals, the
//! registry kept current (threads classified while they live, forgotten when gone), and the
//! reports built from them.

use std::time::{Duration, SystemTime};

use aya::maps::{MapData, RingBuf};
use profiler_common::exit_record;
use rustc_hash::FxHashMap as HashMap;

use crate::{
    aggregation::Attribution,
    aggregation::{
        Totals, Window,
        blocked::{Blocked, BlockedReadings},
        ids_of,
    },
    kernel::collector::{Collector, Counters, ProgramStats},
    output::report::{self, Kind, Lost, Meta, Overhead, Report, Uncounted},
    registry::Registry,
    registry::stacks::StackAttribution,
    vocab::ids::{self, ProcId, ThreadId},
};

use crate::run::SessionError;

/// Everything a run accumulates between two readings of the kernel maps.
pub struct Profile {
    pub collector: Collector,
    totals: Totals,
    /// Activity since the last interval report; None without interval reports.
    interval: Option<Window>,
    pub registry: Registry,
    start: SystemTime,
    interval_start: SystemTime,
    counters_at_interval: Counters,
    counters: Counters,
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
    dying: std::collections::BTreeSet<ProcId>,
    /// BPF statistics at the start of the interval and now; None when not collected.
    programs_at_interval: Option<Vec<ProgramStats>>,
    programs: Option<Vec<ProgramStats>>,
    /// With stack sampling: writes by code.
    pub stacks: Option<StackAttribution>,
    polls: u64,
    /// With blockers: the kernel's charged waits as last read, and their run totals.
    blocked_readings: BlockedReadings,
    blocked_total: Blocked,
    /// Processes that exec'd since [`Profile::take_execs`] was last called.
    execs: Vec<ProcId>,
}

/// Every this many readings, all entries are read (see `Profile::poll`).
const FULL_READ_EVERY: u64 = 30;

/// How long the end of a run waits for exiting threads to be freed (an RCU grace period or
/// two, normally a few milliseconds).
const EXIT_WAIT: Duration = Duration::from_secs(1);

fn lost(c: Counters, base: Counters, exit_pending: u64) -> Lost {
    Lost {
        events: 0,
        map_full: c.map_full.saturating_sub(base.map_full),
        stacks: c.stacks_lost.saturating_sub(base.stacks_lost),
        nested: c.nested.saturating_sub(base.nested),
        no_state: c.no_state.saturating_sub(base.no_state),
        ring_full: c.ring_full.saturating_sub(base.ring_full),
        exit_flush: c.exit_flush.saturating_sub(base.exit_flush),
        exit_pending,
    }
    .with_total()
}

fn uncounted(c: Counters, base: Counters) -> Uncounted {
    Uncounted {
        fork_child: c.fork_child.saturating_sub(base.fork_child),
        flushed_under_lock: c.flush_under_lock.saturating_sub(base.flush_under_lock),
        blockers_overrun: c.blockers_overrun.saturating_sub(base.blockers_overrun),
        blockers_dropped: (c.blockers_busy + c.blockers_map_full)
            .saturating_sub(base.blockers_busy + base.blockers_map_full),
        not_acquisitions_map_full: c
            .not_acquired_map_full
            .saturating_sub(base.not_acquired_map_full),
    }
}

impl Profile {
    /// `intervals`: whether interval reports are wanted (otherwise no interval window is kept).
    pub fn new(collector: Collector, intervals: bool) -> Self {
        let now = SystemTime::now();
        // Threads' time counts from when the kernel began counting their acquisitions.
        let totals = Totals::starting_at(collector.attached_ns);
        Profile {
            collector,
            totals,
            interval: intervals.then(Window::default),
            registry: Registry::default(),
            start: now,
            interval_start: now,
            counters_at_interval: Counters::default(),
            counters: Counters::default(),
            exits_lost: 0,
            exiting: HashMap::default(),
            freeing: HashMap::default(),
            exit_pending: 0,
            dying: Default::default(),
            programs_at_interval: None,
            programs: None,
            stacks: None,
            polls: 0,
            blocked_readings: BlockedReadings::default(),
            blocked_total: Blocked::default(),
            execs: Vec::new(),
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
    /// read every kernel entry, not only those noted as changed (see
    /// `Collector::read_stats`); done every few readings and at the end.
    pub fn poll(&mut self, all: bool) -> Result<(), SessionError> {
        self.polls += 1;
        let all = all || self.polls.is_multiple_of(FULL_READ_EVERY);
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
                // Learn a process's name and cgroup and a thread's role while they are alive.
                registry.names.prime(owner);
                registry.cgroups.prime(owner);
                registry
                    .roles
                    .observe(owner, thread, d.tgid, &d.comm, d.fsbase);
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
        self.totals.tick(ids::boot_ns(), self.interval.as_mut());
        self.read_blocked()?;
        self.programs = self
            .collector
            .bpf_stats_on()
            .then(|| self.collector.program_stats());
        for t in done {
            self.freeing.remove(&t);
            self.retire_thread(t)?;
        }
        self.reap_dying()?;
        if self.counters.exits_lost != self.exits_lost {
            self.exits_lost = self.counters.exits_lost;
            self.prune_by_proc()?;
        }
        Ok(())
    }

    /// The CPU times the last iterator pass reported.
    fn note_cpu_times(&mut self) {
        for c in self.collector.take_cpu_times() {
            let t = ThreadId::new(c.tid, ids::ticks_of_ns(c.tid_start));
            self.totals.note_cpu(t, c.cpu_ns, c.at_ns);
        }
    }

    /// The freed threads /proc shows gone (or zombies).
    fn exited_freeing(&self) -> Vec<ThreadId> {
        self.freeing
            .iter()
            .filter(|&(&t, &tgid)| ids::thread_has_exited(tgid, t))
            .map(|(&t, _)| t)
            .collect()
    }

    /// Drains the exit notices: remembers exiting and freed threads; a process that exec'd is
    /// learnt anew.
    fn take_exit_notices(&mut self) {
        let mut execs = Vec::new();
        for e in self.collector.exited_threads() {
            let t = ThreadId::new(e.tid, ids::ticks_of_ns(e.tid_start));
            self.totals.note_cpu(t, e.cpu_ns, e.at_ns);
            self.totals.note_exit(t, e.at_ns);
            match e.tag {
                exit_record::EXITING => {
                    self.exiting.insert(t, e.tgid);
                }
                exit_record::FREED => {
                    self.exiting.remove(&t);
                    self.freeing.insert(t, e.tgid);
                }
                exit_record::EXEC => {
                    let p = ProcId::new(e.tgid, t.start);
                    self.registry.cgroups.note_id(p, e.cgroup_id);
                    execs.push(p);
                }
                exit_record::FORK => {
                    let p = ProcId::new(e.tgid, t.start);
                    self.registry.cgroups.note_id(p, e.cgroup_id);
                    self.registry.names.prime(p);
                }
                _ => {}
            }
        }
        for p in execs {
            self.process_exec(p);
        }
    }

    /// The processes that exec'd since the last call (the agent relabels them).
    pub fn take_execs(&mut self) -> Vec<ProcId> {
        std::mem::take(&mut self.execs)
    }

    /// A profiled process has exec'd: same pid and start time, a new image. Its name is read
    /// again (a container's process is named `node`, not `runc:[2:INIT]`, once runc has
    /// exec'd it), and what was learnt from its old image is dropped: thread roles, maps,
    /// unwinders, perf map.
    fn process_exec(&mut self, p: ProcId) {
        self.execs.push(p);
        self.registry.names.forget(p);
        self.registry.names.prime(p);
        self.registry
            .roles
            .forget_image(p, |t| !ids::thread_has_exited(p.pid, t));
        if let Some(stacks) = self.stacks.as_mut() {
            stacks.forget_process(p);
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
                if ids::is_alive(owner) {
                    // A zombie not reaped yet: looked at again at each reading.
                    self.dying.insert(owner);
                } else {
                    self.process_gone(owner)?;
                }
            }
        }
        Ok(())
    }

    /// A process is gone: so is its lock, and with it the entries of other processes' threads
    /// that took it (a monitoring agent reading its /proc files).
    fn process_gone(&mut self, owner: ProcId) -> Result<(), SessionError> {
        self.dying.remove(&owner);
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
            .dying
            .iter()
            .filter(|p| !ids::is_alive(**p))
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
                self.registry
                    .roles
                    .decide(owner, thread, tgid, &comm, fsbase)
            });
        // The interval's copy too: its last counts keep the role decided while it lived, and
        // nothing asks the registry (which forgets it below) about it again.
        if let (Some(w), Some(r)) = (self.interval.as_mut(), role.clone())
            && let Some(t) = w.processes.get_mut(&owner).and_then(|m| m.get_mut(&thread))
        {
            t.role = Some(r);
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
        self.registry.names.forget(owner);
        self.registry.cgroups.forget(owner);
        self.registry.roles.forget_process(owner);
        if let Some(stacks) = self.stacks.as_mut() {
            stacks.forget_process(owner);
        }
    }

    /// Looks for exited threads in /proc: only needed when exit notices were lost.
    fn prune_by_proc(&mut self) -> Result<(), SessionError> {
        let dead: Vec<ThreadId> = self
            .totals
            .live_threads()
            .filter(|&(_, tid, tgid)| !ids::thread_is_alive(tgid, tid))
            .map(|(_, tid, _)| tid)
            .collect();
        for t in dead {
            self.retire_thread(t)?;
        }
        Ok(())
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
        while (!self.exiting.is_empty() || self.exited_freeing().len() < self.freeing.len())
            && waited_since.elapsed() < EXIT_WAIT
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
            self.take_exit_notices();
        }
        // A thread still listed in /proc (an unreaped zombie) was flushed by the iterator;
        // one that is gone from /proc but not freed yet may still hold acquisitions back.
        self.collector.flush_pending(true)?;
        self.take_exit_notices();
        self.exit_pending = self
            .exiting
            .iter()
            .filter(|(t, tgid)| {
                !std::path::Path::new(&format!("/proc/{tgid}/task/{}", t.tid)).exists()
            })
            .count() as u64;
        // The last reading retires the freed threads that are done; the rest (still in a
        // long exit_mmap) are retired as they stand: the run is over.
        self.poll(true)?;
        for t in std::mem::take(&mut self.freeing).into_keys() {
            self.retire_thread(t)?;
        }
        Ok(())
    }

    /// Our cost since the reading `since` (None: since our programs were loaded, when their
    /// statistics started from zero); None when the kernel does not collect statistics.
    fn overhead(
        &self,
        since: Option<&[ProgramStats]>,
        start: SystemTime,
        end: SystemTime,
    ) -> Option<Overhead> {
        let cur = self.programs.as_deref()?;
        let wall = end.duration_since(start).unwrap_or_default();
        Some(Overhead::between(cur, since.unwrap_or(&[]), wall))
    }

    /// Classifies the threads announced on the ring buffer, while they run.
    pub fn classify_new_threads(&mut self, ring: &mut RingBuf<MapData>) {
        while let Some(item) = ring.next() {
            if let Some(t) = Collector::parse_new_thread(&item) {
                let owner = ProcId::new(t.owner, ids::ticks_of_ns(t.owner_start));
                self.registry.names.prime(owner);
                self.registry.roles.observe(
                    owner,
                    ThreadId::new(t.tid, ids::ticks_of_ns(t.tid_start)),
                    t.tgid,
                    &t.comm,
                    t.fsbase,
                );
            }
        }
    }

    /// Everything since the start, per process and thread.
    pub fn total_window(&self) -> Window {
        let mut w = self.totals.window();
        if self.collector.blockers() {
            w.blocked = Some(self.blocked_total.clone());
        }
        w
    }

    /// With stack sampling, reads the unwind information of the given processes now.
    pub fn prepare_stacks(&mut self, pids: &[u32]) {
        if self.collector.stack_sample() == 0 {
            return;
        }
        let mut stacks = StackAttribution::default();
        for p in pids.iter().filter_map(|&pid| ProcId::of_live(pid)) {
            stacks.prepare(p);
        }
        self.stacks = Some(stacks);
    }

    /// Folds up to `max` sampled stack records into the stack attribution; returns how many.
    pub fn take_stacks(&mut self, ring: &mut RingBuf<MapData>, max: usize) -> usize {
        let Some(stacks) = self.stacks.as_mut() else {
            return 0;
        };
        let mut n = 0;
        while n < max {
            let Some(item) = ring.next() else { break };
            stacks.on_record(&item);
            n += 1;
        }
        stacks.flush();
        n
    }

    /// The interval since the previous one, which then starts anew: its activity, its
    /// attribution (resolved now, while its processes likely live) and the report's metadata.
    pub fn take_interval(&mut self) -> (Window, Attribution, Meta) {
        let now = SystemTime::now();
        let overhead = self.overhead(
            self.programs_at_interval.as_deref(),
            self.interval_start,
            now,
        );
        let fresh = Window {
            blocked: self.collector.blockers().then(Blocked::default),
            ..Window::default()
        };
        let window = self.interval.replace(fresh).unwrap_or_default();
        let attribution = Attribution::of(&mut self.registry, &window);
        let meta = Meta {
            kind: Kind::Interval,
            start: self.interval_start,
            end: now,
            lost: lost(self.counters, self.counters_at_interval, 0),
            uncounted: uncounted(self.counters, self.counters_at_interval),
            overhead,
        };
        self.interval_start = now;
        self.counters_at_interval = self.counters;
        self.programs_at_interval = self.programs.clone();
        (window, attribution, meta)
    }

    /// The report for the interval since the previous one, which it then starts anew.
    pub fn interval_report(&mut self) -> Report {
        let (window, attribution, meta) = self.take_interval();
        report::build(&window, &attribution, meta)
    }

    /// Everything lost since the start (cumulative).
    pub fn lost_so_far(&self) -> Lost {
        lost(self.counters, Counters::default(), self.exit_pending)
    }

    /// The programs' cumulative statistics (empty unless the kernel collects them).
    pub fn program_stats(&self) -> Vec<ProgramStats> {
        self.programs.clone().unwrap_or_default()
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

    pub fn summary(&mut self) -> Report {
        let now = SystemTime::now();
        // Our programs were loaded at the start: their statistics count from zero.
        let mut overhead = self.overhead(None, self.start, now);
        if let Some(o) = overhead.as_mut() {
            o.load = Some(self.collector.load_report.clone());
        }
        let total = self.total_window();
        let attribution = Attribution::of(&mut self.registry, &total);
        let mut r = report::build(
            &total,
            &attribution,
            Meta {
                kind: Kind::Summary,
                start: self.start,
                end: now,
                lost: lost(self.counters, Counters::default(), self.exit_pending),
                uncounted: uncounted(self.counters, Counters::default()),
                overhead,
            },
        );
        if let Some(stacks) = &mut self.stacks {
            stacks.symbolize();
            let (t, n) = stacks.work;
            let per = |d: Duration| (d.as_secs_f64() * 1e7 / n.max(1) as f64).round() / 10.0;
            r.stack_work = Some(report::StackWork {
                stacks: n,
                us_per_stack: per(t),
                v8_us_per_stack: per(stacks.v8_work),
            });
            report::add_stacks(&mut r, stacks, self.collector.stack_sample());
        }
        r
    }
}
