//! A summary's `samples`: every distinct sampled stack of a process with its frames (named in
//! parts: function, script and line, file and build id) and its labels (role, thread name,
//! cause, read or write), what a pprof profile is made of (`report RUN.json --pprof`), so
//! that a saved run gives the same profile as the live one. Bounded per process; what is cut
//! is counted, so the totals stay those of the sampled acquisitions.

use std::{borrow::Cow, collections::HashMap};

use profiler_common::cause;
use serde::{Deserialize, Serialize};

use super::{MAX_STACK_CUTS, StackCutReport, ThreadReport};
use crate::registry::{
    roles::Role,
    stacks::{OwnerStacks, SampledFrame, StackAgg},
};

/// Most distinct stacks a process's `samples` keeps (those that waited longest).
pub const MAX_SAMPLED_STACKS: usize = 5000;

/// One frame, named in parts (the report's `frames` labels join them).
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FrameReport {
    /// A native symbol, a JavaScript function, V8's name for other generated code,
    /// `[js unknown]`, `[jit]`, or `0x…` (an address in a file with no symbol for it).
    pub function: String,
    /// A JavaScript function's script, where it is defined.
    pub script: Option<String>,
    pub line: Option<u32>,
    pub column: Option<u32>,
    /// The file mapped whose code it is (native frames), as the process mapped it.
    pub dso: Option<String>,
    /// Its GNU build id, in hex, when known.
    pub build_id: Option<String>,
}

impl FrameReport {
    /// How the report shows it, as a sampled frame is shown (`SampledFrame::label`):
    /// `function (file)` for native code, `name (script:line:column)` for JavaScript.
    pub fn label(&self) -> String {
        crate::registry::stacks::label_parts(
            &self.function,
            self.script.as_deref(),
            [self.line, self.column],
            self.dso.as_deref(),
        )
    }
}

impl SampledStacks {
    /// The sampled write stacks folded for flame graphs (`outermost;...;innermost`, a `;` in
    /// a name written `:`), each with its count, the most sampled first: the waiters' own
    /// stacks of writes (not the holders' rows), their labels merged.
    pub fn folded_writes(&self) -> Vec<super::FlameStack> {
        let labels: Vec<String> = self
            .frames
            .iter()
            .map(|f| f.label().replace(';', ":"))
            .collect();
        let mut by: HashMap<String, u64> = HashMap::new();
        for s in self.stacks.iter().filter(|s| !s.holder && s.op == "write") {
            let stack = (s.frames.iter().rev())
                .filter_map(|&i| labels.get(i as usize).map(String::as_str))
                .collect::<Vec<_>>()
                .join(";");
            *by.entry(stack).or_default() += s.count;
        }
        let mut out: Vec<super::FlameStack> = by
            .into_iter()
            .map(|(stack, count)| super::FlameStack { stack, count })
            .collect();
        out.sort_by(|a, b| (b.count, &a.stack).cmp(&(a.count, &b.stack)));
        out
    }
}

impl From<&SampledFrame> for FrameReport {
    fn from(f: &SampledFrame) -> Self {
        FrameReport {
            function: f.function.clone(),
            script: f.script.clone(),
            line: f.line,
            column: f.column,
            dso: f.dso.clone(),
            build_id: f.build_id.clone(),
        }
    }
}

/// Sampled acquisitions of one stack by threads of one role and name, for one cause.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampleReport {
    /// Indices into `frames`, innermost first.
    pub frames: Vec<u32>,
    pub role: Role,
    /// The threads' name.
    pub comm: String,
    /// A write cause, or `read`.
    pub cause: Cow<'static, str>,
    /// `write` or `read`.
    pub op: Cow<'static, str>,
    pub count: u64,
    pub wait_ns_sum: u64,
    /// Absent where holds are not measured (contention mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_ns_sum: Option<u64>,
    /// Contention mode: true for a holder's stack, the writer a sampled wait began behind
    /// (`role`, `comm` and `cause` are the holder's: what it held the lock for; `count` and
    /// `wait_ns_sum` the waits charged to it); absent for the waiters' own stacks.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub holder: bool,
}

/// What was left out past [`MAX_SAMPLED_STACKS`]: the waiters' rows in `count`,
/// `wait_ns_sum` and `hold_ns_sum`, the holders' apart (`holder_*`), so that each side's
/// totals stay whole and no wait is counted on both.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampleCut {
    pub stacks: u64,
    pub count: u64,
    pub wait_ns_sum: u64,
    /// Absent where holds are not measured (contention mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_ns_sum: Option<u64>,
    /// The holders' rows cut: the waits charged to them (absent when none was cut).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub holder_count: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub holder_wait_ns_sum: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl SampleCut {
    pub fn add(&mut self, s: &SampleReport) {
        self.stacks += 1;
        if s.holder {
            self.holder_count += s.count;
            self.holder_wait_ns_sum += s.wait_ns_sum;
            return;
        }
        self.count += s.count;
        self.wait_ns_sum += s.wait_ns_sum;
        if let Some(h) = s.hold_ns_sum {
            *self.hold_ns_sum.get_or_insert(0) += h;
        }
    }
}

impl SampledStacks {
    /// Keeps the `n` stacks that waited longest (the first), counting the others in `cut`,
    /// and only the frames those `n` use.
    pub fn keep_first(&mut self, n: usize) {
        if self.stacks.len() <= n {
            return;
        }
        for s in self.stacks.drain(n..) {
            self.cut.add(&s);
        }
        let mut index: HashMap<u32, u32> = HashMap::new();
        let mut frames = Vec::new();
        for s in &mut self.stacks {
            for i in &mut s.frames {
                *i = *index.entry(*i).or_insert_with(|| {
                    frames.push(std::mem::take(&mut self.frames[*i as usize]));
                    frames.len() as u32 - 1
                });
            }
        }
        self.frames = frames;
    }

    /// Holds not measured (contention mode): absent rather than zero.
    pub fn drop_holds(&mut self) {
        for s in &mut self.stacks {
            s.hold_ns_sum = None;
        }
        self.cut.hold_ns_sum = None;
    }
}

/// A process's distinct sampled stacks.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampledStacks {
    /// The frames the stacks refer to, each once.
    pub frames: Vec<FrameReport>,
    /// Longest total wait first.
    pub stacks: Vec<SampleReport>,
    #[serde(default)]
    pub cut: SampleCut,
}

/// `read` or `write`, from a sample's cause.
fn op_of(c: u32) -> &'static str {
    if c == cause::READ { "read" } else { "write" }
}

/// A process's sampled stacks for its report: per stack, thread role and name (from the
/// report's threads, listed or `grouped`; a thread not among them is `other`) and cause, the
/// threads merged; the [`MAX_SAMPLED_STACKS`] that waited longest kept, the rest counted in
/// `cut`.
pub fn sampled_stacks(
    o: &OwnerStacks,
    threads: &[ThreadReport],
    grouped: &HashMap<u32, (Role, String)>,
) -> SampledStacks {
    let by_tid: HashMap<u32, &ThreadReport> = threads.iter().rev().map(|t| (t.tid, t)).collect();
    sampled_stacks_by(o, |tid| match by_tid.get(&tid) {
        Some(t) => (t.role, t.comm.clone()),
        None => grouped
            .get(&tid)
            .cloned()
            .unwrap_or((Role::Other, String::new())),
    })
}

/// A process's cut stacks ([`OwnerStacks::cuts`]) by its threads' role and name (told as
/// [`sampled_stacks`] tells them), reason and file, most first, [`MAX_STACK_CUTS`] rows.
pub fn stack_cuts(
    o: &OwnerStacks,
    threads: &[ThreadReport],
    grouped: &HashMap<u32, (Role, String)>,
) -> Vec<StackCutReport> {
    let by_tid: HashMap<u32, &ThreadReport> = threads.iter().rev().map(|t| (t.tid, t)).collect();
    let mut rows: HashMap<(Role, String, &str, &str), u64> = HashMap::new();
    for ((tid, end, file), n) in &o.cuts {
        let (role, comm) = match by_tid.get(tid) {
            Some(t) => (t.role, t.comm.clone()),
            None => grouped
                .get(tid)
                .cloned()
                .unwrap_or((Role::Other, String::new())),
        };
        *rows
            .entry((role, comm, end.as_str(), file.as_str()))
            .or_default() += n;
    }
    let mut out: Vec<StackCutReport> = rows
        .into_iter()
        .map(|((role, comm, end, file), stacks)| StackCutReport {
            role,
            comm,
            end: end.to_string(),
            stops_in: file.to_string(),
            stacks,
        })
        .collect();
    out.sort_by(|a, b| {
        (b.stacks, &a.end, &a.stops_in, &a.comm).cmp(&(a.stacks, &b.end, &b.stops_in, &b.comm))
    });
    out.truncate(MAX_STACK_CUTS);
    out
}

/// [`sampled_stacks`], each thread's role and name told by `thread` (by tid).
pub fn sampled_stacks_by(o: &OwnerStacks, thread: impl Fn(u32) -> (Role, String)) -> SampledStacks {
    let mut threads: HashMap<u32, (Role, String)> = HashMap::new();
    for k in o.samples.keys().chain(o.holder_samples.keys()) {
        threads.entry(k.tid).or_insert_with(|| thread(k.tid));
    }
    type Key<'a> = (&'a [u32], Role, &'a str, u32, bool);
    let mut merged: HashMap<Key<'_>, StackAgg> = HashMap::new();
    let all =
        (o.samples.iter().map(|s| (s, false))).chain(o.holder_samples.iter().map(|s| (s, true)));
    for ((k, agg), holder) in all {
        let (role, comm) = &threads[&k.tid];
        merged
            .entry((&k.frames, *role, comm.as_str(), k.cause, holder))
            .or_default()
            .add(agg);
    }
    let mut rows: Vec<(Key<'_>, StackAgg)> = merged.into_iter().collect();
    rows.sort_by(|(a, x), (b, y)| (y.wait_ns_sum, y.count, a).cmp(&(x.wait_ns_sum, x.count, b)));
    let mut out = SampledStacks::default();
    let mut index: HashMap<u32, u32> = HashMap::new();
    for (n, ((frames, role, comm, c, holder), agg)) in rows.into_iter().enumerate() {
        let row = SampleReport {
            frames: Vec::new(),
            role,
            comm: comm.to_string(),
            cause: cause::name(c).into(),
            op: op_of(c).into(),
            count: agg.count,
            wait_ns_sum: agg.wait_ns_sum,
            hold_ns_sum: Some(agg.hold_ns_sum),
            holder,
        };
        if n >= MAX_SAMPLED_STACKS {
            out.cut.add(&row);
            continue;
        }
        let frames = (frames.iter())
            .map(|&i| {
                *index.entry(i).or_insert_with(|| {
                    out.frames.push(FrameReport::from(o.frames.get(i)));
                    out.frames.len() as u32 - 1
                })
            })
            .collect();
        out.stacks.push(SampleReport { frames, ..row });
    }
    out
}
