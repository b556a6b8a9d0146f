//! The agent's recent sampled stacks, for `/debug/pprof/mmaplock`: a ring of per-interval
//! aggregates (each process's distinct stacks with their labels, count, wait and hold), at
//! most [`MAX_SECONDS`] of them and at most a budget of memory. Frames are interned across
//! intervals and counted (an interval repeats the stacks of the one before): a frame is kept
//! while an interval of the ring refers to it. Past the budget the oldest intervals go
//! first; an interval larger than the budget alone keeps its stacks that waited longest and
//! counts the rest as cut, so a profile's totals are still the sampled ones.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use crate::{
    output::{
        pprof::{Frames, Mode, ProcessSamples, Samples},
        report::{FrameReport, SampleCut, SampleReport, SampledStacks, rfc3339},
    },
    vocab::ids::ProcId,
};

/// The longest window a scrape may ask for (`?seconds=`), and what the ring keeps.
pub const MAX_SECONDS: u64 = 600;

/// What the ring may hold, roughly (strings, frames' indices, rows).
pub const BUDGET_BYTES: usize = 64 << 20;

/// Frames kept once, with how many stacks of the ring refer to them.
#[derive(Default)]
struct Interned {
    slots: Vec<Option<(FrameReport, u32)>>,
    index: HashMap<FrameReport, u32>,
    free: Vec<u32>,
    bytes: usize,
}

fn frame_bytes(f: &FrameReport) -> usize {
    let s = |o: &Option<String>| o.as_ref().map_or(0, String::len);
    // The frame twice (slot and index key), its strings once each time.
    2 * (size_of::<FrameReport>() + f.function.len() + s(&f.script) + s(&f.dso) + s(&f.build_id))
}

impl Interned {
    fn add(&mut self, f: &FrameReport) -> u32 {
        if let Some(&i) = self.index.get(f) {
            if let Some((_, refs)) = &mut self.slots[i as usize] {
                *refs += 1;
            }
            return i;
        }
        let i = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(None);
                self.slots.len() as u32 - 1
            }
        };
        self.slots[i as usize] = Some((f.clone(), 1));
        self.index.insert(f.clone(), i);
        self.bytes += frame_bytes(f);
        i
    }

    fn release(&mut self, i: u32) {
        let Some(Some((f, refs))) = self.slots.get_mut(i as usize) else {
            return;
        };
        *refs -= 1;
        if *refs == 0 {
            let f = std::mem::take(f);
            self.bytes -= frame_bytes(&f);
            self.index.remove(&f);
            self.slots[i as usize] = None;
            self.free.push(i);
        }
    }

    fn live(&self) -> usize {
        self.index.len()
    }
}

impl Frames for Interned {
    fn frame(&self, i: u32) -> Option<&FrameReport> {
        self.slots.get(i as usize)?.as_ref().map(|(f, _)| f)
    }
}

/// One process's stacks in one interval, frames as indices into the ring's [`Interned`].
struct ProcessInterval {
    /// The process (its labels may not tell it apart: no pid unless asked).
    proc: ProcId,
    labels: Vec<(&'static str, String)>,
    exe: Option<String>,
    stacks: Vec<SampleReport>,
    cut: SampleCut,
}

struct Interval {
    start: SystemTime,
    end: SystemTime,
    processes: Vec<ProcessInterval>,
    /// Its rows' share of the budget (its frames are counted in [`Interned`]).
    bytes: usize,
}

fn row_bytes(r: &SampleReport) -> usize {
    size_of::<SampleReport>() + 4 * r.frames.len() + r.comm.len()
}

/// The ring (see the module's doc).
pub struct Profiles {
    frames: Interned,
    intervals: VecDeque<Interval>,
    bytes: usize,
    budget: usize,
    /// The sampling rate (one in N per thread) and what is sampled.
    rate: u32,
    /// `--max-stack-rate`: past it a process is sampled less often, its samples weighted to
    /// `rate` (0: no bound).
    max_stack_rate: u32,
    mode: Mode,
    /// Intervals dropped before their time to stay within the budget.
    pub dropped: u64,
}

/// A process's labels, as its metrics carry them.
pub type Labels = Vec<(&'static str, String)>;

/// One process's sampled stacks of an interval, with its labels and executable.
pub struct ProcessSampled {
    pub proc: ProcId,
    pub labels: Labels,
    pub exe: Option<String>,
    pub stacks: SampledStacks,
}

/// The ring as the agent and its web server share it.
pub type SharedProfiles = Arc<Mutex<Profiles>>;

impl Profiles {
    pub fn new(rate: u32, mode: Mode, budget: usize) -> Self {
        Profiles {
            frames: Interned::default(),
            intervals: VecDeque::new(),
            bytes: 0,
            budget,
            rate,
            max_stack_rate: 0,
            mode,
            dropped: 0,
        }
    }

    /// With a bound on stacks a second per process (`--max-stack-rate`), said in the
    /// profiles' comments.
    pub fn bounded(mut self, max_stack_rate: u32) -> Self {
        self.max_stack_rate = max_stack_rate;
        self
    }

    /// Adds an interval: each process's labels and stacks; then forgets the intervals that
    /// ended more than [`MAX_SECONDS`] before it, and the oldest while over the budget.
    pub fn push(&mut self, start: SystemTime, end: SystemTime, processes: Vec<ProcessSampled>) {
        let mut interval = Interval {
            start,
            end,
            processes: Vec::with_capacity(processes.len()),
            bytes: 0,
        };
        for ProcessSampled {
            proc,
            labels,
            exe,
            stacks: s,
        } in processes
        {
            let stacks: Vec<SampleReport> = (s.stacks.into_iter())
                .map(|mut r| {
                    r.frames = (r.frames.iter())
                        .filter_map(|&f| s.frames.get(f as usize))
                        .map(|f| self.frames.add(f))
                        .collect();
                    interval.bytes += row_bytes(&r);
                    r
                })
                .collect();
            interval.processes.push(ProcessInterval {
                proc,
                labels,
                exe,
                stacks,
                cut: s.cut,
            });
        }
        self.bytes += interval.bytes;
        self.intervals.push_back(interval);
        let horizon = end - Duration::from_secs(MAX_SECONDS);
        while self.intervals.len() > 1 {
            let old = self.intervals[0].end < horizon;
            if !old && self.held().0 <= self.budget {
                break;
            }
            if !old {
                self.dropped += 1;
            }
            self.pop();
        }
        if self.held().0 > self.budget {
            self.trim_last();
        }
    }

    /// The last interval, alone over the budget: its stacks that waited least are cut (and
    /// counted) until it fits.
    fn trim_last(&mut self) {
        let Some(last) = self.intervals.back_mut() else {
            return;
        };
        let mut rows: Vec<(usize, SampleReport)> = Vec::new();
        for (i, p) in last.processes.iter_mut().enumerate() {
            rows.extend(p.stacks.drain(..).map(|r| (i, r)));
        }
        rows.sort_by_key(|(_, r)| std::cmp::Reverse((r.wait_ns_sum, r.count)));
        while self.bytes + self.frames.bytes > self.budget {
            let Some((i, r)) = rows.pop() else { break };
            for &f in &r.frames {
                self.frames.release(f);
            }
            self.bytes -= row_bytes(&r);
            last.bytes -= row_bytes(&r);
            last.processes[i].cut.add(&r);
        }
        for (i, r) in rows {
            last.processes[i].stacks.push(r);
        }
    }

    fn pop(&mut self) {
        let Some(gone) = self.intervals.pop_front() else {
            return;
        };
        self.bytes -= gone.bytes;
        for r in gone.processes.iter().flat_map(|p| &p.stacks) {
            for &f in &r.frames {
                self.frames.release(f);
            }
        }
    }

    /// The intervals that ended in the last `seconds` before `now` (None: the last one).
    pub fn window(&self, seconds: Option<u64>, now: SystemTime) -> Window<'_> {
        let from = match seconds {
            None => self.intervals.len().saturating_sub(1),
            Some(s) => {
                let since = now - Duration::from_secs(s);
                (self.intervals.iter())
                    .position(|i| i.end > since)
                    .unwrap_or(self.intervals.len())
            }
        };
        Window {
            ring: self,
            from,
            only: None,
        }
    }

    /// The intervals that ended after `since` (a push's: consecutive pushes cover every
    /// interval once), and when the last of them ended (None: none did).
    pub fn window_since(&self, since: SystemTime) -> (Window<'_>, Option<SystemTime>) {
        let from = (self.intervals.iter())
            .position(|i| i.end > since)
            .unwrap_or(self.intervals.len());
        let last = self.intervals.back().map(|i| i.end).filter(|e| *e > since);
        let w = Window {
            ring: self,
            from,
            only: None,
        };
        (w, last)
    }

    /// [`window`](Self::window), of one process's stacks only (a capture's `before.pb.gz`).
    pub fn window_of(&self, seconds: u64, now: SystemTime, p: ProcId) -> Window<'_> {
        Window {
            only: Some(p),
            ..self.window(Some(seconds), now)
        }
    }

    /// Memory held, roughly, and frames kept (for tests and the notes).
    pub fn held(&self) -> (usize, usize) {
        (self.bytes + self.frames.bytes, self.frames.live())
    }
}

/// Some of the ring's last intervals, as one profile.
pub struct Window<'a> {
    ring: &'a Profiles,
    from: usize,
    only: Option<ProcId>,
}

impl Window<'_> {
    fn intervals(&self) -> impl Iterator<Item = &Interval> {
        self.ring.intervals.iter().skip(self.from)
    }
}

impl Samples for Window<'_> {
    fn mode(&self) -> Mode {
        self.ring.mode
    }
    fn rate(&self) -> Option<u32> {
        Some(self.ring.rate)
    }
    fn span_ns(&self) -> (i64, i64) {
        let ns = |t: SystemTime| {
            t.duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as i64)
        };
        match (self.intervals().next(), self.intervals().last()) {
            (Some(a), Some(b)) => (ns(a.start), ns(b.end) - ns(a.start)),
            _ => (ns(SystemTime::now()), 0),
        }
    }
    fn notes(&self) -> Vec<String> {
        let mut notes = match (self.intervals().next(), self.intervals().last()) {
            (Some(a), Some(b)) => {
                let n = self.intervals().count();
                vec![format!(
                    "intervals from {} to {} ({n} interval{} of the agent)",
                    rfc3339(a.start),
                    rfc3339(b.end),
                    if n == 1 { "" } else { "s" }
                )]
            }
            _ => vec!["no interval yet".to_string()],
        };
        if self.ring.max_stack_rate > 0 {
            notes.push(format!(
                "a process taking more than {} stacks a second is sampled less often, each of its samples weighted as the ones in 1 in {} it stands for: the values are all in the same units",
                self.ring.max_stack_rate, self.ring.rate
            ));
        }
        if self.ring.dropped > 0 {
            notes.push(format!(
                "{} earlier intervals dropped to keep the agent's memory bounded",
                self.ring.dropped
            ));
        }
        notes
    }
    fn processes(&self) -> Vec<ProcessSamples<'_>> {
        (self.intervals().flat_map(|i| &i.processes))
            .filter(|p| self.only.is_none_or(|only| p.proc == only))
            .map(|p| ProcessSamples {
                labels: p.labels.clone(),
                exe: p.exe.as_deref(),
                frames: &self.ring.frames,
                stacks: &p.stacks,
                cut: p.cut,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::roles::Role;

    /// An interval's samples of process `pid`: `n` stacks, each of frames of its own
    /// (`f{seed}-{i}`) and one shared by all (`main`), each sampled once, waiting 10 ns.
    fn stacks(seed: u64, n: u32) -> SampledStacks {
        let mut s = SampledStacks::default();
        s.frames.push(FrameReport {
            function: "main".into(),
            ..FrameReport::default()
        });
        for i in 0..n {
            s.frames.push(FrameReport {
                function: format!("f{seed}-{i}-{}", "x".repeat(100)),
                ..FrameReport::default()
            });
            s.stacks.push(SampleReport {
                frames: vec![i + 1, 0],
                role: Role::Worker,
                comm: "node".into(),
                cause: "mmap".into(),
                op: "write".into(),
                count: 1,
                wait_ns_sum: 10,
                hold_ns_sum: Some(1),
                holder: false,
            });
        }
        s
    }

    fn at(s: u64) -> SystemTime {
        std::time::UNIX_EPOCH + Duration::from_secs(1_000_000 + s)
    }

    fn sampled(proc: ProcId, stacks: SampledStacks) -> ProcessSampled {
        ProcessSampled {
            proc,
            labels: vec![("process", "node".into())],
            exe: Some("/usr/bin/node".into()),
            stacks,
        }
    }

    fn totals(w: &Window<'_>) -> (u64, u64) {
        let mut t = (0, 0);
        for p in w.processes() {
            for r in p.stacks {
                t = (t.0 + r.count, t.1 + r.wait_ns_sum);
            }
            t = (t.0 + p.cut.count, t.1 + p.cut.wait_ns_sum);
        }
        t
    }

    #[test]
    fn a_window_is_the_intervals_that_ended_in_its_seconds() {
        let mut ring = Profiles::new(64, Mode::Full, BUDGET_BYTES);
        for k in 0..5 {
            ring.push(
                at(k),
                at(k + 1),
                vec![sampled(ProcId::new(1, 1), stacks(k, 3))],
            );
        }
        let now = at(5);
        assert_eq!(totals(&ring.window(None, now)), (3, 30));
        assert_eq!(totals(&ring.window(Some(2), now)), (6, 60));
        assert_eq!(totals(&ring.window(Some(MAX_SECONDS), now)), (15, 150));
        let w = ring.window(Some(2), now);
        assert_eq!(w.span_ns(), (1_000_003_000_000_000, 2_000_000_000));
        // The shared frame is kept once: 5 x 3 of their own, and `main`.
        assert_eq!(ring.held().1, 16);
        // Past MAX_SECONDS, intervals go, and the frames only they referred to.
        ring.push(
            at(700),
            at(701),
            vec![sampled(ProcId::new(1, 1), stacks(9, 1))],
        );
        assert_eq!(ring.intervals.len(), 1);
        assert_eq!(ring.held().1, 2);
    }

    /// Pushes take what ended since the last one: each interval once, none left out.
    #[test]
    fn windows_since_the_last_push_tile_the_intervals() {
        let mut ring = Profiles::new(64, Mode::Full, BUDGET_BYTES);
        let mut since = std::time::UNIX_EPOCH;
        let mut pushed = (0, 0);
        for k in 0..7 {
            ring.push(
                at(k),
                at(k + 1),
                vec![sampled(ProcId::new(1, 1), stacks(k, 2))],
            );
            if k % 3 == 2 {
                let (w, last) = ring.window_since(since);
                let t = totals(&w);
                pushed = (pushed.0 + t.0, pushed.1 + t.1);
                since = last.unwrap();
            }
        }
        let (w, last) = ring.window_since(since);
        let t = totals(&w);
        assert_eq!((pushed.0 + t.0, pushed.1 + t.1), (14, 140));
        assert_eq!(last, Some(at(7)));
        let (w, last) = ring.window_since(at(7));
        assert_eq!((totals(&w), last), ((0, 0), None));
    }

    #[test]
    fn one_process_window_leaves_the_others_out() {
        let mut ring = Profiles::new(64, Mode::Full, BUDGET_BYTES);
        for k in 0..5 {
            let mut v = vec![sampled(ProcId::new(1, 1), stacks(k, 3))];
            if k >= 3 {
                v.push(sampled(ProcId::new(2, 1), stacks(k + 10, 4)));
            }
            ring.push(at(k), at(k + 1), v);
        }
        assert_eq!(
            totals(&ring.window_of(3, at(5), ProcId::new(2, 1))),
            (8, 80)
        );
        assert_eq!(
            totals(&ring.window_of(3, at(5), ProcId::new(1, 1))),
            (9, 90)
        );
        assert_eq!(totals(&ring.window(Some(3), at(5))), (17, 170));
        // The same pid, started at another time, is another process.
        assert_eq!(totals(&ring.window_of(3, at(5), ProcId::new(2, 9))), (0, 0));
    }

    #[test]
    fn memory_stays_within_the_budget_and_totals_stay_whole() {
        let budget = 64 << 10;
        let mut ring = Profiles::new(1, Mode::Full, budget);
        for k in 0..200 {
            ring.push(
                at(k),
                at(k + 1),
                vec![sampled(ProcId::new(1, 1), stacks(k, 20))],
            );
            assert!(ring.held().0 <= budget, "{:?} at {k}", ring.held());
        }
        assert!(ring.dropped > 0);
        // An interval larger than the budget alone: its stacks that fit, the rest cut, its
        // totals whole.
        ring.push(
            at(300),
            at(301),
            vec![sampled(ProcId::new(1, 1), stacks(300, 2000))],
        );
        assert!(ring.held().0 <= budget);
        let w = ring.window(None, at(301));
        assert_eq!(totals(&w), (2000, 20_000));
        assert!(w.processes()[0].cut.stacks > 0);
    }
}
