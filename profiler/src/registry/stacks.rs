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

use std::{
    collections::{BTreeMap, HashMap},
    fmt::Write as _,
    path::Path,
};

use profiler_common::{SampleDone, StackSample, stack_record};

use crate::{
    aggregation::SideStats,
    registry::ids::{self, ProcId},
    registry::perfmap::{JitName, JsFunction},
    registry::unwind::{CodeKind, Frame, ProcessUnwinder, Shared, StackEnd},
    registry::v8::{self, Resolved},
};

/// Deepest stack kept.
const MAX_FRAMES: usize = 64;

/// The C and C++ runtimes: frames in them are skipped when charging a write.
fn is_runtime(dso: &Path) -> bool {
    let Some(name) = dso.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    [
        "libc.so",
        "libc-",
        "ld-linux",
        "ld-",
        "libstdc++",
        "libgcc_s",
        "libpthread",
    ]
    .iter()
    .any(|p| name.starts_with(p))
}

/// A frame's JavaScript function: read from the heap, else from the perf map.
fn js_of(f: &Frame) -> Option<&JsFunction> {
    match (&f.v8, &f.jit) {
        (Some(Resolved::Named(js)), _) => Some(js),
        (_, Some(JitName::Js(js))) => Some(js),
        _ => None,
    }
}

/// How a frame is shown: `function (file)`; a JavaScript function as
/// `name (script:line:column)` (from the heap or the perf map, which agree), other V8 code by
/// V8's name, a V8 frame whose function could not be told `[js unknown]`, unnamed JIT code as
/// `[jit]`.
fn frame_label(f: &Frame) -> String {
    match (js_of(f), &f.jit) {
        (Some(js), _) if js.location.is_empty() => return js.name.clone(),
        (Some(js), _) => return format!("{} ({})", js.name, js.location),
        (None, Some(JitName::Other(n))) => return n.clone(),
        _ => {}
    }
    if f.v8 == Some(Resolved::Unknown) {
        return "[js unknown]".to_string();
    }
    let file = f
        .dso
        .as_deref()
        .and_then(|d| d.file_name())
        .map(|n| n.to_string_lossy().into_owned());
    match (&f.symbol, file) {
        (Some(s), Some(file)) => format!("{s} ({file})"),
        (Some(s), None) => s.clone(),
        (None, Some(file)) => format!("{:#x} ({file})", f.addr),
        (None, None) => "[jit]".to_string(),
    }
}

/// The DSO a write is charged to (see the module doc).
pub fn charge(frames: &[Frame]) -> String {
    for f in frames {
        match &f.dso {
            Some(d) if is_runtime(d) => continue,
            Some(d) => return d.display().to_string(),
            None => return "[jit]".to_string(),
        }
    }
    "[unknown]".to_string()
}

/// A distinct stack's totals.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StackAgg {
    pub count: u64,
    pub wait_ns_sum: u64,
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
    /// Frames innermost first, symbolized (filled by [`StackAttribution::symbolize`]).
    pub stacks: HashMap<Vec<String>, StackAgg>,
    /// Stacks as addresses in the process that took the lock, not yet symbolized.
    raw: HashMap<(ProcId, Vec<RawFrame>), StackAgg>,
}

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
    frames: Vec<RawFrame>,
    dso: String,
    end: StackEnd,
}

/// The process whose lock a sample took (its start time in ticks, as [`ProcId`]s have it).
fn owner(s: &StackSample) -> ProcId {
    ProcId::new(s.owner, ids::ticks_of_ns(s.owner_start))
}

/// The process of the thread that took the lock: the owner itself (the common case), or
/// another process, whose start time the sample does not carry (0: a reused pid then shares
/// its unwinder until either is forgotten).
fn actor(s: &StackSample) -> ProcId {
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
    /// Samples whose outcome never came (the profiler stopped first, or a record was lost).
    pub unmatched: u64,
    /// Time spent unwinding and naming sampled stacks, and how many (for the cost).
    pub work: (std::time::Duration, u64),
    /// Of which reading V8's heap.
    pub v8_work: std::time::Duration,
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

/// Counts a frame's JavaScript name by its source(s).
fn count_js_frame(c: &mut JsFrameCounts, f: &Frame, n: u64) {
    let perf = match &f.jit {
        Some(JitName::Js(js)) => Some(js),
        _ => None,
    };
    match (&f.v8, perf) {
        (Some(Resolved::Named(a)), Some(b)) if a == b => c.agree += n,
        (Some(Resolved::Named(_)), Some(_)) => c.disagree += n,
        (Some(Resolved::Named(_)), None) => c.v8 += n,
        (_, Some(_)) => c.perf_map += n,
        (Some(Resolved::Unknown), None) => c.unknown += n,
        (None, None) => {}
    }
}

fn read_record<T: Copy>(bytes: &[u8]) -> Option<T> {
    if bytes.len() < std::mem::size_of::<T>() {
        return None;
    }
    // SAFETY: T is a repr(C) plain-old-data record type and `bytes` is at least that long;
    // the ring buffer only guarantees 8-byte alignment, so read unaligned.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
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
    /// One ring buffer record.
    pub fn on_record(&mut self, bytes: &[u8]) {
        let Some(tag) = read_record::<u32>(bytes) else {
            return;
        };
        match tag {
            stack_record::SAMPLE => {
                // Boxed: the record is 16 KiB.
                if let Some(s) = read_record::<StackSample>(bytes).map(Box::new) {
                    self.on_sample(&s);
                }
            }
            stack_record::DONE => {
                if let Some(d) = read_record::<SampleDone>(bytes) {
                    self.on_done(&d);
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
            self.unwinders.insert(p, u);
        }
        self.unwinders.get_mut(&p)?.as_mut()
    }

    fn on_sample(&mut self, s: &StackSample) {
        let t0 = std::time::Instant::now();
        let len = (s.stack_len as usize).min(s.stack.len());
        let stack = &s.stack[..len];
        let actor = actor(s);
        let mut v8_time = std::time::Duration::ZERO;
        let (frames, dso, end) = match self.unwinder(actor) {
            Some(u) => {
                let unwound = u.unwind(s.ip, s.sp, s.bp, stack, MAX_FRAMES);
                let kinds: Vec<CodeKind> =
                    unwound.frames.iter().map(|f| u.code_kind(f.addr)).collect();
                // JIT code: its names are in V8's perf map, read now while the process lives.
                if kinds.contains(&CodeKind::Jit) {
                    u.read_perf_map();
                }
                let t1 = std::time::Instant::now();
                // V8 frames: their functions, read from the heap now, soon after the sample.
                let mut resolved: Vec<Option<Resolved>> = vec![None; unwound.frames.len()];
                if let Some(heap) = u.v8.as_mut() {
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
                    for (slot, r) in slots.iter().zip(heap.resolve_all(&slots)) {
                        resolved[slot.index] = Some(r);
                    }
                }
                v8_time = t1.elapsed();
                let labels: Vec<Frame> = unwound
                    .frames
                    .iter()
                    .map(|f| Frame {
                        addr: f.addr,
                        symbol: None,
                        dso: u.mapping(f.addr).and_then(|m| m.path.clone()),
                        jit: None,
                        v8: None,
                    })
                    .collect();
                let dso = charge(&labels);
                let frames = (unwound.frames.iter().zip(resolved))
                    .map(|(f, r)| RawFrame {
                        addr: f.addr,
                        js: match r {
                            None => JsRef::None,
                            Some(Resolved::Unknown) => JsRef::Unknown,
                            Some(Resolved::Named(js)) => {
                                JsRef::Named(intern(&mut self.js_names, &mut self.js_index, js))
                            }
                        },
                    })
                    .collect();
                (frames, dso, unwound.end)
            }
            None => (
                vec![RawFrame {
                    addr: s.ip,
                    js: JsRef::None,
                }],
                "[unknown]".to_string(),
                StackEnd::NoProcess,
            ),
        };
        self.pending.insert(
            (s.tid, s.seq),
            Pending {
                owner: owner(s),
                actor,
                frames,
                dso,
                end,
            },
        );
        self.work.0 += t0.elapsed();
        self.work.1 += 1;
        self.v8_work += v8_time;
    }

    fn on_done(&mut self, d: &SampleDone) {
        let Some(p) = self.pending.remove(&(d.tid, d.seq)) else {
            self.unmatched += 1;
            return;
        };
        let o = self.owners.entry(p.owner).or_default();
        let s = o.dsos.entry(p.dso).or_default();
        s.count += 1;
        s.wait.sum += d.wait_ns;
        s.wait.max = s.wait.max.max(d.wait_ns);
        s.wait.add(profiler_common::bucket_index(d.wait_ns), 1);
        s.hold.sum += d.hold_ns;
        s.hold.max = s.hold.max.max(d.hold_ns);
        s.hold.add(profiler_common::bucket_index(d.hold_ns), 1);
        *o.stack_ends.entry(p.end).or_default() += 1;
        let st = o.raw.entry((p.actor, p.frames)).or_default();
        st.count += 1;
        st.wait_ns_sum += d.wait_ns;
    }

    /// Names the stacks gathered so far (on the ELF files, so exited processes are fine).
    pub fn symbolize(&mut self) {
        self.symbolize_where(|_| true);
    }

    /// Names the stacks taken by the processes that `which` selects.
    fn symbolize_where(&mut self, which: impl Fn(ProcId) -> bool) {
        for (&owner, o) in self.owners.iter_mut() {
            // What this process's JavaScript frames could be named by.
            if let Some(Some(u)) = self.unwinders.get(&owner) {
                o.js_source |= u.has_perf_map() || u.v8.is_some();
                if o.v8_note.is_none() {
                    o.v8_note.clone_from(&u.v8_note);
                }
            }
            let raw: Vec<_> = o.raw.extract_if(|(actor, _), _| which(*actor)).collect();
            for ((actor, raw_frames), agg) in raw {
                let unwinder = self.unwinders.get_mut(&actor).and_then(Option::as_mut);
                // Without an unwinder the ip alone is known, not whether it is JIT code.
                let known = unwinder.is_some();
                let addrs: Vec<u64> = raw_frames.iter().map(|f| f.addr).collect();
                let mut frames = match unwinder {
                    Some(u) => u.symbolize_stack(&addrs),
                    None => addrs
                        .iter()
                        .map(|&addr| Frame {
                            addr,
                            symbol: None,
                            dso: None,
                            jit: None,
                            v8: None,
                        })
                        .collect(),
                };
                for (f, r) in frames.iter_mut().zip(&raw_frames) {
                    f.v8 = match r.js {
                        JsRef::None => None,
                        JsRef::Unknown => Some(Resolved::Unknown),
                        JsRef::Named(i) => Some(Resolved::Named(self.js_names[i as usize].clone())),
                    };
                    count_js_frame(&mut o.js_frames, f, agg.count);
                }
                // The innermost JavaScript function of the application: node's own library
                // (`node:buffer`, `node:internal/...`) is skipped unless nothing else is there.
                let js_frames: Vec<&JsFunction> = frames.iter().filter_map(js_of).collect();
                let js = js_frames
                    .iter()
                    .find(|f| !f.location.starts_with("node:"))
                    .or(js_frames.first())
                    .map(|f| (*f).clone());
                if let Some(js) = js {
                    let j = o.js_functions.entry(js).or_default();
                    j.count += agg.count;
                    j.wait_ns_sum += agg.wait_ns_sum;
                } else if known && frames.iter().any(|f| f.dso.is_none() && f.jit.is_none()) {
                    o.unnamed_jit += agg.count;
                }
                let labels: Vec<String> = frames.iter().map(frame_label).collect();
                let st = o.stacks.entry(labels).or_default();
                st.count += agg.count;
                st.wait_ns_sum += agg.wait_ns_sum;
            }
        }
    }

    /// A process that exited: its stacks are symbolized now, then its unwinder (the memory
    /// of this module) is dropped, with its samples still waiting for an outcome (counted
    /// as `unmatched`: drain the ring buffer first). The unwinder of a foreign taker with
    /// the same pid, whose start time is not known, goes too. Its totals stay for the report.
    pub fn forget_process(&mut self, p: ProcId) {
        let gone = |a: ProcId| a == p || a == ProcId::new(p.pid, 0);
        self.symbolize_where(gone);
        self.unwinders.retain(|&a, _| !gone(a));
        let before = self.pending.len();
        self.pending.retain(|_, s| !gone(s.actor));
        self.unmatched += (before - self.pending.len()) as u64;
    }

    /// A thread that exited: its samples still waiting for an outcome are dropped (counted
    /// as `unmatched`), so that a reused tid cannot be given them.
    pub fn forget_thread(&mut self, tid: u32) {
        let before = self.pending.len();
        self.pending.retain(|&(t, _), _| t != tid);
        self.unmatched += (before - self.pending.len()) as u64;
    }

    /// Processes with an unwinder (or a failed attempt) in memory.
    #[cfg(test)]
    pub fn cached_processes(&self) -> usize {
        self.unwinders.len()
    }

    /// Samples waiting for their outcome.
    #[cfg(test)]
    pub fn pending_samples(&self) -> usize {
        self.pending.len()
    }

    /// For a long-running agent: names what was sampled since the last call and hands over
    /// each process's sampled writes by JavaScript function (`name (definition)`, most first),
    /// keeping nothing of it (memory stays bounded whatever the run's length).
    pub fn take_js_functions(&mut self) -> Vec<(ProcId, Vec<(String, u64)>)> {
        self.symbolize();
        // Names interned so far: forgotten too, when no sample waiting refers to them.
        if self.pending.is_empty() && self.js_names.len() > 10_000 {
            self.js_names.clear();
            self.js_index.clear();
        }
        let owners = std::mem::take(&mut self.owners);
        owners
            .into_iter()
            .filter(|(_, o)| !o.js_functions.is_empty())
            .map(|(p, o)| {
                let mut f: Vec<(String, u64)> = o
                    .js_functions
                    .into_iter()
                    .map(|(js, agg)| {
                        let label = if js.location.is_empty() {
                            js.name
                        } else {
                            format!("{} ({})", js.name, js.location)
                        };
                        (label, agg.count)
                    })
                    .collect();
                f.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
                (p, f)
            })
            .collect()
    }

    pub fn owner(&self, p: ProcId) -> Option<&OwnerStacks> {
        self.owners.get(&p)
    }

    /// Folded stacks (`process-pid;outermost;...;innermost count`), for flame graph tools.
    /// Call [`symbolize`](Self::symbolize) first.
    pub fn folded(&self, comm_of: impl Fn(ProcId) -> String) -> String {
        let mut out = String::new();
        for (&p, o) in &self.owners {
            let mut stacks: Vec<_> = o.stacks.iter().collect();
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn f(symbol: Option<&str>, dso: Option<&str>) -> Frame {
        Frame {
            addr: 0x1000,
            symbol: symbol.map(String::from),
            dso: dso.map(PathBuf::from),
            jit: None,
            v8: None,
        }
    }

    #[test]
    fn writes_are_charged_past_the_c_runtime() {
        let libc = Some("/usr/lib/x86_64-linux-gnu/libc.so.6");
        let frames = [
            f(Some("mmap64"), libc),
            f(Some("sysmalloc"), libc),
            f(
                Some("operator new"),
                Some("/usr/lib/x86_64-linux-gnu/libstdc++.so.6.0.30"),
            ),
            f(Some("churn"), Some("/tmp/a/build/Release/churn.node")),
            f(Some("node::Start"), Some("/usr/bin/node")),
        ];
        assert_eq!(charge(&frames), "/tmp/a/build/Release/churn.node");
        let jit = [
            f(Some("mprotect"), libc),
            f(None, None),
            f(None, Some("/usr/bin/node")),
        ];
        assert_eq!(charge(&jit), "[jit]");
        assert_eq!(charge(&[f(Some("mmap64"), libc)]), "[unknown]");
        assert_eq!(charge(&[]), "[unknown]");
    }

    #[test]
    fn frames_read_naturally() {
        assert_eq!(
            frame_label(&f(Some("uv_fs_read"), Some("/usr/bin/node"))),
            "uv_fs_read (node)"
        );
        assert_eq!(frame_label(&f(None, None)), "[jit]");
        let js = Frame {
            jit: Some(JitName::parse("JS:*hotAllocator /srv/app.js:3:22")),
            ..f(None, None)
        };
        assert_eq!(frame_label(&js), "hotAllocator (/srv/app.js:3:22)");
        let builtin = Frame {
            jit: Some(JitName::parse("Builtin:ArrayPrototypePush")),
            ..f(None, None)
        };
        assert_eq!(frame_label(&builtin), "Builtin:ArrayPrototypePush");
        assert_eq!(
            frame_label(&f(None, Some("/lib/libz.so.1"))),
            "0x1000 (libz.so.1)"
        );
    }

    fn done(tid: u32, seq: u32, wait_ns: u64) -> SampleDone {
        SampleDone {
            tag: stack_record::DONE,
            tid,
            seq,
            _pad: 0,
            wait_ns,
            hold_ns: 100,
        }
    }

    fn pending(owner: ProcId, actor: ProcId, addr: u64) -> Pending {
        Pending {
            owner,
            actor,
            frames: vec![RawFrame {
                addr,
                js: JsRef::None,
            }],
            dso: "[jit]".into(),
            end: StackEnd::Root,
        }
    }

    #[test]
    fn outcomes_join_their_stacks_and_fold() {
        let mut a = StackAttribution::default();
        let p = ProcId::new(5, 77);
        // A pending sample of a process that does not exist: no unwinder, the ip alone.
        a.pending.insert((7, 1), pending(p, p, 0x1234));
        a.unwinders.insert(p, None);
        a.on_done(&done(7, 1, 900));
        a.on_done(&done(7, 2, 1));
        assert_eq!(a.unmatched, 1);
        let o = a.owner(p).unwrap();
        assert_eq!(o.dsos["[jit]"].count, 1);
        assert_eq!(o.dsos["[jit]"].wait.sum, 900);
        assert!(a.owner(ProcId::new(5, 78)).is_none());
        a.symbolize();
        assert_eq!(a.folded(|_| "node".into()), "node-5;[jit] 1\n");
        // The ip alone, with no process to read: not known to be JIT code, so no hint to start
        // node with a perf map.
        assert_eq!(a.owner(p).unwrap().unnamed_jit, 0);
    }

    #[test]
    fn a_reused_pid_is_another_owner_and_actor() {
        let mut a = StackAttribution::default();
        let (old, new) = (ProcId::new(5, 77), ProcId::new(5, 99));
        a.pending.insert((7, 1), pending(old, old, 0x1000));
        a.pending.insert((8, 1), pending(new, new, 0x2000));
        a.on_done(&done(7, 1, 10));
        a.on_done(&done(8, 1, 20));
        assert_eq!(a.owner(old).unwrap().dsos["[jit]"].wait.sum, 10);
        assert_eq!(a.owner(new).unwrap().dsos["[jit]"].wait.sum, 20);
        a.symbolize();
        let comm = |p: ProcId| if p == old { "old" } else { "new" }.to_string();
        // Without unwinders (no such processes) the frames are unknown code.
        assert_eq!(a.folded(comm), "old-5;[jit] 1\nnew-5;[jit] 1\n");
    }

    #[test]
    fn actor_is_the_owner_with_its_start_or_a_foreign_pid() {
        // SAFETY: StackSample is plain old data; all zeroes is a valid value.
        let mut s: Box<StackSample> = Box::new(unsafe { std::mem::zeroed() });
        // Kernel start times are in ns, ProcIds' in clock ticks.
        (s.owner, s.tgid, s.owner_start) = (5, 5, 77_000_000_000);
        assert_eq!(actor(&s), ProcId::new(5, ids::ticks_of_ns(77_000_000_000)));
        assert_eq!(owner(&s), actor(&s));
        s.tgid = 6;
        assert_eq!(actor(&s), ProcId::new(6, 0));
    }

    #[test]
    fn forgetting_a_process_symbolizes_then_drops_its_unwinder_and_samples() {
        let mut a = StackAttribution::default();
        let (p, q) = (ProcId::new(5, 77), ProcId::new(9, 3));
        let foreign = ProcId::new(5, 0);
        a.unwinders.insert(p, None);
        a.unwinders.insert(q, None);
        a.unwinders.insert(foreign, None);
        // Done: a stack of p on its own lock, and one of p on q's.
        a.pending.insert((7, 1), pending(p, p, 0x1000));
        a.pending.insert((7, 2), pending(q, foreign, 0x1000));
        a.on_done(&done(7, 1, 10));
        a.on_done(&done(7, 2, 10));
        // Waiting: one of p, one of q.
        a.pending.insert((7, 3), pending(p, p, 0x1000));
        a.pending.insert((9, 1), pending(q, q, 0x2000));
        assert_eq!((a.cached_processes(), a.pending_samples()), (3, 2));

        a.forget_process(p);
        assert_eq!((a.cached_processes(), a.pending_samples()), (1, 1));
        assert_eq!(a.unmatched, 1);
        // Its stacks were named before the unwinder went, wherever they were charged.
        for owner in [p, q] {
            let o = a.owner(owner).unwrap();
            assert!(o.raw.is_empty());
            assert_eq!(o.stacks[&vec!["[jit]".to_string()]].count, 1);
        }
        // q's thread 9 exits with its sample still waiting.
        a.forget_thread(9);
        assert_eq!((a.pending_samples(), a.unmatched), (0, 2));
        a.forget_process(q);
        assert_eq!(a.cached_processes(), 0);
    }

    #[test]
    fn unwinders_are_per_process_and_never_of_a_reused_pid() {
        use crate::registry::roles::tests::{me, my_predecessor};
        let mut a = StackAttribution::default();
        a.prepare(me());
        assert!(a.unwinders[&me()].is_some());
        // The process that had our pid before us must not get our maps, and leaves nothing
        // behind; nor does a process that does not exist.
        a.prepare(my_predecessor());
        a.prepare(ProcId::new(u32::MAX - 1, 0));
        assert_eq!(a.cached_processes(), 1);
        a.forget_process(my_predecessor());
        assert_eq!(a.cached_processes(), 1);
        a.forget_process(me());
        assert_eq!(a.cached_processes(), 0);
    }
}
