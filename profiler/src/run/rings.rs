//! The ring buffers the kernel side writes to, drained as records arrive: new threads by
//! the run loop, sampled stacks copied out by a thread of their own ([`Copier`]) and unwound
//! by the run loop from the backlog it fills.

use std::{collections::VecDeque, io, time::Duration};

use tokio::{
    io::{Interest, unix::AsyncFd},
    time::Instant,
};

use aya::maps::{MapData, RingBuf};

use crate::kernel::{Kernel, collector::Collector};

use crate::registry::stacks::Progress;
use crate::run::{SessionError, copier::Copier, profile::Profile};

/// Stack records handled between two looks at the new threads.
const STACK_BATCH: usize = 32;

/// Longest a [`Rings::drain`] works on sampled stacks before handing back to the run loop.
const DRAIN_BUDGET: std::time::Duration = std::time::Duration::from_millis(100);

/// Least time between two looks at the new threads that their own ring's wakeups make. A
/// process starting announces its threads one by one, a few milliseconds apart, and each
/// announcement into an empty ring wakes the run loop (tens of microseconds of CPU a wakeup
/// on a virtual machine): announcements that come within this of the last look wait for
/// the next one together (the ring wakes no one while records wait in it). Isolated ones are
/// read at once. A thread's start routine and name travel in its announcement; what is read
/// from /proc for it (its process's name and executable) may be missed for a process living
/// less than this, as under load. (60 ms cost a short node process, `node -e 0`, a third to
/// a half of its threads' roles: docs/benchmark.md.)
const GATHER: Duration = Duration::from_millis(20);

/// The ring buffers the kernel side writes to: threads seen for the first time, and sampled
/// stacks. Records are drained as they arrive (new threads gathered for at most [`GATHER`]),
/// so that threads are classified while they run and the stacks buffer never fills.
pub struct Rings {
    threads: NewThreads,
    stacks: Option<Stacks>,
}

/// The threads' announcements: their ring, when it was last read, and when the announcements
/// waiting in it are read (their ring woke us within [`GATHER`] of the last read).
struct NewThreads {
    ring: AsyncFd<RingBuf<MapData>>,
    read_at: Instant,
    due: Option<Instant>,
}

/// The sampled stacks: copied out while the run lasts, then (the copier stopped) read from
/// the ring directly; and the records copied, not yet unwound.
struct Stacks {
    copier: Option<Copier>,
    ring: Option<RingBuf<MapData>>,
    backlog: VecDeque<Vec<u8>>,
    /// The most records the ring holds (of the smallest kind, an outcome): what the end of a
    /// run reads of it at most once out of time, as records keep coming while programs run.
    ring_records: usize,
    /// Records handed to the profile to unwind since the start.
    unwound: u64,
}

fn register(ring: RingBuf<MapData>) -> Result<AsyncFd<RingBuf<MapData>>, SessionError> {
    // SAFETY: the ring buffer owns its fd, open and unchanged for the AsyncFd's lifetime.
    unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
        .map_err(|e| SessionError::Events(io::Error::other(e.to_string())))
}

impl Rings {
    /// Takes the collector's ring buffers (stacks only when sampling them) and starts copying
    /// the stacks', looking at their ring `every` so often while records come; must run
    /// inside the async runtime.
    pub fn open(collector: &mut Collector, every: Duration) -> Result<Self, SessionError> {
        let new_threads = register(collector.take_new_threads()?)?;
        let stacks = if collector.stack_sample() > 0 {
            let bytes = crate::kernel::load::stacks_ring_bytes(collector.stack_sample()) as usize;
            let ring = collector.take_stacks()?;
            let copier = Copier::start(ring, collector.take_stacks_wake()?, bytes, every)
                .map_err(SessionError::Events)?;
            Some(Stacks {
                copier: Some(copier),
                ring: None,
                backlog: VecDeque::new(),
                ring_records: bytes / size_of::<profiler_common::SampleDone>(),
                unwound: 0,
            })
        } else {
            None
        };
        Ok(Rings {
            threads: NewThreads {
                ring: new_threads,
                read_at: Instant::now(),
                due: None,
            },
            stacks,
        })
    }

    /// Waits until new threads are announced (at most once in [`GATHER`]) or sampled stacks
    /// were copied. Readiness is cleared before returning, so that records arriving after
    /// the following [`drain`](Self::drain) wake us again. Cancel-safe: announcements
    /// waiting to be gathered are remembered.
    pub async fn ready(&mut self) -> io::Result<()> {
        // Records left by the last drain's budget: at once, after the loop's other work.
        if self.stacks.as_ref().is_some_and(|s| !s.backlog.is_empty()) {
            tokio::task::yield_now().await;
            return Ok(());
        }
        loop {
            let copier = self.stacks.as_mut().and_then(|s| s.copier.as_mut());
            let stacks = async {
                match copier {
                    Some(c) => c.next().await,
                    None => std::future::pending().await,
                }
            };
            let due = self.threads.due;
            tokio::select! {
                g = self.threads.ring.readable(), if due.is_none() => {
                    g?.clear_ready();
                    let at = self.threads.read_at + GATHER;
                    if at <= Instant::now() {
                        return Ok(());
                    }
                    self.threads.due = Some(at);
                }
                () = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => {
                    return Ok(());
                }
                batch = stacks => {
                    if let Some(s) = self.stacks.as_mut() {
                        s.backlog.extend(batch);
                    }
                    return Ok(());
                }
            }
        }
    }

    /// Hands the records available to `profile`, for at most [`DRAIN_BUDGET`]. New threads
    /// come first, and are looked at again between small batches of stacks: a thread must be
    /// classified while it lives, a stack can wait. The budget keeps the run loop turning
    /// (signals, readings, the end of the run) when stacks come faster than they are unwound:
    /// they wait in the backlog, then in the kernel's ring, which drops samples once full
    /// (`lost.stacks`).
    pub fn drain(&mut self, profile: &mut Profile) {
        let t0 = std::time::Instant::now();
        loop {
            self.threads.read(profile);
            let Some(s) = self.stacks.as_mut() else {
                return;
            };
            if s.take(profile) < STACK_BATCH || t0.elapsed() >= DRAIN_BUDGET {
                self.threads.read(profile);
                // (Less than a batch taken: nothing was left to copy from the copier.)
                profile.retire_stacks(s.progress());
                return;
            }
        }
    }
}

impl NewThreads {
    /// Hands the threads announced to `profile`, to be classified while they run; the next
    /// wakeup of their ring is read no sooner than [`GATHER`] from now.
    fn read(&mut self, profile: &mut Profile) {
        let ring = self.ring.get_mut();
        let mut threads = Vec::new();
        while let Some(item) = ring.next() {
            threads.extend(Collector::parse_new_thread(&item));
        }
        profile.note_new_threads(&threads);
        self.read_at = Instant::now();
        self.due = None;
    }
}

impl Stacks {
    /// Unwinds up to [`STACK_BATCH`] records of the backlog (refilled from the copier, or
    /// from the ring once the copier has stopped); returns how many.
    fn take(&mut self, profile: &mut Profile) -> usize {
        if self.backlog.len() < STACK_BATCH {
            self.refill(STACK_BATCH);
        }
        let n = self.backlog.len().min(STACK_BATCH);
        let bytes: usize = self.backlog.iter().take(n).map(Vec::len).sum();
        profile.take_stacks(self.backlog.drain(..n));
        self.unwound += n as u64;
        if let Some(c) = &self.copier {
            c.taken(bytes);
        }
        n
    }

    /// Where the records stand: copied (by the copier; once it has stopped, what was read
    /// of the ring here) and unwound.
    fn progress(&self) -> Progress {
        let read = self.unwound + self.backlog.len() as u64;
        Progress {
            copied: self.copier.as_ref().map_or(Some(read), Copier::copied),
            unwound: self.unwound,
        }
    }

    /// Moves records to the backlog until it holds `want`, or none are left to move.
    fn refill(&mut self, want: usize) {
        if let Some(c) = self.copier.as_mut() {
            while self.backlog.len() < want {
                let Some(b) = c.try_next() else { break };
                self.backlog.extend(b);
            }
        } else if let Some(ring) = self.ring.as_mut() {
            while self.backlog.len() < want {
                let Some(item) = ring.next() else { break };
                self.backlog.push_back(item.to_vec());
            }
        }
    }

    /// Stops the copier: from now on the ring is read here, after what it copied.
    fn stop_copier(&mut self) {
        if let Some(c) = self.copier.take() {
            let (ring, rest) = c.stop();
            self.backlog.extend(rest);
            self.ring = ring;
        }
    }

    /// Out of time at the end: what is left of the backlog, and of the ring at most one
    /// ring's worth of records, read without unwinding (counted as lost stacks).
    fn discard(&mut self, profile: &mut Profile) {
        let mut left: Vec<Vec<u8>> = self.backlog.drain(..).collect();
        if let Some(ring) = self.ring.as_mut() {
            for _ in 0..self.ring_records {
                let Some(item) = ring.next() else { break };
                left.push(item.to_vec());
            }
        }
        profile.discard_stacks(left.into_iter());
    }
}

/// Longest the end of a run unwinds the sampled stacks still in their ring, in the run
/// loop's own CPU time: past it, the rest is read without unwinding and counted as lost
/// (`lost.stacks`). CPU time, not wall time: on a busy host (where contention happens) a
/// wall-clock budget would turn the host's load into lost stacks; [`END_WAIT_MOST`] bounds
/// the wait.
const END_BUDGET: std::time::Duration = std::time::Duration::from_secs(5);

/// Longest the end of a run waits on the unwinding, in wall time, however little CPU it got.
const END_WAIT_MOST: std::time::Duration = std::time::Duration::from_secs(30);

/// The calling thread's CPU time (user and system).
fn thread_cpu() -> std::time::Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    std::time::Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

impl Rings {
    /// The end of a run: every record still in the rings and the backlog, not only what a
    /// [`drain`](Self::drain)'s budget allows (a profiler that fell behind a burst of samples
    /// has a backlog that is part of the run), for at most [`END_BUDGET`] of CPU and
    /// [`END_WAIT_MOST`] of waiting. The copier is stopped first: the ring is read here from
    /// then on.
    pub fn drain_all(&mut self, profile: &mut Profile) {
        let (t0, cpu0) = (std::time::Instant::now(), thread_cpu());
        self.threads.read(profile);
        let Some(s) = self.stacks.as_mut() else {
            return;
        };
        s.stop_copier();
        while s.take(profile) == STACK_BATCH {
            if thread_cpu().saturating_sub(cpu0) >= END_BUDGET || t0.elapsed() >= END_WAIT_MOST {
                s.discard(profile);
                break;
            }
        }
        self.threads.read(profile);
    }
}
