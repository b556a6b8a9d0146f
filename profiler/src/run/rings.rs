//! The ring buffers the kernel side writes to, drained as records arrive.

use std::io::{self};

use tokio::io::{Interest, unix::AsyncFd};

use aya::maps::{MapData, RingBuf};

use crate::kernel::{Kernel, collector::Collector};

use crate::run::{SessionError, profile::Profile};

/// Stack records handled between two looks at the new threads.
const STACK_BATCH: usize = 32;

/// Longest a [`Rings::drain`] works on sampled stacks before handing back to the run loop.
const DRAIN_BUDGET: std::time::Duration = std::time::Duration::from_millis(100);

/// How often the sampled stacks' ring is drained: the kernel side wakes us only once it is
/// a quarter full (a wakeup per sample costs the traced thread microseconds).
const STACKS_EVERY: std::time::Duration = std::time::Duration::from_millis(25);

/// The ring buffers the kernel side writes to: threads seen for the first time, and sampled
/// stacks. Records are drained as soon as they arrive, so that threads are classified while
/// they run and the stacks buffer never fills.
pub struct Rings {
    new_threads: AsyncFd<RingBuf<MapData>>,
    stacks: Option<AsyncFd<RingBuf<MapData>>>,
}

fn register(ring: RingBuf<MapData>) -> Result<AsyncFd<RingBuf<MapData>>, SessionError> {
    // SAFETY: the ring buffer owns its fd, open and unchanged for the AsyncFd's lifetime.
    unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
        .map_err(|e| SessionError::Events(io::Error::other(e.to_string())))
}

impl Rings {
    /// Takes the collector's ring buffers (stacks only when sampling them); must run inside
    /// the async runtime.
    pub fn open(collector: &mut Collector) -> Result<Self, SessionError> {
        let new_threads = register(collector.take_new_threads()?)?;
        let stacks = if collector.stack_sample() > 0 {
            Some(register(collector.take_stacks()?)?)
        } else {
            None
        };
        Ok(Rings {
            new_threads,
            stacks,
        })
    }

    /// Waits until a ring buffer has records (or, with sampled stacks, [`STACKS_EVERY`]).
    /// Readiness is cleared before returning, so that records arriving after the following
    /// [`drain`](Self::drain) wake us again.
    pub async fn ready(&self) -> io::Result<()> {
        let stacks = async {
            match &self.stacks {
                Some(s) => s.readable().await,
                None => std::future::pending().await,
            }
        };
        let every = async {
            match &self.stacks {
                Some(_) => tokio::time::sleep(STACKS_EVERY).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            g = self.new_threads.readable() => g?.clear_ready(),
            g = stacks => g?.clear_ready(),
            () = every => {}
        }
        Ok(())
    }

    /// Hands the records available to `profile`, for at most [`DRAIN_BUDGET`]. New threads
    /// come first, and are looked at again between small batches of stacks: a thread must be
    /// classified while it lives, a stack can wait. The budget keeps the run loop turning
    /// (signals, readings, the end of the run) when the kernel side samples stacks faster than
    /// they are unwound: the ring then fills and the kernel side counts what it drops
    /// (`lost.stacks`).
    pub fn drain(&mut self, profile: &mut Profile) {
        let t0 = std::time::Instant::now();
        loop {
            classify_new_threads(self.new_threads.get_mut(), profile);
            let Some(s) = self.stacks.as_mut() else {
                return;
            };
            if profile.take_stacks(s.get_mut(), STACK_BATCH) < STACK_BATCH
                || t0.elapsed() >= DRAIN_BUDGET
            {
                classify_new_threads(self.new_threads.get_mut(), profile);
                return;
            }
        }
    }
}

/// Longest the end of a run unwinds the sampled stacks still in their ring: past it, the
/// rest is read without unwinding and counted as lost (`lost.stacks`).
const END_BUDGET: std::time::Duration = std::time::Duration::from_secs(5);

impl Rings {
    /// The end of a run: every record still in the rings, not only what a
    /// [`drain`](Self::drain)'s budget allows (a profiler that fell behind a burst of samples
    /// has a backlog that is part of the run), for at most [`END_BUDGET`].
    pub fn drain_all(&mut self, profile: &mut Profile) {
        let t0 = std::time::Instant::now();
        classify_new_threads(self.new_threads.get_mut(), profile);
        let Some(s) = self.stacks.as_mut() else {
            return;
        };
        while profile.take_stacks(s.get_mut(), STACK_BATCH) == STACK_BATCH {
            if t0.elapsed() >= END_BUDGET {
                profile.discard_stacks(s.get_mut());
                break;
            }
        }
        classify_new_threads(self.new_threads.get_mut(), profile);
    }
}

/// Hands the threads announced on the ring buffer to `profile`, to be classified while they
/// run.
fn classify_new_threads(ring: &mut RingBuf<MapData>, profile: &mut Profile) {
    while let Some(item) = ring.next() {
        if let Some(t) = Collector::parse_new_thread(&item) {
            profile.note_new_thread(&t);
        }
    }
}
