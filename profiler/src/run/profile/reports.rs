//! The reports of a profile: each interval's (which then starts anew) and the run's summary,
//! with what was lost and what the programs cost.

use std::time::{Duration, SystemTime};

use super::Profile;
use crate::{
    aggregation::{Attribution, Window, blocked::Blocked},
    kernel::{
        Kernel,
        collector::{Counters, ProgramStats},
    },
    output::report::{self, Kind, Lost, Meta, Overhead, Report, Uncounted},
    registry::reads::Reads,
    vocab::ids::ProcId,
};

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
        skipped: c.skipped.saturating_sub(base.skipped),
        // What the output could not write: counted by the sink (run/sink.rs).
        output: 0,
        holder_stacks: c.holder_stacks_lost.saturating_sub(base.holder_stacks_lost),
    }
    .with_total()
}

fn uncounted(c: Counters, base: Counters) -> Uncounted {
    Uncounted {
        fork_child: c.fork_child.saturating_sub(base.fork_child),
        flushed_under_lock: c.flush_under_lock.saturating_sub(base.flush_under_lock),
        spilled: c.spilled.saturating_sub(base.spilled),
        blockers_overrun: c.blockers_overrun.saturating_sub(base.blockers_overrun),
        blockers_dropped: (c.blockers_busy + c.blockers_map_full)
            .saturating_sub(base.blockers_busy + base.blockers_map_full),
        not_acquisitions_map_full: c
            .not_acquired_map_full
            .saturating_sub(base.not_acquired_map_full),
    }
}

impl<K: Kernel> Profile<K> {
    /// The kernel side's counters as last read, with the sampled stacks userspace had to
    /// drop counted among the lost ones (see [`StackAttribution::dropped`]).
    ///
    /// [`StackAttribution::dropped`]: crate::registry::stacks::StackAttribution::dropped
    fn counters_now(&self) -> Counters {
        let mut c = self.counters;
        c.stacks_lost += self.stacks.as_ref().map_or(0, |s| s.dropped);
        c.holder_stacks_lost += self.stacks.as_ref().map_or(0, |s| s.holders_dropped);
        c
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

    /// Everything since the start, per process and thread.
    pub fn total_window(&self) -> Window {
        let mut w = self.totals.window();
        if self.collector.blockers() {
            w.blocked = Some(self.blocked_total.clone());
        }
        w
    }

    /// The interval since the previous one, which then starts anew: its activity (every
    /// live thread's time included: the agent's metrics count it), its attribution (resolved
    /// now, while its processes likely live) and the report's metadata.
    pub fn take_interval(&mut self) -> (Window, Attribution, Meta) {
        let (mut window, meta) = self.take_interval_window();
        window.settle(true);
        let attribution = Attribution::of(&mut self.registry, &window);
        (window, attribution, meta)
    }

    /// [`take_interval`](Self::take_interval) before attribution.
    fn take_interval_window(&mut self) -> (Window, Meta) {
        let now = SystemTime::now();
        let overhead = self.overhead(
            self.programs_at_interval.as_deref(),
            self.interval_start,
            now,
        );
        let mut fresh = Window::default();
        fresh.blocked = self.collector.blockers().then(Blocked::default);
        let window = self.interval.replace(fresh).unwrap_or_default();
        let meta = Meta {
            kind: Kind::Interval,
            mode: self.collector.mode(),
            start: self.interval_start,
            end: now,
            lost: lost(self.counters_now(), self.counters_at_interval, 0),
            uncounted: uncounted(self.counters, self.counters_at_interval),
            overhead,
        };
        self.interval_start = now;
        self.counters_at_interval = self.counters_now();
        self.programs_at_interval = self.programs.clone();
        (window, meta)
    }

    /// The report for the interval since the previous one, which it then starts anew.
    /// Processes that only lived through the interval are not in it: they are left out before
    /// attributing it (with ten thousand idle threads, attributing them was most of an idle
    /// profiler's work).
    pub fn interval_report(&mut self) -> Report {
        let (mut window, meta) = self.take_interval_window();
        window.retain_active();
        let attribution = Attribution::of(&mut self.registry, &window);
        let mut r = report::build(&window, &attribution, meta);
        self.label_selection(&mut r);
        // A summary line at most a megabyte per process, whatever its threads and stacks.
        report::budget::bound(&mut r);
        r
    }

    /// Everything lost since the start (cumulative).
    pub fn lost_so_far(&self) -> Lost {
        lost(
            self.counters_now(),
            Counters::default(),
            self.exits.pending(),
        )
    }

    /// The programs' cumulative statistics (empty unless the kernel collects them).
    pub fn program_stats(&self) -> Vec<ProgramStats> {
        self.programs.clone().unwrap_or_default()
    }

    /// The run's summary: everything since the start, exited threads and gone processes
    /// included.
    pub fn summary(&mut self) -> Report {
        let now = SystemTime::now();
        // Our programs were loaded at the start: their statistics count from zero.
        let mut overhead = self.overhead(None, self.start, now);
        if let Some(o) = overhead.as_mut() {
            o.load = self.collector.load_report().cloned();
        }
        let total = self.total_window();
        let attribution = Attribution::of(&mut self.registry, &total);
        let mut r = report::build(
            &total,
            &attribution,
            Meta {
                kind: Kind::Summary,
                mode: self.collector.mode(),
                start: self.start,
                end: now,
                lost: self.lost_so_far(),
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
        for p in &mut r.processes {
            let read = self.reads_of(ProcId::new(p.pid, p.start_ticks));
            p.read_by_profiler = (!read.is_empty()).then_some(read);
        }
        self.label_selection(&mut r);
        // A summary line at most a megabyte per process, whatever its threads and stacks.
        report::budget::bound(&mut r);
        r
    }

    /// What was read of `p` during the run: by its readers now, and before they forgot it.
    fn reads_of(&self, p: ProcId) -> Reads {
        let mut read = self.forgotten_reads.get(&p).copied().unwrap_or_default();
        read += self.registry.roles.reads(p);
        if let Some(stacks) = &self.stacks {
            read += stacks.reads(p);
        }
        read
    }
}
