//! The agent's pushes (`--pyroscope`, `--otlp`), beside its pull endpoints: every
//! `--push-interval`, each target's thread encodes what ended since its last push from what
//! the agent already keeps (the ring of sampled stacks, the metrics), queues it (bounded,
//! `queue.rs`) and sends it (`client.rs`). The run loop, `/metrics` and the captures never wait
//! for a backend: they share only the locks they already had, held here only to encode;
//! a backend that is down or slow costs its own thread, and what could not be sent is
//! counted in `mmaplock_export_dropped_total{exporter,reason}` and said once.

mod client;
mod payloads;
mod queue;
pub mod settings;

use std::{
    sync::{Arc, Condvar, Mutex, mpsc},
    thread,
    time::{Duration, Instant, SystemTime},
};

pub use payloads::Sources;
pub use settings::PushSettings;

use crate::output::prometheus::Exports;
use client::Client;
use queue::{Payload, Queue};

#[derive(Debug, thiserror::Error)]
pub enum PushError {
    #[error("--push-ca {0}: {1}")]
    Ca(std::path::PathBuf, String),
    #[error("cannot start the push thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// The longest one request may take (less when the interval is shorter).
const MAX_REQUEST: Duration = Duration::from_secs(10);

/// How long the agent's end waits for the last pushes.
const LAST_PUSH: Duration = Duration::from_secs(12);

/// A push target: Pyroscope or an OTLP endpoint.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Target {
    Pyroscope,
    Otlp,
}

/// Told to stop, and woken for it.
#[derive(Default)]
struct Stop {
    stopped: Mutex<bool>,
    wake: Condvar,
}

impl Stop {
    /// Waits until `deadline` or a stop; whether it was a stop.
    fn wait_until(&self, deadline: Instant) -> bool {
        let mut stopped = self.stopped.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if *stopped {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            stopped = match self.wake.wait_timeout(stopped, deadline - now) {
                Ok((s, _)) => s,
                Err(e) => e.into_inner().0,
            };
        }
    }
}

/// The running push threads.
pub struct Pushers {
    stop: Arc<Stop>,
    done: mpsc::Receiver<()>,
    threads: usize,
}

/// One target's thread: its client, its queue, and how far it has pushed.
struct Exporter {
    target: Target,
    base: String,
    client: Client,
    queue: Queue,
    since: SystemTime,
}

impl Exporter {
    fn produce(&mut self, src: &Sources) {
        match self.target {
            Target::Pyroscope => {
                for p in payloads::pyroscope(&self.base, src, &mut self.since) {
                    self.queue.push(p);
                }
            }
            Target::Otlp => {
                if let Some(p) = payloads::otlp_profiles(&self.base, src, &mut self.since) {
                    self.queue.push(p);
                }
                if let Some(p) = payloads::otlp_metrics(&self.base, src) {
                    self.queue.push(p);
                }
            }
        }
    }

    fn send(&mut self) {
        let client = &self.client;
        self.queue
            .drain(|p: &Payload| client.post(&p.url, &p.query, &p.content_type, &p.body));
    }

    /// Its counts into the metrics (`mmaplock_export_*`).
    fn report(&self, src: &Sources) {
        if let Ok(mut m) = src.metrics.0.lock() {
            let e = m.exports.get_or_insert_with(Exports::default);
            for (k, v) in &self.queue.tally.sent {
                e.sent.insert(k, *v);
            }
            for (k, v) in &self.queue.tally.dropped {
                e.dropped.insert(*k, *v);
            }
        }
    }

    fn run(mut self, src: &Sources, stop: &Stop, every: Duration) {
        let mut next = Instant::now() + every;
        loop {
            let last = stop.wait_until(next);
            self.produce(src);
            self.send();
            if last {
                self.queue.abandon();
                self.report(src);
                return;
            }
            self.report(src);
            next += every;
            let now = Instant::now();
            if next <= now {
                // A slow backend took longer than an interval: the next push covers it.
                next = now + every;
            }
        }
    }
}

/// This host's name.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Starts a thread per target of `s` (none: None). Its series start at 0 for every
/// exporter and reason, so that a rate over them starts at once.
pub fn start(s: &PushSettings, src: Sources, quiet: bool) -> Result<Option<Pushers>, PushError> {
    let targets: Vec<(Target, String)> = [
        (Target::Pyroscope, s.pyroscope.clone()),
        (Target::Otlp, s.otlp.clone()),
    ]
    .into_iter()
    .filter_map(|(t, url)| Some((t, url?)))
    .collect();
    if targets.is_empty() {
        return Ok(None);
    }
    let every = s.interval();
    let deadline = every.min(MAX_REQUEST);
    // Every client first: a bad CA file is an error before any thread starts.
    let mut exporters = Vec::new();
    for (target, base) in targets {
        exporters.push(Exporter {
            target,
            base,
            client: Client::new(s.ca.as_deref(), &s.headers, deadline)?,
            queue: Queue::new(quiet),
            since: SystemTime::UNIX_EPOCH,
        });
    }
    if let Ok(mut m) = src.metrics.0.lock() {
        let e = m.exports.get_or_insert_with(Exports::default);
        for x in &exporters {
            let names: &[&'static str] = match x.target {
                Target::Pyroscope => &["pyroscope"],
                Target::Otlp => &["otlp_profiles", "otlp_metrics"],
            };
            for n in names {
                e.sent.insert(n, 0);
                for r in Exports::REASONS {
                    e.dropped.insert((n, r), 0);
                }
            }
        }
    }
    let src = Arc::new(src);
    let stop = Arc::new(Stop::default());
    let (tx, done) = mpsc::channel();
    let threads = exporters.len();
    for x in exporters {
        let (src, stop, tx) = (src.clone(), stop.clone(), tx.clone());
        let name = match x.target {
            Target::Pyroscope => "push-pyroscope",
            Target::Otlp => "push-otlp",
        };
        thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                x.run(&src, &stop, every);
                let _ = tx.send(());
            })
            .map_err(PushError::Thread)?;
    }
    Ok(Some(Pushers {
        stop,
        done,
        threads,
    }))
}

impl Pushers {
    /// The last push of each target (what ended since its last), then the threads end; a
    /// backend that does not answer holds the agent's exit [`LAST_PUSH`] at most.
    pub fn stop(self) {
        *self.stop.stopped.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.stop.wake.notify_all();
        let until = Instant::now() + LAST_PUSH;
        for _ in 0..self.threads {
            let left = until.saturating_duration_since(Instant::now());
            if self.done.recv_timeout(left).is_err() {
                break;
            }
        }
    }
}
