//! When a process's lock wait is worth a capture: its threads' wait for the lock over their
//! time alive, summed over the last `--escalate-window` seconds (the report's `time_share`
//! arithmetic, on the agent's intervals), against `--escalate-at`. Level-triggered: a process
//! that stays above the threshold is captured again once its cooldown is over. At most one
//! capture runs; among the processes above the threshold, the one that waited most of its
//! time goes first, and the others wait their turn. A crossing that cannot be captured now
//! (cooldown, or another capture running) is counted once per crossing, not per interval.
//!
//! A process is judged only once the agent has measured it over a whole window: the share
//! must hold over a full window of the process's life as the agent sees it (from its first
//! reading: a new process's first lock, or in contention mode its threads' first contended
//! wait; the agent's start for a process older than it). A burst (its Workers' heaps and
//! glibc's arenas set up at once as it starts, or a moment's contention in a long quiet life)
//! is then weighed against the rest of that window, its threads' idle time counted, and a
//! process contended only for a moment does not take the host's one capture from a process
//! that stays contended.

use std::{
    collections::{HashMap, VecDeque},
    time::{Duration, Instant},
};

use crate::vocab::ids::ProcId;

/// Fewer waits than this in the window never trigger: no capture rests on a handful of waits
/// (a process's first interval, an exec's teardown).
pub const MIN_WAITS: u64 = 20;

/// One interval of a process: its own threads' wait for its lock (the profiler's and other
/// processes' threads excluded, as in `time_share`), their waits, and their time alive.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reading {
    pub wait_ns: u64,
    pub waits: u64,
    pub alive_ns: u64,
}

impl Reading {
    pub fn add(&mut self, o: &Reading) {
        self.wait_ns = self.wait_ns.saturating_add(o.wait_ns);
        self.waits = self.waits.saturating_add(o.waits);
        self.alive_ns = self.alive_ns.saturating_add(o.alive_ns);
    }

    /// Wait over time alive (0 with no time).
    pub fn share(&self) -> f64 {
        if self.alive_ns == 0 {
            0.0
        } else {
            self.wait_ns as f64 / self.alive_ns as f64
        }
    }
}

/// A process's last intervals (when each ended, its length, the reading), since when the
/// agent has measured it, and what was said of its current crossing.
struct History {
    intervals: VecDeque<(Instant, Duration, Reading)>,
    /// The start of its first interval (kept while it has intervals in the window).
    since: Instant,
    /// Its current crossing was counted as held back (by its cooldown or another capture).
    held: bool,
}

/// A process's window: its reading summed, and the time it was measured over (the lengths
/// of the intervals it had readings in).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Windowed {
    pub reading: Reading,
    pub span: Duration,
}

/// What a crossing that is not captured now was held back by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    Cooldown,
    Busy,
}

impl Held {
    pub fn reason(self) -> &'static str {
        match self {
            Held::Cooldown => "cooldown",
            Held::Busy => "busy",
        }
    }
}

/// The decision of one interval.
#[derive(Debug, Default, PartialEq)]
pub struct Decision {
    /// The process to capture now, with its window's reading.
    pub start: Option<(ProcId, Windowed)>,
    /// Crossings newly held back, each counted once.
    pub held: Vec<(ProcId, Held)>,
    /// Processes above the threshold, out of their cooldown, waiting for the running
    /// capture to end (the `waiting` gauge).
    pub waiting: usize,
}

pub struct Trigger {
    /// The threshold, as a fraction of threads' time.
    at: f64,
    window: Duration,
    cooldown: Duration,
    history: HashMap<ProcId, History>,
    /// When each process's last capture began.
    captured: HashMap<ProcId, Instant>,
    /// The last interval's length: a window is whole within half of one.
    last_span: Duration,
}

impl Trigger {
    pub fn new(at_percent: f64, window: Duration, cooldown: Duration) -> Self {
        Trigger {
            at: at_percent / 100.0,
            window,
            cooldown,
            history: HashMap::new(),
            captured: HashMap::new(),
            last_span: Duration::ZERO,
        }
    }

    /// Adds an interval of length `span` that ended at `now`: a reading per process that
    /// took the lock or was alive in it. Processes with no interval left in the window are
    /// forgotten.
    pub fn observe(
        &mut self,
        now: Instant,
        span: Duration,
        readings: impl IntoIterator<Item = (ProcId, Reading)>,
    ) {
        for (p, r) in readings {
            let h = self.history.entry(p).or_insert_with(|| History {
                intervals: VecDeque::new(),
                since: now.checked_sub(span).unwrap_or(now),
                held: false,
            });
            h.intervals.push_back((now, span, r));
        }
        self.last_span = span;
        let since = now.checked_sub(self.window);
        self.history.retain(|_, h| {
            while h
                .intervals
                .front()
                .is_some_and(|(t, _, _)| since.is_some_and(|s| *t <= s))
            {
                h.intervals.pop_front();
            }
            !h.intervals.is_empty()
        });
        let cooldown = self.cooldown;
        self.captured
            .retain(|_, t| now.duration_since(*t) < cooldown);
    }

    /// A process's reading summed over the window, and the time it covers.
    pub fn window(&self, p: ProcId) -> Windowed {
        let mut w = Windowed::default();
        if let Some(h) = self.history.get(&p) {
            for (_, span, r) in &h.intervals {
                w.reading.add(r);
                w.span += *span;
            }
        }
        w
    }

    /// Above the threshold over a full window of its life as the agent saw it, on enough
    /// waits.
    fn above(&self, now: Instant, p: ProcId, w: &Windowed) -> bool {
        let r = &w.reading;
        let whole = (self.history.get(&p))
            .is_some_and(|h| now.duration_since(h.since) + self.last_span / 2 >= self.window);
        whole && r.waits >= MIN_WAITS && r.alive_ns > 0 && r.share() >= self.at
    }

    /// Decides at `now`: `busy` when a capture is running.
    pub fn decide(&mut self, now: Instant, busy: bool) -> Decision {
        let mut above: Vec<(ProcId, Windowed)> = (self.history.keys())
            .map(|&p| (p, self.window(p)))
            .filter(|(p, w)| self.above(now, *p, w))
            .collect();
        // The longest share first; equal shares by pid, for a stable order.
        above.sort_by(|a, b| {
            (b.1.reading.share())
                .total_cmp(&a.1.reading.share())
                .then(a.0.cmp(&b.0))
        });
        let mut d = Decision::default();
        for (p, r) in &above {
            let cooling =
                (self.captured.get(p)).is_some_and(|t| now.duration_since(*t) < self.cooldown);
            let held = if cooling {
                Some(Held::Cooldown)
            } else if busy || d.start.is_some() {
                Some(Held::Busy)
            } else {
                None
            };
            let h = self.history.get_mut(p).expect("above comes from history");
            match held {
                None => {
                    d.start = Some((*p, *r));
                    // This crossing is dealt with: not counted as held while it lasts.
                    h.held = true;
                    self.captured.insert(*p, now);
                }
                Some(why) => {
                    d.waiting += (why == Held::Busy) as usize;
                    if !h.held {
                        h.held = true;
                        d.held.push((*p, why));
                    }
                }
            }
        }
        // A process back under the threshold: its next crossing is a new one.
        for (p, h) in self.history.iter_mut() {
            if !above.iter().any(|(q, _)| q == p) {
                h.held = false;
            }
        }
        d
    }

    /// Processes with intervals in the window (their memory is bounded by it).
    #[cfg(test)]
    pub fn tracked(&self) -> usize {
        self.history.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(wait_ms: u64, waits: u64, alive_ms: u64) -> Reading {
        Reading {
            wait_ns: wait_ms * 1_000_000,
            waits,
            alive_ns: alive_ms * 1_000_000,
        }
    }

    fn p(pid: u32) -> ProcId {
        ProcId::new(pid, 1)
    }

    fn secs(t0: Instant, s: u64) -> Instant {
        t0 + Duration::from_secs(s)
    }

    /// One-second intervals.
    fn obs(t: &mut Trigger, at: Instant, readings: impl IntoIterator<Item = (ProcId, Reading)>) {
        t.observe(at, Duration::from_secs(1), readings);
    }

    /// The agent saw `readings` in every interval of a whole window up to `t0`.
    fn seen(t: &mut Trigger, t0: Instant, readings: &[(ProcId, Reading)]) {
        let secs = t.window.as_secs();
        for s in 0..secs {
            let at = t0 - Duration::from_secs(secs - 1 - s);
            obs(t, at, readings.iter().copied());
        }
    }

    /// Processes `pids` seen quiet (their threads alive, not waiting) for a whole window.
    fn seen_quiet(t: &mut Trigger, t0: Instant, pids: impl Iterator<Item = ProcId>) {
        let quiet: Vec<(ProcId, Reading)> = pids.map(|p| (p, r(0, 0, 1000))).collect();
        seen(t, t0, &quiet);
    }

    #[test]
    fn the_share_is_summed_over_the_window_and_needs_its_evidence() {
        let t0 = Instant::now();
        let mut t = Trigger::new(5.0, Duration::from_secs(3), Duration::from_secs(600));
        seen_quiet(&mut t, t0, [p(1), p(2)].into_iter());
        // 4% in each of 3 intervals: under 5% over the window (the other process quiet).
        for s in 1..=3 {
            obs(
                &mut t,
                secs(t0, s),
                [(p(1), r(40, 30, 1000)), (p(2), r(0, 0, 1000))],
            );
        }
        assert_eq!(t.decide(secs(t0, 3), false), Decision::default());
        // One interval at 11%: (40+40+110)/3000 = 6.3% over the last three.
        obs(
            &mut t,
            secs(t0, 4),
            [(p(1), r(110, 30, 1000)), (p(2), r(0, 0, 1000))],
        );
        assert_eq!(t.window(p(1)).reading, r(190, 90, 3000));
        assert_eq!(t.window(p(1)).span, Duration::from_secs(3));
        let d = t.decide(secs(t0, 4), false);
        assert_eq!(d.start.map(|s| s.0), Some(p(1)));
        // A share far above the threshold on fewer than MIN_WAITS waits triggers nothing.
        obs(&mut t, secs(t0, 5), [(p(2), r(900, MIN_WAITS - 1, 1000))]);
        assert!(t.decide(secs(t0, 5), false).start.is_none());
        obs(&mut t, secs(t0, 6), [(p(2), r(1, 1, 1000))]);
        assert_eq!(t.decide(secs(t0, 6), false).start.map(|s| s.0), Some(p(2)));
    }

    #[test]
    fn one_capture_at_a_time_the_longest_share_first_and_the_rest_counted_once() {
        let t0 = Instant::now();
        let mut t = Trigger::new(5.0, Duration::from_secs(30), Duration::from_secs(600));
        let readings: Vec<_> = (1..=1000)
            .map(|i| (p(i), r(50 + i as u64 % 7, 100, 1000)))
            .collect();
        // Each at its share over a whole window already.
        seen(&mut t, t0, &readings);
        obs(&mut t, secs(t0, 1), readings.clone());
        let d = t.decide(secs(t0, 1), false);
        assert_eq!(
            d.start.map(|s| s.0),
            Some(p(6)),
            "56 ms of 1 s is the longest"
        );
        assert_eq!((d.held.len(), d.waiting), (999, 999));
        assert!(d.held.iter().all(|(_, h)| *h == Held::Busy));
        // Still above, a capture running: none started, none counted again.
        obs(&mut t, secs(t0, 2), readings.clone());
        let d = t.decide(secs(t0, 2), true);
        assert_eq!((d.start, d.held.len(), d.waiting), (None, 0, 999));
        // The capture over: the next one, one at a time; the first, still above the
        // threshold in its cooldown, is the crossing already captured, not counted again.
        obs(&mut t, secs(t0, 3), readings);
        let d = t.decide(secs(t0, 3), false);
        assert_eq!(d.start.map(|s| s.0), Some(p(13)));
        assert_eq!((d.held.len(), d.waiting), (0, 998));
    }

    #[test]
    fn the_cooldown_holds_and_a_process_still_above_is_captured_after_it() {
        let t0 = Instant::now();
        let mut t = Trigger::new(5.0, Duration::from_secs(10), Duration::from_secs(60));
        seen_quiet(&mut t, t0, [p(1)].into_iter());
        let mut starts = Vec::new();
        let mut cooldowns = 0;
        // Above the threshold every second for 200 s.
        for s in 1..=200 {
            obs(&mut t, secs(t0, s), [(p(1), r(500, 100, 1000))]);
            let d = t.decide(secs(t0, s), false);
            if let Some((q, _)) = d.start {
                assert_eq!(q, p(1));
                starts.push(s);
            }
            cooldowns += d.held.len();
        }
        assert_eq!(starts, vec![1, 61, 121, 181]);
        // One crossing, captured: never counted as held, let alone once per second.
        assert_eq!(cooldowns, 0);
    }

    #[test]
    fn a_crossing_after_falling_back_is_counted_again_and_gone_processes_are_forgotten() {
        let t0 = Instant::now();
        let mut t = Trigger::new(5.0, Duration::from_secs(2), Duration::from_secs(600));
        seen_quiet(&mut t, t0, [p(1)].into_iter());
        obs(&mut t, secs(t0, 1), [(p(1), r(500, 100, 1000))]);
        assert!(t.decide(secs(t0, 1), false).start.is_some());
        obs(&mut t, secs(t0, 2), [(p(1), r(500, 100, 1000))]);
        assert_eq!(t.decide(secs(t0, 2), false), Decision::default());
        // Under the threshold over the window from 4 s: the crossing is over.
        for s in 3..=4 {
            obs(&mut t, secs(t0, s), [(p(1), r(0, 0, 1000))]);
            assert!(t.decide(secs(t0, s), false).held.is_empty());
        }
        obs(&mut t, secs(t0, 5), [(p(1), r(900, 100, 1000))]);
        assert_eq!(
            t.decide(secs(t0, 5), false).held,
            vec![(p(1), Held::Cooldown)]
        );
        // No readings for longer than the window: forgotten.
        obs(&mut t, secs(t0, 9), []);
        assert_eq!(t.tracked(), 0);
    }

    /// A burst is judged over a full window of the process's life as the agent saw it: a
    /// process contended only as it starts is not captured, nor does it hold another's
    /// capture back; one that stays contended is, once the agent has measured it a window; so
    /// is a long quiet process's, once a window has passed since its burst began.
    #[test]
    fn a_burst_is_weighed_against_a_full_window_of_the_processs_life() {
        let t0 = Instant::now();
        let mut t = Trigger::new(5.0, Duration::from_secs(5), Duration::from_secs(600));
        let (burst, steady) = (p(1), p(2));
        let mut starts = Vec::new();
        for s in 1..=12u64 {
            // The burst: 40% of its threads' time in its first second, nothing after.
            let b = if s == 1 {
                r(400, 50, 1000)
            } else {
                r(0, 0, 1000)
            };
            // Steady: 10% all along, from the same start.
            obs(
                &mut t,
                secs(t0, s),
                [(burst, b), (steady, r(100, 30, 1000))],
            );
            let d = t.decide(secs(t0, s), false);
            // Nothing measured less than a window is above the threshold, held or waiting.
            if s < 5 {
                assert_eq!(d, Decision::default(), "at {s} s");
            }
            starts.extend(d.start.map(|(q, w)| (s, q, w)));
        }
        // The steady process once measured a window, over the window's 5 s; the burst (8% of
        // its first five seconds' time, 40% of its first) never.
        assert_eq!(starts.len(), 1, "{starts:?}");
        let (at, q, w) = starts[0];
        assert_eq!((at, q), (5, steady));
        assert_eq!(w.span, Duration::from_secs(5));
        assert_eq!(w.reading, r(500, 150, 5000));
        // A burst that lasts: 40% for three seconds holds over the first five (24%).
        let mut t = Trigger::new(5.0, Duration::from_secs(5), Duration::from_secs(600));
        let mut first = None;
        for s in 1..=8u64 {
            let b = if s <= 3 {
                r(400, 50, 1000)
            } else {
                r(0, 0, 1000)
            };
            obs(&mut t, secs(t0, s), [(burst, b)]);
            if let Some((_, w)) = t.decide(secs(t0, s), false).start {
                first.get_or_insert((s, w.reading.share()));
            }
        }
        assert_eq!(first, Some((5, 0.24)));
        // A process the agent first sees in a burst (its threads' first contended waits, after
        // a long quiet life): judged once a window has passed, its idle threads counted.
        let mut t = Trigger::new(5.0, Duration::from_secs(5), Duration::from_secs(600));
        let mut got = Vec::new();
        for s in 1..=8u64 {
            let b = if s == 1 {
                r(900, 80, 1000)
            } else {
                r(0, 0, 1000)
            };
            obs(&mut t, secs(t0, s), [(burst, b)]);
            got.extend(
                t.decide(secs(t0, s), false)
                    .start
                    .map(|(_, w)| (s, w.reading.share())),
            );
        }
        // 18% over its first window: captured then, not at its first second (90%).
        assert_eq!(got, [(5, 0.18)]);
    }
}
