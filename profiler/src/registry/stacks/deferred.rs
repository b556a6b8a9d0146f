//! A sample's V8 frames are named from the heap together with the other samples of its
//! batch, not one at a time: each distinct object of the batch is read once, nearby ones in
//! one range (every read takes the target's `mmap_lock`). A sample waits at most
//! [`MAX_DEFER`], as objects move meanwhile. The heap of a thread that has exited by then (a
//! Worker's isolate is torn down before its thread ends) is not read at all: its frames are
//! `[js unknown]`, as reads of a heap unmapped or reused would leave them.

use std::collections::{BTreeMap, HashMap};

use super::{JsRef, StackAttribution};
use crate::{
    registry::perfmap::JsFunction,
    registry::v8::{self, Resolved},
    vocab::ids::ProcId,
};

/// Longest a sample's V8 frames wait to be named with others (objects move meanwhile).
const MAX_DEFER: std::time::Duration = std::time::Duration::from_millis(3);

/// A sample's V8 frames, to be named with others (within [`MAX_DEFER`], or at its batch's end).
pub(super) struct Deferred {
    /// The sample, as [`SampleDone`](profiler_common::SampleDone) names it.
    pub(super) key: (u32, u32),
    /// The thread whose stack it is (whose isolate its frames are in).
    pub(super) tid: u32,
    pub(super) actor: ProcId,
    pub(super) slots: Vec<v8::JsSlots>,
    /// The copies of its V8 frames' objects the kernel side made at the sample (whole
    /// `profiler_common::V8Copy`s).
    pub(super) copies: Vec<u8>,
}

/// The index of `js` in the interned names, adding it if new.
fn intern(
    names: &mut Vec<JsFunction>,
    index: &mut HashMap<JsFunction, u32>,
    js: JsFunction,
) -> u32 {
    if let Some(&i) = index.get(&js) {
        return i;
    }
    let i = names.len() as u32;
    names.push(js.clone());
    index.insert(js, i);
    i
}

/// Whether thread `tid` of process `pid` is still there: a V8 isolate is its thread's, so
/// the heap of a thread that has exited is gone (or another's).
fn thread_lives(pid: u32, tid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}/task/{tid}")).exists()
}

impl StackAttribution {
    /// Keeps a sample's V8 frames to be named with the batch's others; names all those kept
    /// once the first has waited [`MAX_DEFER`].
    pub(super) fn defer(&mut self, d: Deferred) {
        let since = *self
            .deferred_since
            .get_or_insert_with(std::time::Instant::now);
        self.deferred.push(d);
        if since.elapsed() >= MAX_DEFER {
            self.name_deferred();
        }
    }

    /// Names the V8 frames of the samples deferred so far (see [`flush`](Self::flush)).
    pub(super) fn name_deferred(&mut self) {
        self.deferred_since = None;
        let t0 = std::time::Instant::now();
        let deferred = std::mem::take(&mut self.deferred);
        let mut by_actor: BTreeMap<ProcId, Vec<&Deferred>> = BTreeMap::new();
        for d in &deferred {
            if thread_lives(d.actor.pid, d.tid) {
                by_actor.entry(d.actor).or_default().push(d);
            } else if let Some(p) = self.pending.get_mut(&d.key) {
                // Its heap is gone: nothing is read, and its V8 frames are not named.
                for slot in &d.slots {
                    if let Some(f) = p.frames.get_mut(slot.index) {
                        f.js = JsRef::Unknown;
                    }
                }
            }
        }
        for (actor, samples) in by_actor {
            let Some(heap) = (self.unwinders.get_mut(&actor))
                .and_then(Option::as_mut)
                .and_then(|u| u.v8.as_mut())
            else {
                continue;
            };
            let all: Vec<v8::JsSlots> = samples.iter().flat_map(|d| d.slots.clone()).collect();
            let mut copies = v8::Copies::default();
            for d in &samples {
                copies.add(&d.copies);
            }
            let mut resolved = heap.resolve_all(&all, &copies).into_iter();
            for d in samples {
                let named: Vec<Resolved> = resolved.by_ref().take(d.slots.len()).collect();
                let Some(p) = self.pending.get_mut(&d.key) else {
                    continue;
                };
                for (slot, r) in d.slots.iter().zip(named) {
                    let js = match r {
                        Resolved::Unknown => JsRef::Unknown,
                        Resolved::Named(js) => {
                            JsRef::Named(intern(&mut self.js_names, &mut self.js_index, js))
                        }
                    };
                    if let Some(f) = p.frames.get_mut(slot.index) {
                        f.js = js;
                    }
                }
            }
        }
        if !deferred.is_empty() {
            let spent = t0.elapsed();
            self.v8_work += spent;
            self.work.0 += spent;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::thread_lives;

    #[test]
    fn a_thread_that_ended_is_seen_gone() {
        let me = std::process::id();
        // SAFETY: gettid has no preconditions.
        let tid = || unsafe { libc::gettid() } as u32;
        assert!(thread_lives(me, tid()));
        let ended = std::thread::spawn(tid).join().unwrap();
        // Joined: the kernel may still be reaping it for a moment.
        let t0 = std::time::Instant::now();
        while thread_lives(me, ended) && t0.elapsed() < std::time::Duration::from_secs(10) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(!thread_lives(me, ended));
        // Another process's thread is not ours.
        assert!(!thread_lives(me, 1));
    }
}
