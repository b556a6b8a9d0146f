//! An exporter's bounded queue of encoded payloads: what a backend that is down or slow
//! leaves unsent waits here for the next push, up to [`MAX_PAYLOADS`] and [`MAX_BYTES`];
//! past that the oldest go first, counted (`queue_full`). A payload is tried at most
//! [`MAX_ATTEMPTS`] times. Every payload given up on is counted by exporter and reason,
//! and each (exporter, reason) said once on standard error.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::client::Failure;

pub const MAX_PAYLOADS: usize = 64;
pub const MAX_BYTES: usize = 32 << 20;
pub const MAX_ATTEMPTS: u32 = 3;

/// One request, encoded.
pub struct Payload {
    /// `pyroscope`, `otlp_profiles` or `otlp_metrics`.
    pub exporter: &'static str,
    pub url: String,
    pub query: Vec<(&'static str, String)>,
    pub content_type: String,
    pub body: Vec<u8>,
    pub attempts: u32,
}

/// What was sent and given up on, by exporter (and reason), cumulative.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    pub sent: BTreeMap<&'static str, u64>,
    pub dropped: BTreeMap<(&'static str, &'static str), u64>,
}

#[derive(Default)]
pub struct Queue {
    items: VecDeque<Payload>,
    bytes: usize,
    pub tally: Tally,
    said: BTreeSet<(&'static str, &'static str)>,
    pub quiet: bool,
}

impl Queue {
    pub fn new(quiet: bool) -> Self {
        Queue {
            quiet,
            ..Queue::default()
        }
    }

    /// Counts a payload given up on, and says so the first time for its exporter and
    /// reason.
    pub fn drop_one(&mut self, p: &Payload, reason: &'static str, why: &str) {
        *self.tally.dropped.entry((p.exporter, reason)).or_default() += 1;
        if self.said.insert((p.exporter, reason)) && !self.quiet {
            eprintln!(
                "mmaplock-prof agent: push to {} ({}): a payload not sent ({reason}{}{why}); such losses are counted in mmaplock_export_dropped_total{{exporter=\"{}\",reason=\"{reason}\"}} and not said again",
                p.exporter,
                p.url,
                if why.is_empty() { "" } else { ": " },
                p.exporter
            );
        }
    }

    pub fn push(&mut self, p: Payload) {
        self.bytes += p.body.len();
        self.items.push_back(p);
        while self.items.len() > MAX_PAYLOADS || (self.bytes > MAX_BYTES && self.items.len() > 1) {
            let Some(old) = self.items.pop_front() else {
                break;
            };
            self.bytes -= old.body.len();
            self.drop_one(
                &old,
                "queue_full",
                "the backend did not take them as fast as they came",
            );
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Sends what is queued, oldest first, with `send`: a payload sent or refused for good
    /// leaves the queue; the first that may succeed later (unreachable, busy) stays for the
    /// next push, or is given up on at its last attempt, and the rest wait behind it.
    pub fn drain(&mut self, mut send: impl FnMut(&Payload) -> Result<(), Failure>) {
        while let Some(p) = self.items.front_mut() {
            p.attempts += 1;
            let failure = send(p).err();
            let keep = failure
                .as_ref()
                .is_some_and(|f| f.retry() && p.attempts < MAX_ATTEMPTS);
            if keep {
                return;
            }
            let p = self.items.pop_front().expect("the front");
            self.bytes -= p.body.len();
            match failure {
                None => *self.tally.sent.entry(p.exporter).or_default() += 1,
                Some(f) => {
                    self.drop_one(&p, f.reason(), &f.to_string());
                    if f.retry() {
                        // The backend is down: the rest wait for the next push.
                        return;
                    }
                }
            }
        }
    }

    /// At the agent's end: what is still queued is counted as not sent.
    pub fn abandon(&mut self) {
        while let Some(p) = self.items.pop_front() {
            self.bytes -= p.body.len();
            self.drop_one(&p, "shutdown", "the agent stopped before it could be sent");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(n: usize) -> Payload {
        Payload {
            exporter: "otlp_metrics",
            url: "http://127.0.0.1:1/v1/metrics".into(),
            query: Vec::new(),
            content_type: "application/x-protobuf".into(),
            body: vec![0; n],
            attempts: 0,
        }
    }

    fn quiet() -> Queue {
        Queue::new(true)
    }

    #[test]
    fn past_its_bounds_the_oldest_go_counted() {
        let mut q = quiet();
        for _ in 0..MAX_PAYLOADS + 5 {
            q.push(payload(10));
        }
        assert_eq!(q.len(), MAX_PAYLOADS);
        assert_eq!(q.tally.dropped[&("otlp_metrics", "queue_full")], 5);
        // By bytes: one payload larger than the bound alone is kept (and tried).
        let mut q = quiet();
        q.push(payload(MAX_BYTES / 2));
        q.push(payload(MAX_BYTES / 2 + 1));
        assert_eq!(q.len(), 1);
        let mut q = quiet();
        q.push(payload(MAX_BYTES + 1));
        assert_eq!(q.len(), 1);
    }

    #[test]
    fn a_backend_down_keeps_the_queue_until_the_last_attempt() {
        let mut q = quiet();
        q.push(payload(1));
        q.push(payload(1));
        let down = |_: &Payload| Err(Failure::Unreachable("connection refused".into()));
        q.drain(down);
        q.drain(down);
        assert_eq!(q.len(), 2, "two attempts: kept");
        q.drain(down);
        assert_eq!(q.len(), 1, "the third gives the first up, the second waits");
        assert_eq!(q.tally.dropped[&("otlp_metrics", "unreachable")], 1);
        q.drain(|_| Ok(()));
        assert_eq!((q.len(), q.tally.sent["otlp_metrics"]), (0, 1));
    }

    #[test]
    fn a_payload_refused_goes_at_once_and_the_rest_are_sent() {
        let mut q = quiet();
        for n in 1..=3 {
            q.push(payload(n));
        }
        q.drain(|p| match p.body.len() {
            1 => Err(Failure::Rejected(400, "bad".into())),
            _ => Ok(()),
        });
        assert_eq!(q.len(), 0);
        assert_eq!(q.tally.dropped[&("otlp_metrics", "rejected")], 1);
        assert_eq!(q.tally.sent["otlp_metrics"], 2);
        q.push(payload(1));
        q.abandon();
        assert_eq!(q.tally.dropped[&("otlp_metrics", "shutdown")], 1);
    }
}
