//! Symbolizing what was sampled: stacks named on the ELF files and V8's names (so exited
//! processes are fine), JavaScript functions, folded stacks.

use std::fmt::Write as _;

use crate::registry::{perfmap::JsFunction, unwind::Frame, v8::Resolved};
use crate::vocab::ids::ProcId;

use super::{
    JsRef, OwnerStacks, SampleKey, SampledFrame, StackAttribution,
    labels::{count_js_frame, js_of},
};

/// The innermost JavaScript function of the application among a stack's JavaScript frames
/// (innermost first): node's own library (`node:buffer`, `node:internal/...`) and V8's
/// built-in functions, which have no script (`Uint8Array`, `get byteLength`), are passed over
/// unless nothing else is there.
pub(super) fn innermost_application<'a>(js: &[&'a JsFunction]) -> Option<&'a JsFunction> {
    js.iter()
        .find(|f| !f.location.is_empty() && !f.location.starts_with("node:"))
        .or(js.first())
        .copied()
}

impl StackAttribution {
    /// Names the stacks gathered so far (on the ELF files, so exited processes are fine).
    pub fn symbolize(&mut self) {
        self.flush();
        self.symbolize_where(|_| true);
    }

    /// Names the stacks taken by the processes that `which` selects (and the stacks of the
    /// holders their waits began behind).
    pub(super) fn symbolize_where(&mut self, which: impl Fn(ProcId) -> bool) {
        for (&owner, o) in self.owners.iter_mut() {
            // What this process's JavaScript frames could be named by.
            if let Some(Some(u)) = self.unwinders.get(&owner) {
                o.js_source |= u.has_perf_map() || u.v8.is_some();
                if o.v8_note.is_none() {
                    o.v8_note.clone_from(&u.v8_note);
                }
            }
            for holders in [false, true] {
                let from = if holders {
                    &mut o.holder_raw
                } else {
                    &mut o.raw
                };
                let raw: Vec<_> = from.extract_if(|k, _| which(k.actor)).collect();
                for (key, agg) in raw {
                    let unwinder = self.unwinders.get_mut(&key.actor).and_then(Option::as_mut);
                    // Without an unwinder the ip alone is known, not whether it is JIT code.
                    let known = unwinder.is_some();
                    let frames = name_frames(unwinder, &key.frames, &self.js_names);
                    let js_frames: Vec<&JsFunction> = frames.iter().filter_map(js_of).collect();
                    let js = innermost_application(&js_frames).cloned();
                    if holders {
                        if let Some(js) = js {
                            (o.holder_js_functions.entry((js, key.cause)))
                                .or_default()
                                .add(&agg);
                        }
                    } else {
                        for f in &frames {
                            count_js_frame(&mut o.js_frames, f, agg.count);
                        }
                        if let Some(js) = js {
                            o.js_functions.entry(js).or_default().add(&agg);
                        } else if known && frames.iter().any(|f| f.dso.is_none() && f.jit.is_none())
                        {
                            o.unnamed_jit += agg.count;
                        }
                    }
                    let frames = (frames.iter())
                        .map(|f| o.frames.intern(SampledFrame::of(f)))
                        .collect();
                    let sample = SampleKey {
                        tid: key.tid,
                        cause: key.cause,
                        frames,
                    };
                    let to = if holders {
                        &mut o.holder_samples
                    } else {
                        &mut o.samples
                    };
                    to.entry(sample).or_default().add(&agg);
                }
            }
        }
    }

    /// For a long-running agent: names what was sampled since the last call and hands it
    /// over per process, keeping nothing of it (memory stays bounded whatever the run's
    /// length).
    pub fn take_owners(&mut self) -> std::collections::BTreeMap<ProcId, OwnerStacks> {
        self.symbolize();
        // Names interned so far: forgotten too, when no sample waiting refers to them.
        if self.pending.is_empty() && self.js_names.len() > 10_000 {
            self.js_names.clear();
            self.js_index.clear();
        }
        std::mem::take(&mut self.owners)
    }

    pub fn owner(&self, p: ProcId) -> Option<&OwnerStacks> {
        self.owners.get(&p)
    }

    /// Folded stacks (`process-pid;outermost;...;innermost count`), for flame graph tools.
    /// Call [`symbolize`](Self::symbolize) first.
    pub fn folded(&self, comm_of: impl Fn(ProcId) -> String) -> String {
        let mut out = String::new();
        for (&p, o) in &self.owners {
            let stacks = o.stacks();
            let mut stacks: Vec<_> = stacks.iter().collect();
            stacks.sort_by(|a, b| a.0.cmp(b.0));
            for (frames, agg) in stacks {
                let _ = write!(out, "{}-{}", comm_of(p), p.pid);
                for f in frames.iter().rev() {
                    out.push(';');
                    // `;` separates frames and a space the count: keep them out of names.
                    out.push_str(&f.replace(';', ":").replace(' ', "_"));
                }
                let _ = writeln!(out, " {}", agg.count);
            }
        }
        out
    }
}

/// A stack's frames named: on the files of its process (`unwinder`), the address alone
/// without one, and its V8 frames by the names the heap gave them.
fn name_frames(
    unwinder: Option<&mut crate::registry::unwind::ProcessUnwinder>,
    raw: &[super::RawFrame],
    js_names: &[JsFunction],
) -> Vec<Frame> {
    let addrs: Vec<u64> = raw.iter().map(|f| f.addr).collect();
    let mut frames = match unwinder {
        Some(u) => u.symbolize_stack(&addrs),
        None => addrs
            .iter()
            .map(|&addr| Frame {
                addr,
                symbol: None,
                dso: None,
                build_id: None,
                jit: None,
                v8: None,
            })
            .collect(),
    };
    for (f, r) in frames.iter_mut().zip(raw) {
        f.v8 = match r.js {
            JsRef::None => None,
            JsRef::Unknown => Some(Resolved::Unknown),
            JsRef::Named(i) => Some(Resolved::Named(js_names[i as usize].clone())),
        };
    }
    frames
}
