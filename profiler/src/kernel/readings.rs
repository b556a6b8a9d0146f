//! The kernel as a profile reads it: what [`Collector`](super::collector::Collector) offers
//! the run's lifecycle (counters and exit notices in, final readings and deletions out), and
//! /proc's word on who is still alive. Everything crossing it is plain data (the records of
//! `profiler_common`, [`Counters`], ids), so that the profile's lifecycle (retirement, pid
//! reuse, eviction) runs in unit tests on a scripted kernel (`kernel::fake`).
//!
//! A trait rather than one "reading" value: the entries are handed over a batch at a time
//! (no copy of a map of tens of thousands of threads), and retiring a thread needs the kernel
//! between two steps (its entries read one last time, then deleted).

use profiler_common::{
    BlockedKey, BlockedVal, ExitedThread, StatsKey, ThreadCpu, ThreadStats, V8Frames, V8Named,
};

use std::io;

use aya::programs::{Iter, ProgramError, RawTracePoint};
use profiler_common::counter;

use super::{
    batch,
    collector::{
        Collector, CollectorError, Counters, IDLE_POLLS, MAX_LOOKUPS, ProgramStats,
        bpf_stats_enabled, error_chain, read_record,
    },
    load::LoadReport,
    programs,
    selection::Selected,
};
use crate::vocab::{
    Mode,
    ids::{self, Presence, ThreadId},
};

/// The kernel side of a run, as its profile uses it.
pub trait Kernel {
    /// When the programs were attached (boot-time clock, ns): the kernel counts from then.
    fn attached_ns(&self) -> u64;

    /// Are waits charged to their blockers (`read_blocked` has entries)?
    fn blockers(&self) -> bool;

    /// One in how many writes has its stack sampled (0: none).
    fn stack_sample(&self) -> u32;

    /// What the programs measure.
    fn mode(&self) -> Mode {
        Mode::Full
    }

    /// Hands every live thread's pending acquisitions over to the map, now if `always`, else
    /// when some thread has any (see `Collector`'s).
    fn flush_pending(&mut self, always: bool) -> Result<(), CollectorError>;

    /// Profiled threads' CPU times reported since the last call, oldest first.
    fn take_cpu_times(&mut self) -> Vec<ThreadCpu>;

    /// Exit (and exec, fork) notices since the last call, in the order they were sent.
    fn exited_threads(&mut self) -> Vec<ExitedThread>;

    /// The health counters, cumulative since the start.
    fn counters(&self) -> Result<Counters, CollectorError>;

    /// Hands `f` the entries (cumulative) that changed since the previous reading, or every
    /// entry if `all`, a batch at a time.
    fn read_stats(
        &mut self,
        all: bool,
        f: impl FnMut(&[(StatsKey, ThreadStats)]),
    ) -> Result<(), CollectorError>;

    /// One entry as it stands (None: not in the map).
    fn lookup(&self, key: &StatsKey) -> Result<Option<ThreadStats>, CollectorError>;

    /// Deletes an entry whose thread is retired, after its final reading.
    fn remove(&mut self, key: &StatsKey);

    /// Every (waiter, holder) entry of the blockers' map (cumulative; empty without
    /// blockers).
    fn read_blocked(&self) -> Result<Vec<(BlockedKey, BlockedVal)>, CollectorError>;

    /// Deletes a blockers' entry whose waiter or lock is gone, after its final reading.
    fn remove_blocked(&mut self, key: &BlockedKey);

    /// Drops process (`pid`, start `ticks`) from the kernel's selection, if it is there under
    /// that start time.
    fn deselect(&mut self, pid: u32, ticks: u64);

    /// Sets (None: unsets) where process `pid`'s V8 frames keep their slots: its samples then
    /// carry copies of their frames' objects (see `profiler_common::V8Frames`). Best effort:
    /// without it, those objects are read from the process.
    fn set_v8_frames(&mut self, pid: u32, frames: Option<V8Frames>);

    /// Notes SharedFunctionInfos (tagged addresses) of process `pid` that userspace has named:
    /// their names are no longer copied at the samples (see `profiler_common::V8Named`). Best
    /// effort: a name not noted is copied again.
    fn note_v8_named(&mut self, pid: u32, sfis: &[u64]);

    /// The processes in the kernel's selection now, with how each came in (none when the
    /// run selects none: system-wide, or by `--pid` alone).
    fn selection(&self) -> Vec<Selected>;

    /// The programs' cumulative run statistics; None when the kernel does not collect them.
    fn program_stats(&self) -> Option<Vec<ProgramStats>>;

    /// Where attach time went.
    fn load_report(&self) -> Option<&LoadReport>;

    /// What /proc shows of thread `t` of process `pid` now.
    fn presence(&self, pid: u32, t: ThreadId) -> Presence {
        ids::presence(pid, t)
    }

    /// Now, on the clock of the kernel's start times and notices (boot-time, ns).
    fn now_ns(&self) -> u64 {
        ids::boot_ns()
    }
}

/// The real kernel: the loaded programs' maps and rings.
impl Kernel for Collector {
    fn attached_ns(&self) -> u64 {
        self.attached_ns
    }

    fn stack_sample(&self) -> u32 {
        self.stack_sample
    }

    fn mode(&self) -> Mode {
        self.mode
    }

    /// Hands `f` the kernel entries that changed since the previous reading (`all`: every
    /// entry), a batch at a time. Idle threads cost nothing: the eBPF side notes each entry's
    /// first change per epoch on DIRTY, and only those are looked up; the whole map is read
    /// (batched) when asked (the caller asks too when `Counters::dirty_lost` grew) or when
    /// many changed.
    fn read_stats(
        &mut self,
        all: bool,
        mut f: impl FnMut(&[(StatsKey, ThreadStats)]),
    ) -> Result<(), CollectorError> {
        // Drain first, then start a new epoch: a change noted after the drain stays on the
        // ring for the next reading; a change noted before it is read below. The eBPF side
        // loads the epoch after a full barrier that follows its update, and we read entries
        // after a full barrier that follows the new epoch: a change is either seen below or
        // noted anew under the new epoch.
        let mut keys = Vec::new();
        while let Some(item) = self.dirty.next() {
            if let Some(key) = read_record::<StatsKey>(&item) {
                keys.push(key);
            }
        }
        self.epoch = self.epoch.wrapping_add(1).max(1);
        self.epoch_map
            .set(0, self.epoch, 0)
            .map_err(|e| CollectorError::Map("EPOCH", error_chain(&e)))?;
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        if all || keys.len() > MAX_LOOKUPS {
            return self.read_all(f);
        }
        keys.sort_unstable();
        keys.dedup();
        for chunk in keys.chunks(batch::CHUNK) {
            self.changed.clear();
            for key in chunk {
                if let Some(v) = self.lookup(key)? {
                    self.changed.push((*key, v));
                }
            }
            f(&self.changed);
        }
        Ok(())
    }

    /// One entry (None: deleted since, e.g. an exited thread's).
    fn lookup(&self, key: &StatsKey) -> Result<Option<ThreadStats>, CollectorError> {
        match self.stats.get(key, 0) {
            Ok(v) => Ok(Some(v)),
            Err(aya::maps::MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(CollectorError::Map("STATS", error_chain(&e))),
        }
    }

    /// Hands every live thread's accumulators over to the kernel map (the flush iterator:
    /// one pass over the machine's tasks, in the kernel), and collects the CPU times of the
    /// profiled threads that ran since the last pass (see [`Kernel::take_cpu_times`]).
    /// The pass is skipped while no thread has anything for it (a pass over 10,000 idle
    /// threads costs about 10 ms), but made at least every [`IDLE_POLLS`] readings (CPU times
    /// of threads that ran without taking a lock) and whenever `always` (the end of a run).
    fn flush_pending(&mut self, always: bool) -> Result<(), CollectorError> {
        let Some(iter_name) = self.iterator else {
            return Ok(());
        };
        let active = self.activity.get(&0, 0).unwrap_or(1) != 0;
        self.idle_polls += 1;
        let periodic = self.idle_polls >= IDLE_POLLS;
        if !active && !always && !periodic {
            return Ok(());
        }
        self.idle_polls = 0;
        // Cleared before the pass: what is noted during it is seen by the next reading.
        self.activity
            .set(0, 0, 0)
            .map_err(|e| CollectorError::Map("ACTIVITY", error_chain(&e)))?;
        // Contention mode: the pass notes every profiled process's lock at the start, when
        // the selection added processes (both ask with a set flag) and every few readings.
        let note = self.mode == Mode::Contention
            && (periodic || always || self.note_locks.get(&0, 0).unwrap_or(0) != 0);
        self.note_locks
            .set(0, note as u32, 0)
            .map_err(|e| CollectorError::Map("NOTE_LOCKS", error_chain(&e)))?;
        let iter: &mut Iter = self
            .ebpf
            .program_mut(iter_name)
            .ok_or_else(|| CollectorError::Load(format!("program {iter_name} missing")))?
            .try_into()
            .map_err(|e: ProgramError| CollectorError::Load(error_chain(&e)))?;
        let link = iter
            .attach()
            .map_err(|e| CollectorError::Map("flush iterator", error_chain(&e)))?;
        let link = iter
            .take_link(link)
            .map_err(|e| CollectorError::Map("flush iterator", error_chain(&e)))?;
        let mut file = link
            .into_file()
            .map_err(|e| CollectorError::Map("flush iterator", error_chain(&e)))?;
        // Reading to the end runs the program over every task; it writes CPU time records.
        // Full mode's pass holds threads' claims: not to be preempted holding one.
        let _unpreempted = (self.mode == Mode::Full).then(super::priority::Unpreempted::new);
        self.iter_out.clear();
        io::Read::read_to_end(&mut file, &mut self.iter_out)
            .map_err(|e| CollectorError::Map("flush iterator", e.to_string()))?;
        drop(_unpreempted);
        let records = self.iter_out.chunks_exact(size_of::<ThreadCpu>());
        self.cpu_times
            .extend(records.map(bytemuck::pod_read_unaligned::<ThreadCpu>));
        Ok(())
    }

    /// Profiled threads' CPU times reported since the last call, oldest first.
    fn take_cpu_times(&mut self) -> Vec<ThreadCpu> {
        std::mem::take(&mut self.cpu_times)
    }

    /// Exit notices since the last call.
    fn exited_threads(&mut self) -> Vec<ExitedThread> {
        let mut out = Vec::new();
        while let Some(item) = self.exited.next() {
            if let Some(e) = read_record::<ExitedThread>(&item) {
                out.push(e);
            }
        }
        out
    }

    /// Are waits charged to their blockers?
    fn blockers(&self) -> bool {
        self.blockers
    }

    /// Every (waiter, holder) entry of the blockers map (small: one per pair of threads
    /// that made one another wait, deleted with the waiter or the lock), batched: read at
    /// every poll, entry by entry it took two syscalls an entry.
    fn read_blocked(&self) -> Result<Vec<(BlockedKey, BlockedVal)>, CollectorError> {
        if !self.blockers {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        if self.batch_supported {
            let mut buf = batch::Buffers::default();
            match batch::read_all(&self.blocked, &mut buf, &mut |b| out.extend_from_slice(b)) {
                Ok(()) => return Ok(out),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => out.clear(),
                Err(e) => return Err(CollectorError::Map("BLOCKED", e.to_string())),
            }
        }
        for item in self.blocked.iter() {
            match item {
                Ok(kv) => out.push(kv),
                // Deleted while we walked the map: fine.
                Err(aya::maps::MapError::KeyNotFound) => {}
                Err(e) => return Err(CollectorError::Map("BLOCKED", error_chain(&e))),
            }
        }
        Ok(out)
    }

    /// Deletes a blockers entry whose waiter or lock is gone, after its final reading.
    fn remove_blocked(&mut self, key: &BlockedKey) {
        let _ = self.blocked.remove(key);
    }

    /// Deletes an entry whose thread has exited, after its final reading was taken.
    fn remove(&mut self, key: &StatsKey) {
        // Already gone is fine.
        let _ = self.stats.remove(key);
    }

    fn counters(&self) -> Result<Counters, CollectorError> {
        let read = |idx: u32| self.read_counter(idx);
        let rescued = read(counter::RESCUED)?;
        Ok(Counters {
            map_full: read(counter::MAP_FULL)?,
            nested: read(counter::NESTED)?,
            no_state: read(counter::NO_STATE)?,
            stacks_lost: read(counter::STACKS_LOST)?,
            dirty_lost: read(counter::DIRTY_LOST)?,
            exits_lost: read(counter::EXITS_LOST)?,
            ring_full: read(counter::RING_FULL)?,
            flush_under_lock: read(counter::FLUSH_UNDER_LOCK)?,
            spilled: read(counter::SPILLED)?,
            holder_stacks_lost: read(counter::HOLDER_STACKS_LOST)?,
            exit_flush: read(counter::EXIT_FLUSH)?,
            fork_child: read(counter::FORK_CHILD)?,
            not_acquired_map_full: read(counter::NOT_ACQUIRED_MAP_FULL)?,
            blockers_overrun: read(counter::BLOCKERS_OVERRUN)?,
            blockers_busy: read(counter::BLOCKERS_BUSY)?,
            blockers_map_full: read(counter::BLOCKERS_MAP_FULL)?,
            rescued,
            skipped: super::skipped::skipped(
                &self.ebpf,
                self.kernel.preemptible_tracepoints,
                rescued,
            ),
        })
    }

    fn deselect(&mut self, pid: u32, ticks: u64) {
        Collector::deselect(self, pid, ticks)
    }

    fn set_v8_frames(&mut self, pid: u32, frames: Option<V8Frames>) {
        let set = super::collector::map_of(&mut self.ebpf, "V8_FRAMES").and_then(
            |mut m: aya::maps::HashMap<&mut aya::maps::MapData, u32, V8Frames>| {
                let r = match frames {
                    Some(f) => m.insert(pid, f, 0),
                    // Already gone is fine.
                    None => m.remove(&pid).or(Ok(())),
                };
                r.map_err(|e| CollectorError::Map("V8_FRAMES", super::collector::error_chain(&e)))
            },
        );
        // Full (8,192 processes at once): that process's objects are read, as without it.
        if let Err(e) = set {
            log::debug!("V8 frames of {pid} not set: {e}");
        }
    }

    fn note_v8_named(&mut self, pid: u32, sfis: &[u64]) {
        let Ok(mut m) = super::collector::map_of::<
            aya::maps::HashMap<&mut aya::maps::MapData, V8Named, u8>,
        >(&mut self.ebpf, "V8_NAMED") else {
            return;
        };
        for &sfi in sfis {
            let key = V8Named {
                tgid: pid,
                _pad: 0,
                sfi,
            };
            // An LRU map: full, it forgets the least recently used.
            if let Err(e) = m.insert(key, 1, 0) {
                log::debug!("V8 function {sfi:#x} of {pid} not noted: {e}");
                return;
            }
        }
    }

    fn selection(&self) -> Vec<Selected> {
        Collector::selection(self)
    }

    fn program_stats(&self) -> Option<Vec<ProgramStats>> {
        self.bpf_stats_on().then(|| self.run_stats())
    }

    fn load_report(&self) -> Option<&LoadReport> {
        Some(&self.load_report)
    }
}

/// Helpers of the reading above.
impl Collector {
    /// Hands every kernel entry to `f`, a batch at a time: with tens of thousands of threads,
    /// neither a copy of the whole map nor a syscall per entry.
    fn read_all(
        &mut self,
        mut f: impl FnMut(&[(StatsKey, ThreadStats)]),
    ) -> Result<(), CollectorError> {
        if self.batch_supported {
            match batch::read_all(&self.stats, &mut self.batch, &mut f) {
                Ok(()) => return Ok(()),
                // Before Linux 5.6, or a map type without batch support: entry by entry.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => self.batch_supported = false,
                Err(e) => return Err(CollectorError::Map("STATS", e.to_string())),
            }
        }
        let mut chunk = Vec::with_capacity(batch::CHUNK);
        for item in self.stats.iter() {
            match item {
                Ok(kv) => chunk.push(kv),
                // An entry deleted while we iterate: it is gone, skip it.
                Err(aya::maps::MapError::KeyNotFound) => continue,
                Err(e) => return Err(CollectorError::Map("STATS", error_chain(&e))),
            }
            if chunk.len() == batch::CHUNK {
                f(&chunk);
                chunk.clear();
            }
        }
        f(&chunk);
        Ok(())
    }

    fn read_counter(&self, idx: u32) -> Result<u64, CollectorError> {
        let v = self
            .counters
            .get(&idx, 0)
            .map_err(|e| CollectorError::Map("COUNTERS", error_chain(&e)))?;
        Ok(v.iter().sum())
    }

    /// Is the kernel collecting BPF statistics (ours through `--bpf-stats`, or the sysctl)?
    /// The sysctl does not show statistics enabled through a BPF_ENABLE_STATS fd.
    fn bpf_stats_on(&self) -> bool {
        self._stats_fd.is_some() || bpf_stats_enabled()
    }

    /// Run counts and run time per program, from the kernel's BPF statistics.
    fn run_stats(&self) -> Vec<ProgramStats> {
        programs::lock_programs(&self.kernel, self.floor, self.mode)
            .into_iter()
            .rev()
            .filter_map(|(_, name)| {
                let prog: &RawTracePoint = self.ebpf.program(name)?.try_into().ok()?;
                let info = prog.info().ok()?;
                Some(ProgramStats {
                    name,
                    run_count: info.run_count(),
                    run_time: info.run_time(),
                })
            })
            .collect()
    }
}
