//! The sampled stacks' ring, copied out by a thread of its own as records come. Whatever
//! holds up the run loop (a burst of stacks to unwind, a process's V8 metadata read for the
//! first time, a busy host taking its CPU) then holds up only the unwinding: the records wait
//! in a bounded backlog in userspace, not in the kernel's ring, which the kernel side drops
//! samples from once full (`lost.stacks`). The thread does nothing but copy (one or two
//! microseconds a record), so it keeps up where the run loop cannot.
//!
//! When it looks: every [`look_every`] while records come, a quarter of the run's interval
//! within 25-100 ms (the kernel side wakes it only past a quarter of the ring: a wakeup per
//! record costs the traced thread microseconds); once nothing has come for four looks, it
//! asks the kernel side to wake it at the next record (`STACKS_WAKE`) and sleeps until then.
//! A wakeup costs tens of microseconds of CPU on a virtual machine: a copier looking every
//! 25 ms on an idle host cost about 2 ms a second; looking every 100 ms rather than 25 ms
//! took the agent's copier from 1.2 to 0.5 ms of CPU per run of the Workers' bench load,
//! stacks on. Stacks reach the run loop at most a look later: within their interval when
//! intervals are reported, in time for the agent's.

use std::{
    os::fd::OwnedFd,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use aya::maps::{Array, MapData, RingBuf};
use rustix::event::{EventfdFlags, epoll, eventfd};
use tokio::sync::mpsc;

/// How often the ring is looked at while records come and the kernel side has not woken us
/// (it does so only once the ring is a quarter full), for a run reporting every `interval`
/// (None: only at its end): a quarter of it, within [`EVERY_MIN`] and [`EVERY_MAX`]. At
/// most that often otherwise: a ring buffer's fd is readable while it holds a record, so
/// waiting for readability would wake the copier (and the run loop after it) for every
/// sample; it waits for the kernel's wakeups (edge-triggered) or this period.
pub fn look_every(interval: Option<Duration>) -> Duration {
    interval.map_or(EVERY_MAX, |i| (i / 4).clamp(EVERY_MIN, EVERY_MAX))
}

const EVERY_MIN: Duration = Duration::from_millis(25);
const EVERY_MAX: Duration = Duration::from_millis(100);

/// Looks in a row that found nothing before the copier waits for the kernel side's wakeup
/// alone.
const QUIET_LOOKS: u32 = 4;

/// The longest wait for that wakeup (a backstop: the kernel side wakes the copier at the
/// next record, and `stop` at once).
const IDLE_WAIT: Duration = Duration::from_secs(1);

/// Records copied before they are handed over, at most (the run loop starts on them sooner).
const BATCH: usize = 64;

/// The backlog's bound, in rings' worth of bytes: with every write sampled, 32 MiB, about a
/// quarter of a second of the demo's samples.
const BACKLOG_RINGS: usize = 4;

/// What the copier and the run loop share.
#[derive(Default)]
struct Shared {
    /// Bytes copied and not yet taken by the run loop.
    queued: AtomicUsize,
    /// Records copied (handed over) since the start.
    copied: AtomicU64,
    /// The copier's last look stopped at a full backlog: records may wait in the kernel's
    /// ring, beyond what `copied` counts.
    full: AtomicBool,
    stop: AtomicBool,
}

/// The thread copying the ring's records, and what it hands over.
pub struct Copier {
    batches: mpsc::UnboundedReceiver<Vec<Vec<u8>>>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<RingBuf<MapData>>>,
    /// Wakes the thread to stop (None: it looks at least every [`look_every`]).
    stop_fd: Option<OwnedFd>,
}

impl Copier {
    /// Starts copying `ring`, whose size is `ring_bytes`, looking `every` so often while
    /// records come ([`look_every`]); `wake` is the kernel side's flag to wake the copier at
    /// its next record.
    pub fn start(
        ring: RingBuf<MapData>,
        wake: Array<MapData, u32>,
        ring_bytes: usize,
        every: Duration,
    ) -> std::io::Result<Self> {
        let (tx, batches) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared::default());
        let budget = ring_bytes * BACKLOG_RINGS;
        let s = shared.clone();
        let stop_fd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
            .map_err(|e| log::debug!("stack copier: no eventfd ({e})"))
            .ok();
        let wakeups = Wakeups::of(&ring, stop_fd.as_ref(), wake, every);
        let thread = std::thread::Builder::new()
            .name("stack-copier".into())
            .spawn(move || copy(ring, wakeups, &tx, &s, budget))?;
        Ok(Copier {
            batches,
            shared,
            thread: Some(thread),
            stop_fd,
        })
    }

    /// Tells the thread to stop, and wakes it.
    fn tell_stop(&self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(fd) = &self.stop_fd {
            let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
        }
    }

    /// The next batch of records copied (cancel-safe). Pending forever once the copier has
    /// stopped.
    pub async fn next(&mut self) -> Vec<Vec<u8>> {
        match self.batches.recv().await {
            Some(b) => b,
            None => std::future::pending().await,
        }
    }

    /// A batch already copied, if any.
    pub fn try_next(&mut self) -> Option<Vec<Vec<u8>>> {
        self.batches.try_recv().ok()
    }

    /// Records copied out of the kernel's ring since the start, in the order the kernel wrote
    /// them; None while the backlog is full (more may wait in the ring).
    pub fn copied(&self) -> Option<u64> {
        (!self.shared.full.load(Ordering::Acquire))
            .then(|| self.shared.copied.load(Ordering::Acquire))
    }

    /// Records of `bytes` bytes were taken from the backlog: room for as many.
    pub fn taken(&self, bytes: usize) {
        self.shared.queued.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// Stops the thread and returns the ring, with the batches it copied before stopping.
    pub fn stop(mut self) -> (Option<RingBuf<MapData>>, Vec<Vec<u8>>) {
        self.tell_stop();
        let ring = self.thread.take().and_then(|t| t.join().ok());
        let mut rest = Vec::new();
        while let Ok(b) = self.batches.try_recv() {
            rest.extend(b);
        }
        (ring, rest)
    }
}

impl Drop for Copier {
    fn drop(&mut self) {
        self.tell_stop();
    }
}

/// The copier's loop: copies what the ring holds while the backlog has room, hands it over,
/// then waits for more (or, the backlog full, for room). Returns the ring when told to stop
/// or when nobody receives.
fn copy(
    mut ring: RingBuf<MapData>,
    mut wakeups: Wakeups,
    tx: &mpsc::UnboundedSender<Vec<Vec<u8>>>,
    shared: &Shared,
    budget: usize,
) -> RingBuf<MapData> {
    let mut quiet = 0;
    loop {
        if shared.stop.load(Ordering::Acquire) {
            return ring;
        }
        let Some((copied, full)) = copy_available(&mut ring, tx, shared, budget) else {
            return ring;
        };
        shared.full.store(full, Ordering::Release);
        if full {
            // The run loop is behind: the records wait in the kernel's ring meanwhile.
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        if copied {
            quiet = 0;
            wakeups.armed = false;
        } else {
            quiet += 1;
        }
        if quiet < QUIET_LOOKS {
            wakeups.wait(wakeups.every);
        } else if !wakeups.armed {
            // Asked for a wakeup at the next record: look once more before waiting for it
            // (a record written before the asking woke nobody).
            wakeups.arm();
        } else {
            wakeups.wait(IDLE_WAIT);
        }
    }
}

/// Copies what the ring holds, in batches, while the backlog has room: whether anything was
/// copied, and whether the backlog is full (None: nobody receives any more).
fn copy_available(
    ring: &mut RingBuf<MapData>,
    tx: &mpsc::UnboundedSender<Vec<Vec<u8>>>,
    shared: &Shared,
    budget: usize,
) -> Option<(bool, bool)> {
    let mut copied = false;
    loop {
        let mut batch = Vec::new();
        let mut bytes = 0;
        let mut full = false;
        while batch.len() < BATCH {
            if shared.queued.load(Ordering::Acquire) + bytes >= budget {
                full = true;
                break;
            }
            let Some(item) = ring.next() else { break };
            bytes += item.len();
            batch.push(item.to_vec());
        }
        if batch.is_empty() {
            return Some((copied, full));
        }
        copied = true;
        shared.queued.fetch_add(bytes, Ordering::AcqRel);
        let (more, n) = (batch.len() == BATCH, batch.len() as u64);
        tx.send(batch).ok()?;
        shared.copied.fetch_add(n, Ordering::AcqRel);
        if !more || full {
            return Some((copied, full));
        }
    }
}

/// The kernel side's wakeups of the ring and `stop`'s, edge-triggered: an epoll instance
/// (None if it could not be made: the copier then sleeps `every` between looks, and never
/// waits longer), and the kernel side's flag to wake the copier at its next record.
struct Wakeups {
    epoll: Option<OwnedFd>,
    every: Duration,
    wake: Array<MapData, u32>,
    /// The flag is set (as far as the copier knows: the kernel side clears it when it wakes
    /// the copier).
    armed: bool,
}

impl Wakeups {
    fn of(
        ring: &RingBuf<MapData>,
        stop: Option<&OwnedFd>,
        wake: Array<MapData, u32>,
        every: Duration,
    ) -> Self {
        let flags = epoll::EventFlags::IN | epoll::EventFlags::ET;
        let made = epoll::create(epoll::CreateFlags::CLOEXEC).and_then(|ep| {
            epoll::add(&ep, ring, epoll::EventData::new_u64(0), flags)?;
            if let Some(fd) = stop {
                epoll::add(&ep, fd, epoll::EventData::new_u64(1), flags)?;
            }
            Ok(ep)
        });
        let epoll = made
            .map_err(|e| log::debug!("stack copier: no epoll ({e})"))
            .ok()
            // Waiting longer than a period needs `stop` to end the wait.
            .filter(|_| stop.is_some());
        Wakeups {
            epoll,
            every,
            wake,
            armed: false,
        }
    }

    /// Asks the kernel side to wake the copier at its next record (if it can be woken).
    fn arm(&mut self) {
        self.armed = self.epoll.is_some() && self.wake.set(0, 1, 0).is_ok();
        if !self.armed {
            self.wait(self.every);
        }
    }

    /// Waits for a wakeup of the ring by the kernel side, or `stop`'s, or `timeout`.
    fn wait(&self, timeout: Duration) {
        let Some(ep) = &self.epoll else {
            std::thread::sleep(self.every);
            return;
        };
        let timeout = rustix::event::Timespec {
            tv_sec: timeout.as_secs() as _,
            tv_nsec: timeout.subsec_nanos() as _,
        };
        let mut events = Vec::with_capacity(2);
        let _ = epoll::wait(
            ep,
            rustix::buffer::spare_capacity(&mut events),
            Some(&timeout),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_is_looked_at_four_times_an_interval_within_bounds() {
        let ms = Duration::from_millis;
        assert_eq!(look_every(None), ms(100));
        assert_eq!(look_every(Some(ms(200))), ms(50));
        assert_eq!(look_every(Some(ms(100))), ms(25));
        assert_eq!(look_every(Some(ms(10))), ms(25));
        assert_eq!(look_every(Some(Duration::from_secs(10))), ms(100));
    }
}
