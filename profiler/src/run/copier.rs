//! The sampled stacks' ring, copied out by a thread of its own as records come (at the
//! kernel side's wakeups, and every 25 ms). Whatever holds up the run loop (a burst of stacks
//! to unwind, a process's V8 metadata read for the first time, a busy host taking its CPU)
//! then holds up only the unwinding: the records wait in a bounded backlog in userspace, not
//! in the kernel's ring, which the kernel side drops samples from once full (`lost.stacks`).
//! The thread does nothing but copy (one or two microseconds a record), so it keeps up where
//! the run loop cannot.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use aya::maps::{MapData, RingBuf};
use tokio::sync::mpsc;

/// How often the ring is looked at when the kernel side has not woken us (it does so only
/// once the ring is a quarter full: a wakeup per sample costs the traced thread microseconds).
/// At most that often otherwise: a ring buffer's fd is readable while it holds a record, so
/// waiting for readability would wake the copier (and the run loop after it) for every
/// sample; it waits for the kernel's wakeups (edge-triggered) or this period.
const EVERY: Duration = Duration::from_millis(25);

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
    stop: AtomicBool,
}

/// The thread copying the ring's records, and what it hands over.
pub struct Copier {
    batches: mpsc::UnboundedReceiver<Vec<Vec<u8>>>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<RingBuf<MapData>>>,
}

impl Copier {
    /// Starts copying `ring`, whose size is `ring_bytes`.
    pub fn start(ring: RingBuf<MapData>, ring_bytes: usize) -> std::io::Result<Self> {
        let (tx, batches) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared::default());
        let budget = ring_bytes * BACKLOG_RINGS;
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("stack-copier".into())
            .spawn(move || copy(ring, &tx, &s, budget))?;
        Ok(Copier {
            batches,
            shared,
            thread: Some(thread),
        })
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

    /// Records of `bytes` bytes were taken from the backlog: room for as many.
    pub fn taken(&self, bytes: usize) {
        self.shared.queued.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// Stops the thread and returns the ring, with the batches it copied before stopping.
    pub fn stop(mut self) -> (Option<RingBuf<MapData>>, Vec<Vec<u8>>) {
        self.shared.stop.store(true, Ordering::Release);
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
        self.shared.stop.store(true, Ordering::Release);
    }
}

/// The copier's loop: copies what the ring holds while the backlog has room, hands it over,
/// then waits for more (or, the backlog full, for room). Returns the ring when told to stop
/// or when nobody receives.
fn copy(
    mut ring: RingBuf<MapData>,
    tx: &mpsc::UnboundedSender<Vec<Vec<u8>>>,
    shared: &Shared,
    budget: usize,
) -> RingBuf<MapData> {
    let wakeups = Wakeups::of(&ring);
    loop {
        if shared.stop.load(Ordering::Acquire) {
            return ring;
        }
        let mut full = false;
        loop {
            let mut batch = Vec::new();
            let mut bytes = 0;
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
                break;
            }
            shared.queued.fetch_add(bytes, Ordering::AcqRel);
            let more = batch.len() == BATCH;
            if tx.send(batch).is_err() {
                return ring;
            }
            if !more {
                break;
            }
        }
        if full {
            // The run loop is behind: the records wait in the kernel's ring meanwhile.
            std::thread::sleep(Duration::from_millis(1));
        } else {
            wakeups.wait();
        }
    }
}

/// The kernel side's wakeups of the ring, edge-triggered: an epoll instance (None if it
/// could not be made: the copier then sleeps [`EVERY`] between looks).
struct Wakeups(Option<std::os::fd::OwnedFd>);

impl Wakeups {
    fn of(ring: &RingBuf<MapData>) -> Self {
        use rustix::event::epoll;
        let made = epoll::create(epoll::CreateFlags::CLOEXEC).and_then(|ep| {
            let flags = epoll::EventFlags::IN | epoll::EventFlags::ET;
            epoll::add(&ep, ring, epoll::EventData::new_u64(0), flags).map(|()| ep)
        });
        Wakeups(
            made.map_err(|e| log::debug!("stack copier: no epoll ({e})"))
                .ok(),
        )
    }

    /// Waits for a wakeup of the ring by the kernel side, or [`EVERY`].
    fn wait(&self) {
        let Some(ep) = &self.0 else {
            std::thread::sleep(EVERY);
            return;
        };
        let timeout = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: EVERY.as_nanos() as _,
        };
        let mut events = Vec::with_capacity(1);
        let _ = rustix::event::epoll::wait(
            ep,
            rustix::buffer::spare_capacity(&mut events),
            Some(&timeout),
        );
    }
}
