//! What is kept of one process's sampled writes: by code (`dsos`), by JavaScript function,
//! and each distinct stack of a thread for a cause with its count, wait and hold (what a pprof
//! profile's samples are), its frames named once in the process's [`FrameTable`].

use std::collections::{BTreeMap, HashMap};

use super::{FrameTable, RawFrame};
use crate::{
    registry::{perfmap::JsFunction, unwind::StackEnd},
    vocab::{hist::SideStats, ids::ProcId},
};

/// A distinct stack's totals: sampled acquisitions, their wait and their hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackAgg {
    pub count: u64,
    pub wait_ns_sum: u64,
    pub hold_ns_sum: u64,
}

impl StackAgg {
    pub fn add(&mut self, o: &StackAgg) {
        self.count += o.count;
        self.wait_ns_sum += o.wait_ns_sum;
        self.hold_ns_sum += o.hold_ns_sum;
    }
}

/// One distinct sampled stack of a thread, for one cause: what a profile's sample is.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SampleKey {
    /// The thread that took the lock.
    pub tid: u32,
    /// What it took it for: a write cause, or `cause::READ` for a read (in the kernel's
    /// record, `StackHeader::kind`).
    pub cause: u32,
    /// Frames innermost first, as indices into the owner's [`FrameTable`].
    pub frames: Vec<u32>,
}

/// Sampled JavaScript frames by where their name came from (weighted by samples), to show
/// that the heap and the perf map agree.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JsFrameCounts {
    /// Named from the heap only.
    pub v8: u64,
    /// Named from the perf map only.
    pub perf_map: u64,
    /// Named by both, alike.
    pub agree: u64,
    /// Named by both, differently (the heap's name is shown).
    pub disagree: u64,
    /// V8 frames whose function could not be told.
    pub unknown: u64,
}

/// One process's sampled writes by code.
#[derive(Clone, Debug, Default)]
pub struct OwnerStacks {
    /// Sampled stacks by why they end where they do.
    pub stack_ends: BTreeMap<StackEnd, u64>,
    /// The stacks that stop before their thread's first frame, by thread, reason and the
    /// file their outermost frame is in: which threads' stacks cannot be read, and why.
    pub cuts: BTreeMap<(u32, StackEnd, String), u64>,
    pub js_frames: JsFrameCounts,
    /// Whether anything could name JavaScript frames (a perf map, or V8's layout).
    pub js_source: bool,
    /// Why V8 frames could not be named from the heap (an unknown V8 layout).
    pub v8_note: Option<String>,
    pub dsos: BTreeMap<String, SideStats>,
    /// Sampled writes by the innermost JavaScript function of the application on their stack
    /// (needs V8's perf map); filled by [`StackAttribution::symbolize`].
    pub js_functions: BTreeMap<JsFunction, StackAgg>,
    /// Sampled writes through JIT code that no perf map named (node runs without
    /// `--perf-basic-prof`): the report then says how to name them.
    pub unnamed_jit: u64,
    /// The frames of `samples`, named (filled by [`StackAttribution::symbolize`]).
    pub frames: FrameTable,
    /// Sampled acquisitions by thread, cause and stack, symbolized (filled by
    /// [`StackAttribution::symbolize`]).
    pub samples: HashMap<SampleKey, StackAgg>,
    /// Stacks as addresses in the process that took the lock, not yet symbolized.
    pub(super) raw: HashMap<RawKey, StackAgg>,
    /// Contention mode: the stacks of the writers that sampled waits began behind (threads
    /// of this process), by holder thread, what it held the lock for and stack, each with the
    /// waits (`count`) and the wait (`wait_ns_sum`) charged to it; symbolized as `samples`.
    pub holder_samples: HashMap<SampleKey, StackAgg>,
    /// The holders' samples by the innermost JavaScript function of the application on
    /// their stack, and what they held the lock for (a write cause).
    pub holder_js_functions: BTreeMap<(JsFunction, u32), StackAgg>,
    pub(super) holder_raw: HashMap<RawKey, StackAgg>,
}

impl OwnerStacks {
    /// Sampled writes by JavaScript function (`name (definition)`), most first.
    pub fn js_function_counts(&self) -> Vec<(String, u64)> {
        let mut f: Vec<(String, u64)> = (self.js_functions.iter())
            .map(|(js, agg)| {
                let label = if js.location.is_empty() {
                    js.name.clone()
                } else {
                    format!("{} ({})", js.name, js.location)
                };
                (label, agg.count)
            })
            .collect();
        f.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        f
    }

    /// The distinct stacks as the report shows them (`function (file)`, innermost first),
    /// whatever thread and cause sampled them.
    pub fn stacks(&self) -> HashMap<Vec<String>, StackAgg> {
        self.labelled(&self.samples)
    }

    /// The holders' distinct stacks, as [`stacks`](Self::stacks) has the waiters'.
    pub fn holder_stacks(&self) -> HashMap<Vec<String>, StackAgg> {
        self.labelled(&self.holder_samples)
    }

    fn labelled(&self, samples: &HashMap<SampleKey, StackAgg>) -> HashMap<Vec<String>, StackAgg> {
        let mut labels: HashMap<u32, String> = HashMap::new();
        let mut out: HashMap<Vec<String>, StackAgg> = HashMap::new();
        for (k, agg) in samples {
            let frames = (k.frames.iter())
                .map(|&i| {
                    labels
                        .entry(i)
                        .or_insert_with(|| self.frames.get(i).label())
                        .clone()
                })
                .collect();
            out.entry(frames).or_default().add(agg);
        }
        out
    }
}

/// A sampled stack before it is named: the process whose code it ran, the thread, the cause,
/// the frames.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct RawKey {
    pub(super) actor: ProcId,
    pub(super) tid: u32,
    pub(super) cause: u32,
    pub(super) frames: Vec<RawFrame>,
}
