//! The writer thread behind a [`Sink`](super::Sink): reports are written there, so that a
//! reader that falls behind (a pipe read late, a slow disk) delays the output, never the run
//! loop that drains the kernel's rings (the runtime has one thread: a blocked write there
//! stopped everything, and the kernel side dropped the stacks it sampled meanwhile).
//!
//! The queue is bounded in bytes ([`QUEUE_BYTES`]): a report that does not fit is dropped
//! and counted by the caller (`lost.output`), except a run's final records, which wait for
//! room and are written whatever it takes.

use std::{
    collections::VecDeque,
    io,
    sync::{Arc, Condvar, Mutex, MutexGuard},
    thread::JoinHandle,
};

use crate::output::lines::Trouble;

/// The most rendered reports waiting to be written, in bytes: some seconds of interval
/// reports of a few hundred busy threads at `-i 0.1`, or one or two of ten thousand threads.
/// One report is always let in, whatever its size, when nothing else waits.
pub const QUEUE_BYTES: usize = 8 << 20;

/// Where the writer thread writes, one whole record at a time.
pub trait Destination: Send + 'static {
    fn write_record(&mut self, record: &[u8]) -> io::Result<()>;
    /// Named in what is said of a failing write.
    fn name(&self) -> String;
    /// A reader that went away may come back (the agent's file): a broken pipe is then
    /// a failure like another, not the end of the output.
    fn may_come_back(&self) -> bool {
        false
    }
}

struct Job {
    record: Vec<u8>,
    /// The run's final record: its outcome goes back to whoever waits for it.
    last: bool,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// Bytes of the records queued and of the one being written.
    bytes: usize,
    /// The reader went away (e.g. `| head`): nothing more is written.
    closed: bool,
    /// Records whose write failed (said on standard error), the final one apart.
    failed: u64,
    /// The final record's outcome, once written.
    done: Option<io::Result<()>>,
    /// No more records: the thread ends once the queue is empty.
    ending: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wait<'a>(&self, q: MutexGuard<'a, Queue>) -> MutexGuard<'a, Queue> {
        self.changed.wait(q).unwrap_or_else(|p| p.into_inner())
    }
}

/// A thread writing records to a [`Destination`] in order, behind a bounded queue.
pub struct Writer {
    shared: Arc<Shared>,
    limit: usize,
    /// Taken by the drop, which waits for it.
    thread: Option<JoinHandle<()>>,
}

impl Writer {
    /// Starts the thread; `going_on`: what is said, with a failed write, of what happens next.
    pub fn start(dest: impl Destination, going_on: &'static str, limit: usize) -> io::Result<Self> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            changed: Condvar::new(),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("output".into())
            .spawn(move || write_queued(&s, dest, going_on))?;
        Ok(Writer {
            shared,
            limit,
            thread: Some(thread),
        })
    }

    /// Queues a record if it fits ([`QUEUE_BYTES`]); false: it did not, and is dropped.
    /// Once the reader has gone, records are taken and thrown away.
    pub fn offer(&self, record: Vec<u8>) -> bool {
        let mut q = self.shared.lock();
        if q.closed {
            return true;
        }
        if q.bytes > 0 && q.bytes + record.len() > self.limit {
            return false;
        }
        q.bytes += record.len();
        q.jobs.push_back(Job {
            record,
            last: false,
        });
        self.shared.changed.notify_all();
        true
    }

    /// Whether a record of any size would now be dropped (the queue is at its limit).
    pub fn full(&self) -> bool {
        let q = self.shared.lock();
        !q.closed && q.bytes >= self.limit
    }

    /// Queues a record, waiting for room if need be (the end of a run).
    pub fn put(&self, record: Vec<u8>) {
        drop(self.push(record, false));
    }

    /// Writes the run's final record after everything queued, and waits for its outcome.
    pub fn finish(&self, record: Vec<u8>) -> io::Result<()> {
        let mut q = self.push(record, true);
        loop {
            if let Some(done) = q.done.take() {
                return done;
            }
            if q.closed && q.bytes == 0 {
                return Ok(());
            }
            q = self.shared.wait(q);
        }
    }

    fn push(&self, record: Vec<u8>, last: bool) -> MutexGuard<'_, Queue> {
        let mut q = self.shared.lock();
        while !q.closed && q.bytes > 0 && q.bytes + record.len() > self.limit {
            q = self.shared.wait(q);
        }
        if !q.closed {
            q.bytes += record.len();
            q.jobs.push_back(Job { record, last });
            self.shared.changed.notify_all();
        }
        q
    }

    /// Waits until everything queued is written (or failed), and returns how many records
    /// failed so far.
    pub fn flush(&self) -> u64 {
        let mut q = self.shared.lock();
        while !q.closed && q.bytes > 0 {
            q = self.shared.wait(q);
        }
        q.failed
    }

    /// The reader has gone: nothing more will be written.
    pub fn closed(&self) -> bool {
        self.shared.lock().closed
    }

    /// Records whose write failed so far (said on standard error).
    pub fn failed(&self) -> u64 {
        self.shared.lock().failed
    }
}

impl Drop for Writer {
    /// Everything queued is written before the run ends.
    fn drop(&mut self) {
        self.shared.lock().ending = true;
        self.shared.changed.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The thread: each record in turn, whole, until the writer is dropped and the queue empty.
fn write_queued(shared: &Shared, mut dest: impl Destination, going_on: &'static str) {
    let mut trouble = Trouble::default();
    let name = dest.name();
    loop {
        let job = {
            let mut q = shared.lock();
            loop {
                if let Some(j) = q.jobs.pop_front() {
                    break j;
                }
                if q.ending {
                    return;
                }
                q = shared.wait(q);
            }
        };
        let mut closed = false;
        let mut failed = false;
        let outcome = match dest.write_record(&job.record) {
            Ok(()) => {
                trouble.worked(&name);
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe && !dest.may_come_back() => {
                closed = true;
                Ok(())
            }
            Err(e) if !job.last => {
                trouble.failed(&name, &e, going_on);
                failed = true;
                Ok(())
            }
            Err(e) => Err(e),
        };
        let mut q = shared.lock();
        q.bytes -= job.record.len();
        q.failed += u64::from(failed);
        if closed {
            q.closed = true;
            q.jobs.clear();
            q.bytes = 0;
        }
        if job.last {
            q.done = Some(outcome);
        }
        shared.changed.notify_all();
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::sync::mpsc;

    use super::*;

    /// Records go to a channel, each write first waiting for a go on `gate`.
    struct Gated {
        gate: mpsc::Receiver<()>,
        out: mpsc::Sender<Vec<u8>>,
        fail: Option<io::ErrorKind>,
    }

    impl Destination for Gated {
        fn write_record(&mut self, record: &[u8]) -> io::Result<()> {
            let _ = self.gate.recv();
            match self.fail {
                Some(k) => Err(k.into()),
                None => {
                    let _ = self.out.send(record.to_vec());
                    Ok(())
                }
            }
        }
        fn name(&self) -> String {
            "the test's output".into()
        }
    }

    /// A writer whose every write waits for a go; what it wrote, on the receiver.
    pub(in crate::run) fn gated(
        limit: usize,
        fail: Option<io::ErrorKind>,
    ) -> (Writer, mpsc::Sender<()>, mpsc::Receiver<Vec<u8>>) {
        let (go, gate) = mpsc::channel();
        let (out, written) = mpsc::channel();
        let w = Writer::start(Gated { gate, out, fail }, "going on", limit).unwrap();
        (w, go, written)
    }

    #[test]
    fn a_blocked_reader_drops_what_does_not_fit_and_the_final_record_waits_for_room() {
        let (w, go, written) = gated(10, None);
        // The first is taken by the thread (blocked writing it), the second waits beside it.
        assert!(w.offer(b"aaaa".to_vec()));
        assert!(w.offer(b"bbbb".to_vec()));
        assert!(!w.offer(b"cccc".to_vec()), "over the limit: dropped");
        assert!(w.offer(b"dd".to_vec()), "10 bytes fit");
        assert!(w.full());
        // The reader resumes: everything queued is written, in order, then the final record.
        let reader = std::thread::spawn(move || {
            for _ in 0..4 {
                go.send(()).unwrap();
            }
        });
        w.finish(b"the end".to_vec()).unwrap();
        reader.join().unwrap();
        let got: Vec<Vec<u8>> = written.try_iter().collect();
        assert_eq!(got, [&b"aaaa"[..], b"bbbb", b"dd", b"the end"]);
    }

    #[test]
    fn one_record_larger_than_the_limit_is_let_in_alone() {
        let (w, go, written) = gated(4, None);
        assert!(w.offer(b"larger than four".to_vec()));
        assert!(!w.offer(b"x".to_vec()));
        go.send(()).unwrap();
        assert_eq!(w.flush(), 0);
        assert!(w.offer(b"y".to_vec()));
        go.send(()).unwrap();
        drop(w);
        assert_eq!(
            written.try_iter().count(),
            2,
            "written before the drop returned"
        );
    }

    #[test]
    fn failed_writes_are_counted_and_only_the_final_ones_error_is_returned() {
        let (w, go, _written) = gated(100, Some(io::ErrorKind::StorageFull));
        for _ in 0..3 {
            go.send(()).unwrap();
        }
        assert!(w.offer(b"one".to_vec()));
        assert!(w.offer(b"two".to_vec()));
        assert_eq!(w.flush(), 2);
        let e = w.finish(b"last".to_vec()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::StorageFull);
    }

    #[test]
    fn a_reader_gone_ends_the_output_quietly() {
        let (w, go, _written) = gated(100, Some(io::ErrorKind::BrokenPipe));
        go.send(()).unwrap();
        assert!(w.offer(b"one".to_vec()));
        assert_eq!(w.flush(), 0);
        assert!(w.closed());
        assert!(w.offer(b"two".to_vec()), "taken, and thrown away");
        w.finish(b"last".to_vec()).unwrap();
    }
}
