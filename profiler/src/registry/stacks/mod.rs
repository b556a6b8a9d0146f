//! Which code takes the lock for write: sampled user stacks (`--stack-sample`, `--stacks`),
//! unwound and symbolized (see `unwind`), charged to the code that asked for memory.
//!
//! Each write is charged to a DSO: the first frame, from the innermost, outside the C and C++
//! runtimes (libc, ld.so, libstdc++, libgcc_s, libpthread): the code that called malloc or
//! mmap. That is the node binary, a `*.node` addon, another library, or `[jit]` for V8's
//! generated code (anonymous executable memory).
//!
//! Processes are named by pid and start time ([`ProcId`]): a process's unwinder (its maps and
//! parsed unwind tables) is dropped when it exits, after its stacks are symbolized, and a
//! reused pid gets an unwinder of its own.

mod deferred;
mod early;
mod frames;
mod labels;
mod owner;
mod retire;
mod symbolize;

use std::collections::{BTreeMap, HashMap, HashSet};

use profiler_common::{READ_WAIT_SEQ, SampleDone, StackHeader, read_record, stack_record};

use crate::{
    registry::perfmap::JsFunction,
    registry::reads::Reads,
    registry::unwind::{CodeKind, Frame, ProcessUnwinder, Shared, StackEnd, UserRegs},
    registry::v8,
    vocab::ids::{self, ProcId},
};

use deferred::Deferred;
pub use frames::{FrameTable, SampledFrame, label_parts};
pub use labels::charge;
use owner::RawKey;
pub use owner::{JsFrameCounts, OwnerStacks, SampleKey, StackAgg};
pub use retire::Progress;

/// Deepest stack kept.
const MAX_FRAMES: usize = 64;

/// Set on the tid of a pending sample's key for a holder's stack (its waiter's tid and
/// sequence number otherwise: the outcome joins both). Thread ids stay below 2^22.
const HOLDER_KEY: u32 = 1 << 31;

/// A frame as sampled: its address and, for a V8 frame, its function as resolved then.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct RawFrame {
    addr: u64,
    js: JsRef,
}

/// A V8 frame's function: none (not a V8 frame), not told, or an index into
/// `StackAttribution::js_names`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum JsRef {
    None,
    Unknown,
    Named(u32),
}

/// A sampled write whose outcome has not come yet.
struct Pending {
    owner: ProcId,
    /// The process of the thread that took the lock (see [`actor`]).
    actor: ProcId,
    /// The thread, and what it took the lock for (`StackHeader::kind`): for a holder's
    /// stack, the holder and what it held the lock for.
    tid: u32,
    cause: u32,
    frames: Vec<RawFrame>,
    dso: String,
    end: StackEnd,
    /// The file of its outermost frame: where a cut stack stops.
    stops_in: String,
    /// How many samples at `--stack-sample` it stands for (see [`weight`]).
    weight: u64,
}

/// How many samples at the base rate `base` (`--stack-sample`) a sample drawn at one in
/// `every` stands for: 1, or more in a process the kernel side sampled less often for taking
/// more than `--max-stack-rate` stacks a second (`every` is then `base` times a power of 2).
fn weight(every: u32, base: u32) -> u64 {
    if base == 0 || every <= base {
        1
    } else {
        u64::from(every / base)
    }
}

/// Threads whose cut stacks a process keeps apart (see [`OwnerStacks::cuts`]).
const MAX_CUT_THREADS: usize = 4096;

/// The file name of a stack's outermost frame's mapping (`[anonymous]` for code in none: JIT
/// code, or an address no mapping holds).
fn stops_in(path: Option<&std::path::Path>) -> String {
    path.and_then(|p| p.file_name()).map_or_else(
        || "[anonymous]".to_string(),
        |f| f.to_string_lossy().into_owned(),
    )
}

/// A sample's key among those waiting for their outcome: its thread and sequence number, or
/// for a holder's stack its waiter's, marked.
fn key_of(s: &StackHeader) -> (u32, u32) {
    if s.tag == stack_record::HOLDER {
        (s.waiter | HOLDER_KEY, s.seq)
    } else {
        (s.tid, s.seq)
    }
}

/// The process whose lock a sample took (its start time in ticks, as [`ProcId`]s have it).
fn owner(s: &StackHeader) -> ProcId {
    ProcId::new(s.owner, ids::ticks_of_ns(s.owner_start))
}

/// The process of the thread that took the lock: the owner itself (the common case), or
/// another process, whose start time the sample does not carry (0: a reused pid then shares
/// its unwinder until either is forgotten).
fn actor(s: &StackHeader) -> ProcId {
    if s.tgid == s.owner {
        owner(s)
    } else {
        ProcId::new(s.tgid, 0)
    }
}

/// Consumes the STACKS ring buffer and keeps what it says per process. The work per sample
/// is kept small (unwinding, and the mappings for the DSO), so that the ring buffer is
/// drained quickly; symbolizing waits for the report.
#[derive(Default)]
pub struct StackAttribution {
    shared: Shared,
    /// Per process taking the lock (None: it could not be read).
    unwinders: HashMap<ProcId, Option<ProcessUnwinder>>,
    /// By (tid, seq), as [`SampleDone`] names them.
    pending: HashMap<(u32, u32), Pending>,
    owners: BTreeMap<ProcId, OwnerStacks>,
    /// JavaScript functions named from the heap, interned.
    js_names: Vec<JsFunction>,
    js_index: HashMap<JsFunction, u32>,
    /// V8 frames of the samples of the current batch, named together at its end
    /// ([`flush`](Self::flush)): one read of the target's memory per distinct object of the
    /// batch, not per frame (each read takes the target's `mmap_lock`).
    deferred: Vec<Deferred>,
    /// When the first of them was unwound: they are named soon after (`deferred`: the heap
    /// moves on).
    deferred_since: Option<std::time::Instant>,
    /// Outcomes that came in the current batch, joined to their samples once these are named.
    outcomes: Vec<SampleDone>,
    /// Samples dropped before their outcome came (their thread or process forgotten first,
    /// or the run over): the wait may still be going on, or its outcome may come later.
    pub unmatched: u64,
    /// Outcomes of counted acquisitions whose sample was dropped first (their process
    /// forgotten while its records were still in the ring), and samples left in the ring at
    /// the end: stacks lost by userspace, counted in `lost.stacks` with the kernel's.
    pub dropped: u64,
    /// Samples [`discard`](Self::discard)ed, until their outcome is.
    discarded: HashSet<(u32, u32)>,
    /// Holders' stacks dropped by userspace (their outcome never came, or read at the end
    /// without being unwound): counted in `lost.holder_stacks` with the kernel's.
    pub holders_dropped: u64,
    /// Processes gone, and since when: their unwinders stay until the records queued before
    /// they went are unwound ([`retire_due`](Self::retire_due)).
    retiring: Vec<retire::Retiring<ProcId>>,
    /// Threads gone, and since when (see [`forget_thread`](Self::forget_thread)).
    retiring_threads: Vec<retire::Retiring<u32>>,
    /// Time spent unwinding and naming sampled stacks, and how many (for the cost).
    pub work: (std::time::Duration, u64),
    /// Of which reading V8's heap.
    pub v8_work: std::time::Duration,
    /// The V8 frame layouts of processes (by pid) for the kernel side, which copies their
    /// frames' objects at the samples ([`take_v8_frames`](Self::take_v8_frames)); None for a
    /// process forgotten.
    v8_frames: Vec<(u32, Option<profiler_common::V8Frames>)>,
    /// Processes (images) looked at before their unwinder was made, and whether they were
    /// given a layout then ([`early_v8_frames`](Self::early_v8_frames)).
    early_v8: HashMap<ProcId, bool>,
    /// `--stack-sample`: the rate the samples' weights are in (see [`weight`]).
    base_every: u32,
}

/// Is `p` (still) the process at its pid? With an unknown start time (0): is there one?
fn still_there(p: ProcId) -> bool {
    if p.start == 0 {
        std::path::Path::new(&format!("/proc/{}", p.pid)).exists()
    } else {
        ids::is_alive(p)
    }
}

impl StackAttribution {
    /// For samples taken at one in `stack_sample` writes (or waits) per thread, or less
    /// often in a process past `--max-stack-rate`: their counts are then weighted to it.
    pub fn at_rate(stack_sample: u32) -> Self {
        StackAttribution {
            base_every: stack_sample,
            ..StackAttribution::default()
        }
    }

    /// The V8 frame layouts to set (or, None, to unset) for the kernel side since the last
    /// call, by pid: with one, the samples of a process carry copies of their V8 frames'
    /// objects, which are then not read from the process (each read takes its lock).
    pub fn take_v8_frames(&mut self) -> Vec<(u32, Option<profiler_common::V8Frames>)> {
        std::mem::take(&mut self.v8_frames)
    }

    /// The V8 functions named since the last call, by pid: their names need not be copied at
    /// the samples any more (`Kernel::note_v8_named`).
    pub fn take_v8_named(&mut self) -> Vec<(u32, Vec<u64>)> {
        (self.unwinders.iter_mut())
            .filter_map(|(p, u)| Some((p.pid, u.as_mut()?.take_v8_named())))
            .filter(|(_, named)| !named.is_empty())
            .collect()
    }

    /// One ring buffer record. A batch of records ends with [`flush`](Self::flush).
    pub fn on_record(&mut self, bytes: &[u8]) {
        let Some(tag) = read_record::<u32>(bytes) else {
            return;
        };
        match tag {
            stack_record::SAMPLE | stack_record::HOLDER => {
                // The header, then as many bytes of stack as it says were read.
                if let Some(h) = read_record::<StackHeader>(bytes) {
                    // Then the copies of its V8 frames' objects, to the record's end.
                    let at = std::mem::size_of::<StackHeader>();
                    let rest = bytes.get(at..).unwrap_or_default();
                    let (stack, copies) = rest.split_at(rest.len().min(h.stack_len as usize));
                    self.on_sample(&h, stack, copies);
                }
            }
            stack_record::DONE => {
                if let Some(d) = read_record::<SampleDone>(bytes) {
                    self.outcomes.push(d);
                }
            }
            _ => {}
        }
    }

    /// A record read at the end of a run without being unwound (no time was left): a sample
    /// is a lost stack, and so is an outcome whose sample was waiting for it (an outcome of a
    /// sample discarded here too was counted with it).
    pub fn discard(&mut self, bytes: &[u8]) {
        match read_record::<u32>(bytes) {
            Some(stack_record::SAMPLE) => {
                if let Some(h) = read_record::<StackHeader>(bytes) {
                    self.discarded.insert((h.tid, h.seq));
                    self.dropped += 1;
                }
            }
            Some(stack_record::HOLDER) => self.holders_dropped += 1,
            Some(stack_record::DONE) => {
                if let Some(d) = read_record::<SampleDone>(bytes) {
                    if d.seq & READ_WAIT_SEQ == 0 && !self.discarded.remove(&(d.tid, d.seq)) {
                        self.pending.remove(&(d.tid, d.seq));
                        self.dropped += 1;
                    }
                    if self.pending.remove(&(d.tid | HOLDER_KEY, d.seq)).is_some() {
                        self.holders_dropped += 1;
                    }
                }
            }
            _ => {}
        }
    }

    /// Reads a process's unwind information now (it takes a while for a big binary), rather
    /// than when its first sample arrives.
    pub fn prepare(&mut self, p: ProcId) {
        let _ = self.unwinder(p);
    }

    /// The unwinder of a process, made when first needed. A process found gone is given
    /// none and nothing is kept for it (a late sample would otherwise leave an entry behind
    /// after [`forget_process`](Self::forget_process)); a live one that cannot be read is
    /// remembered as such.
    fn unwinder(&mut self, p: ProcId) -> Option<&mut ProcessUnwinder> {
        if !self.unwinders.contains_key(&p) {
            let t0 = std::time::Instant::now();
            let made = ProcessUnwinder::new(p.pid, self.shared.clone());
            log::debug!("unwinder of {p:?} made in {:?}", t0.elapsed());
            let u = match made {
                // The kernel saw `p` before the maps were read: alive now, they were its own.
                Ok(u) if still_there(p) => Some(u),
                Err(e) if still_there(p) => {
                    log::debug!("no unwinder for {p:?}: {e}");
                    None
                }
                _ => {
                    log::debug!("no unwinder for {p:?}: gone");
                    return None;
                }
            };
            if let Some(frames) = (u.as_ref())
                .and_then(|u| u.v8.as_ref())
                .and_then(|v8| v8.layout.frames())
            {
                self.v8_frames.push((p.pid, Some(frames)));
            } else if self.early_v8.get(&p) == Some(&true) {
                // Given one early, but its unwinder names nothing from the heap.
                self.v8_frames.push((p.pid, None));
            }
            self.early_v8.remove(&p);
            self.unwinders.insert(p, u);
        }
        self.unwinders.get_mut(&p)?.as_mut()
    }

    fn on_sample(&mut self, s: &StackHeader, stack: &[u8], copies: &[u8]) {
        let t0 = std::time::Instant::now();
        let actor = actor(s);
        let mut deferred = None;
        let (frames, dso, end, stops_in) = match self.unwinder(actor) {
            Some(u) => {
                let unwound = u.unwind(UserRegs::of(s), stack, MAX_FRAMES);
                let kinds: Vec<CodeKind> =
                    unwound.frames.iter().map(|f| u.code_kind(f.addr)).collect();
                // JIT code: its names are in V8's perf map, read now while the process lives.
                if kinds.contains(&CodeKind::Jit) {
                    u.read_perf_map();
                }
                // V8 frames: their functions are read from the heap at the batch's end.
                if let Some(heap) = u.v8.as_ref() {
                    let slots: Vec<v8::JsSlots> = (unwound.frames.iter().enumerate())
                        .filter_map(|(i, f)| {
                            let jit = match kinds[i] {
                                CodeKind::Jit => true,
                                CodeKind::Builtin => false,
                                _ => return None,
                            };
                            v8::slots(&heap.layout, i, f.addr, f.fp, jit, s.sp, stack)
                        })
                        .collect();
                    if !slots.is_empty() {
                        deferred = Some(Deferred {
                            key: key_of(s),
                            tid: s.tid,
                            actor,
                            slots,
                            copies: copies.to_vec(),
                        });
                    }
                }
                let labels: Vec<Frame> = unwound
                    .frames
                    .iter()
                    .map(|f| Frame {
                        addr: f.addr,
                        symbol: None,
                        dso: u.mapping(f.addr).and_then(|m| m.path.clone()),
                        build_id: None,
                        jit: None,
                        v8: None,
                    })
                    .collect();
                let dso = charge(&labels);
                let stops_in = stops_in(labels.last().and_then(|f| f.dso.as_deref()));
                let frames = (unwound.frames.iter())
                    .map(|f| RawFrame {
                        addr: f.addr,
                        js: JsRef::None,
                    })
                    .collect();
                (frames, dso, unwound.end, stops_in)
            }
            None => (
                vec![RawFrame {
                    addr: s.ip,
                    js: JsRef::None,
                }],
                "[unknown]".to_string(),
                StackEnd::NoProcess,
                "[unknown]".to_string(),
            ),
        };
        self.pending.insert(
            key_of(s),
            Pending {
                owner: owner(s),
                actor,
                tid: s.tid,
                cause: s.kind,
                frames,
                dso,
                end,
                stops_in,
                weight: weight(s.every, self.base_every),
            },
        );
        self.work.0 += t0.elapsed();
        self.work.1 += 1;
        if let Some(d) = deferred {
            self.defer(d);
        }
    }

    /// Ends a batch of records: names the V8 frames of its samples, each process's together
    /// (every distinct object read once, nearby ones in one range: see `v8::heap`), then joins
    /// the batch's outcomes to their samples.
    pub fn flush(&mut self) {
        self.name_deferred();
        for d in std::mem::take(&mut self.outcomes) {
            self.on_done(&d);
        }
    }

    fn on_done(&mut self, d: &SampleDone) {
        // The writer the wait began behind, charged the wait while it ran that stack (a read
        // wait's outcome comes for that alone: reads have no stack of their own).
        if let Some(h) = self.pending.remove(&(d.tid | HOLDER_KEY, d.seq)) {
            let key = RawKey {
                actor: h.actor,
                tid: h.tid,
                cause: h.cause,
                frames: h.frames,
            };
            let o = self.owners.entry(h.owner).or_default();
            o.holder_raw.entry(key).or_default().add(&StackAgg {
                count: h.weight,
                wait_ns_sum: d.wait_ns * h.weight,
                hold_ns_sum: 0,
            });
        }
        let Some(p) = self.pending.remove(&(d.tid, d.seq)) else {
            // A sample discarded by the end's first drain, out of time, whose outcome came
            // with the kernel's last flush: counted when its sample was.
            if d.seq & READ_WAIT_SEQ == 0 && !self.discarded.remove(&(d.tid, d.seq)) {
                self.dropped += 1;
            }
            return;
        };
        let o = self.owners.entry(p.owner).or_default();
        let w = p.weight;
        let s = o.dsos.entry(p.dso).or_default();
        s.count += w;
        s.wait.sum += d.wait_ns * w;
        s.wait.max = s.wait.max.max(d.wait_ns);
        s.wait.add(profiler_common::bucket_index(d.wait_ns), w);
        s.hold.sum += d.hold_ns * w;
        s.hold.max = s.hold.max.max(d.hold_ns);
        s.hold.add(profiler_common::bucket_index(d.hold_ns), w);
        *o.stack_ends.entry(p.end).or_default() += w;
        if p.end != StackEnd::Root {
            // Bounded whatever the threads: past MAX_CUT_THREADS, a new thread's cut stacks
            // are kept under tid 0 (reported as `other` threads), still counted.
            let mut key = (p.tid, p.end, p.stops_in);
            if o.cuts.len() >= MAX_CUT_THREADS && !o.cuts.contains_key(&key) {
                key.0 = 0;
            }
            *o.cuts.entry(key).or_default() += w;
        }
        let key = RawKey {
            actor: p.actor,
            tid: p.tid,
            cause: p.cause,
            frames: p.frames,
        };
        o.raw.entry(key).or_default().add(&StackAgg {
            count: w,
            wait_ns_sum: d.wait_ns * w,
            hold_ns_sum: d.hold_ns * w,
        });
    }

    /// What the unwinders of `p` (and of a foreign taker with its pid, see
    /// [`forget_process`](Self::forget_process)) have read of it.
    pub fn reads(&self, p: ProcId) -> Reads {
        let mut r = Reads::default();
        // Handed over when it went.
        if self.retiring.iter().any(|r| r.who == p) {
            return r;
        }
        for (_, u) in
            (self.unwinders.iter()).filter(|(a, _)| **a == p || **a == ProcId::new(p.pid, 0))
        {
            if let Some(u) = u {
                r += u.reads();
            }
        }
        r
    }

    /// Processes with an unwinder (or a failed attempt) in memory.
    #[cfg(test)]
    pub fn cached_processes(&self) -> usize {
        self.unwinders.len()
    }

    /// Samples waiting for their outcome.
    pub fn pending_samples(&self) -> usize {
        self.pending.len()
    }
}

#[cfg(test)]
mod tests;
