//! JavaScript function names with no node flags: the JSFunction (and, for interpreted frames,
//! the BytecodeArray and bytecode offset) that each V8 frame holds at fixed slots below its
//! frame pointer, taken from the stack copy the kernel made before the lock was taken, and
//! resolved soon after the sample with the offsets of its own binary's `v8dbg_*` symbols
//! (`metadata`): from the headers of those objects the kernel side copied at the sample
//! ([`Copies`]) where it did, else, and for names and scripts, from the process's memory (a
//! copied SharedFunctionInfo whose name is not cached is read again, to check that the name
//! and script it points to are still its own: `checks`).
//!
//! Objects move (the scavenger moves every young object at each minor GC; compaction moves
//! old ones) and die, and what is read is younger than the stack copy. A name is therefore
//! given only when what the frame held still fits together when it is read:
//! - every object is checked by its map's instance type;
//! - an interpreted frame's function must have, as its bytecode, the very BytecodeArray the
//!   frame held, and the bytecode offset must lie inside it;
//! - a compiled frame's return address must lie inside the instructions of the function's
//!   current code; when it does not (on-stack replacement, a deoptimization since), the
//!   frame's own context slot must lead to the function's context (a function moved by the GC
//!   and another at its address would have another context).
//!
//! Anything else is `[js unknown]`: never the name of another function. Names are cached by
//! SharedFunctionInfo and Script address, each hit checked against the fields it was read
//! from (a different object at the same address has other fields).
//!
//! The slots are taken in `frame`, checked in `checks`, names read in `names` and cached in
//! `cache`; the heap's objects are read in `heap`, through another process's `memory`.

mod cache;
mod checks;
mod copies;
mod frame;
pub mod heap;
pub mod memory;
pub mod metadata;
pub mod names;
mod scripts;
pub mod symbols;

use std::{
    cell::RefCell,
    collections::{BTreeMap, HashMap, HashSet},
    path::Path,
    rc::Rc,
    sync::Arc,
};

use cache::Checked;
pub use copies::Copies;
use copies::NamedAtSample;
pub use frame::{JsSlots, SlotKind, slots};
use heap::{Heap, is_heap_object};
use memory::{Memory, Prefetched, ProcessMemory};
use metadata::{Layout, LayoutError};
pub use scripts::ScriptSources;

use profiler_common::V8_COPY_BYTES;

use crate::{kernel::priority::Unpreempted, registry::perfmap::JsFunction};

type FileKey = (String, u64);

/// Layouts by binary (device, inode), shared by processes: ten node processes read node's
/// symbols once.
#[derive(Clone, Default)]
pub struct SharedLayouts(Rc<RefCell<HashMap<FileKey, LayoutResult>>>);

type LayoutResult = Result<Arc<Layout>, LayoutError>;

impl SharedLayouts {
    pub fn get(&self, key: FileKey, path: &Path, shown: &str) -> Result<Arc<Layout>, LayoutError> {
        if let Some(l) = self.0.borrow().get(&key) {
            return l.clone();
        }
        let l = symbols::read_symbols(path)
            .and_then(|s| Layout::from_symbols(&s, shown))
            .map(Arc::new);
        self.0.borrow_mut().insert(key, l.clone());
        l
    }

    /// The layout of a binary already read, if it holds V8 (nothing is read).
    pub fn known(&self, key: &FileKey) -> Option<Arc<Layout>> {
        self.0.borrow().get(key)?.as_ref().ok().cloned()
    }

    /// Keeps a layout as if read from the binary `key` (tests).
    #[cfg(test)]
    pub fn learn(&self, key: FileKey, layout: Layout) {
        self.0.borrow_mut().insert(key, Ok(Arc::new(layout)));
    }
}

/// The line ends of node's own modules' sources, by binary and (address, length, one byte),
/// shared by the processes of one binary: those sources are static data of the binary (see
/// `cache`), at the same address in every process of a binary linked at a fixed address
/// (node's official builds, Debian's), so a host's node processes read and count them once,
/// not each process (about 0.2 ms of CPU and a read of the source under the target's lock
/// each time). Only binaries linked at a fixed address share them ([`SharedSources::of`]):
/// elsewhere the same address may hold another module in another process.
#[derive(Clone, Default)]
pub struct SharedSources {
    ends: Rc<RefCell<HashMap<SourceKey, Arc<Vec<i32>>>>>,
    fixed: Rc<RefCell<HashMap<FileKey, bool>>>,
}

type SourceKey = (FileKey, u64, usize, bool);

impl SharedSources {
    /// The sources shared by the processes of the binary `key` (opened at `path`), if it is
    /// linked at a fixed address (ELF type `ET_EXEC`); else None (each process keeps its
    /// own).
    pub fn of(&self, key: &FileKey, path: &Path) -> Option<(FileKey, SharedSources)> {
        let fixed = *self
            .fixed
            .borrow_mut()
            .entry(key.clone())
            .or_insert_with(|| is_fixed_address(path));
        fixed.then(|| (key.clone(), self.clone()))
    }
}

/// Whether an ELF file is an executable linked at a fixed address (not position-independent).
fn is_fixed_address(path: &Path) -> bool {
    use std::io::Read;
    const ET_EXEC: u16 = 2;
    let mut head = [0u8; 18];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok()
        && head.starts_with(b"\x7fELF")
        && u16::from_le_bytes([head[16], head[17]]) == ET_EXEC
}

/// How a frame's function was (not) named.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolved {
    Named(JsFunction),
    /// It looked like a JavaScript frame, but what it held did not fit together any more.
    Unknown,
}

/// Counts of frames resolved, for the report and for tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResolveStats {
    pub named: u64,
    pub unknown: u64,
    /// Objects taken from the copies made at the samples (not read from the process).
    pub copied: u64,
    /// Scripts whose line ends were those of a source read in another isolate (`scripts`).
    pub sources_shared: u64,
    /// SharedFunctionInfos named from one sample's copies (not read again).
    pub at_sample: u64,
}

/// The V8 heap of one process, and what was read from it.
pub struct V8Process<M: Memory = ProcessMemory> {
    pub layout: Arc<Layout>,
    mem: M,
    /// Headers read ahead for the stack being resolved.
    blocks: RefCell<Vec<(u64, Vec<u8>)>>,
    /// Pages read for the batch being resolved.
    pages: RefCell<HashMap<u64, Option<Box<[u8]>>>>,
    map_types: RefCell<HashMap<u64, u16>>,
    /// SharedFunctionInfos (tagged) copied at the sample that no longer hold what the copy
    /// holds: their frames of the batch being resolved are unknown (see `checks`).
    stale: HashSet<u64>,
    /// SharedFunctionInfos (tagged) of the batch named from one sample's copies (see
    /// `checks`).
    at_sample: HashMap<u64, NamedAtSample>,
    /// A SharedFunctionInfo's name, by (name or scope info, script).
    sfis: Checked<Option<JsFunction>>,
    /// A Script's name and line ends, by (name, source).
    scripts: Checked<(String, Arc<Vec<i32>>)>,
    /// The line ends of node's own modules' sources, by (address, length, one byte): see
    /// `cache`; shared by the processes of one binary when it allows ([`SharedSources`]),
    /// else this process's own (under an empty binary key).
    builtin_sources: (FileKey, SharedSources),
    /// The line ends of application scripts, shared with the other isolates that loaded the
    /// same source (`scripts`): the host's when given, else this process's own.
    shared_scripts: ScriptSources,
    /// SharedFunctionInfos named since [`take_named`](Self::take_named) last ran.
    newly_named: Vec<u64>,
    pub stats: ResolveStats,
}

impl<M: Memory> V8Process<M> {
    pub fn new(layout: Arc<Layout>, mem: M) -> Self {
        V8Process {
            layout,
            mem,
            blocks: RefCell::default(),
            pages: RefCell::default(),
            map_types: RefCell::default(),
            stale: HashSet::new(),
            at_sample: HashMap::new(),
            sfis: Checked::new(),
            scripts: Checked::new(),
            builtin_sources: Default::default(),
            shared_scripts: ScriptSources::default(),
            newly_named: Vec::new(),
            stats: ResolveStats::default(),
        }
    }

    /// Shares the line ends of node's own modules' sources with the other processes of its
    /// binary (`SharedSources::of`).
    pub fn sharing_sources(mut self, shared: Option<(FileKey, SharedSources)>) -> Self {
        if let Some(shared) = shared {
            self.builtin_sources = shared;
        }
        self
    }

    /// Shares the line ends of application scripts with the host's other isolates
    /// ([`ScriptSources`]).
    pub fn sharing_scripts(mut self, shared: ScriptSources) -> Self {
        self.shared_scripts = shared;
        self
    }

    /// The memory it reads (a live process's counts its reads).
    pub fn memory(&self) -> &M {
        &self.mem
    }

    fn heap(&self) -> Heap<'_, Prefetched<'_, M>> {
        let view = Prefetched {
            mem: &self.mem,
            blocks: &self.blocks,
            pages: &self.pages,
        };
        Heap::new(view, &self.layout, &self.map_types)
    }

    /// Names the functions of V8 frames (a batch of stacks' of one process), reading their
    /// objects' headers ahead in two rounds: the functions', then their SharedFunctionInfos',
    /// Code objects (of compiled frames) and BytecodeArrays (of interpreted ones), for the
    /// functions still there (see the module doc for what is checked). Each distinct object
    /// is read once, however many frames hold it.
    ///
    /// `copies` are objects the eBPF side copied at the samples (see [`Copies`]): an object
    /// found there is not read.
    ///
    /// The batch runs unpreempted (`kernel::priority`): each read holds the process's lock,
    /// and on a busy host a reader preempted inside one holds it for a scheduler slice
    /// (hundreds of microseconds to milliseconds, against about two a read).
    pub fn resolve_all(&mut self, slots: &[JsSlots], copies: &Copies) -> Vec<Resolved> {
        let _unpreempted = (!slots.is_empty()).then(Unpreempted::new);
        const HEADER: usize = V8_COPY_BYTES;
        let untag = |p: u64| p.wrapping_sub(heap::HEAP_OBJECT_TAG);
        let functions: BTreeMap<u64, usize> = slots
            .iter()
            .filter(|s| is_heap_object(s.function))
            .map(|s| (untag(s.function), HEADER))
            .collect();
        let first = self.fetch(functions, copies);
        let word = |b: &[u8], off: u64| {
            b.get(off as usize..off as usize + 8)
                .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
        };
        let l = Arc::clone(&self.layout);
        // Code is checked for compiled frames only.
        let compiled: HashSet<u64> = (slots.iter())
            .filter(|s| s.kind == SlotKind::Compiled)
            .map(|s| untag(s.function))
            .collect();
        let mut second: BTreeMap<u64, usize> = BTreeMap::new();
        let mut sfis = HashSet::new();
        for (at, b) in &first {
            // What is no function any more is not followed (its frames stay unknown): a map
            // word that is no heap object (a forwarding address: moved by the GC since), or
            // a map already known to be another type's.
            let Some(map) = word(b, 0).filter(|m| is_heap_object(*m)) else {
                continue;
            };
            let known = self.map_types.borrow().get(&map).copied();
            if known.is_some_and(|t| !(l.js_function_first..=l.js_function_last).contains(&t)) {
                continue;
            }
            let code = compiled.contains(at).then_some(l.js_function_code);
            if let Some(p) = word(b, l.js_function_shared).filter(|p| is_heap_object(*p)) {
                second.insert(untag(p), HEADER);
                sfis.insert(untag(p));
            }
            if let Some(p) = code.and_then(|o| word(b, o)).filter(|p| is_heap_object(*p)) {
                second.insert(untag(p), HEADER);
            }
        }
        for s in slots {
            if let SlotKind::Interpreted { bytecode_array, .. } = s.kind
                && is_heap_object(bytecode_array)
            {
                let len = second.entry(untag(bytecode_array)).or_default();
                *len = (*len).max(24);
            }
        }
        let second = self.fetch(second, copies);
        self.recheck_copied_sfis(&second, &sfis, copies);
        // The functions' maps copied at the samples (maps do not move): their types.
        let maps: Vec<(u64, Vec<u8>)> = (first.iter())
            .filter_map(|(_, b)| word(b, 0))
            .filter(|m| is_heap_object(*m))
            .map(untag)
            .collect::<HashSet<u64>>()
            .into_iter()
            .filter_map(|m| Some((m, copies.get(m, HEADER)?.to_vec())))
            .collect();
        {
            let mut blocks = self.blocks.borrow_mut();
            blocks.clear();
            blocks.extend(maps);
            blocks.extend(first);
            blocks.extend(second);
            blocks.sort_unstable_by_key(|(a, _)| *a);
        }
        let out = slots.iter().map(|s| self.resolve(s)).collect();
        // The heap moves on: nothing read is kept past the batch (but names, checked).
        self.stale.clear();
        self.at_sample.clear();
        self.blocks.borrow_mut().clear();
        self.pages.borrow_mut().clear();
        out
    }

    /// The ranges `(address, length)`: those copied at the sample taken from `copies`, the
    /// others read ([`prefetch`](Self::prefetch)); those there, by address.
    fn fetch(&mut self, ranges: BTreeMap<u64, usize>, copies: &Copies) -> Vec<(u64, Vec<u8>)> {
        let (copied, read): (BTreeMap<u64, usize>, BTreeMap<u64, usize>) = ranges
            .into_iter()
            .partition(|(a, n)| copies.get(*a, *n).is_some());
        let mut out = self.prefetch(read);
        self.stats.copied += copied.len() as u64;
        out.extend((copied.into_iter()).filter_map(|(a, n)| Some((a, copies.get(a, n)?.to_vec()))));
        out.sort_unstable_by_key(|(a, _)| *a);
        out
    }

    /// Reads the ranges `(address, length)` in one call of the memory; those read. A range
    /// that could not be read within one page marks that page unreadable for the batch, so
    /// that no later read of the batch tries it again (each try takes the lock).
    fn prefetch(&self, ranges: BTreeMap<u64, usize>) -> Vec<(u64, Vec<u8>)> {
        let mut reqs: Vec<(u64, Vec<u8>)> =
            ranges.into_iter().map(|(a, n)| (a, vec![0u8; n])).collect();
        let ok = self.mem.read_many(&mut reqs);
        if let Some(size) = self.mem.page_size().map(|s| s as u64) {
            let mut pages = self.pages.borrow_mut();
            for ((a, b), _) in reqs.iter().zip(&ok).filter(|(_, ok)| !**ok) {
                let last = a.saturating_add(b.len().max(1) as u64 - 1);
                if a / size == last / size {
                    pages.insert(a - a % size, None);
                }
            }
        }
        reqs.into_iter()
            .zip(ok)
            .filter(|(_, ok)| *ok)
            .map(|(r, _)| r)
            .collect()
    }

    /// Names the function of a frame (see the module doc for what is checked).
    fn resolve(&mut self, s: &JsSlots) -> Resolved {
        let r = self.try_resolve(s);
        if r.is_none() && log::log_enabled!(log::Level::Trace) {
            let h = self.heap();
            let l = &*self.layout;
            let ty = h.instance_type(s.function);
            let shared = h.field(s.function, l.js_function_shared);
            let code = h.field(s.function, l.js_function_code);
            let own = h.field(s.function, l.js_function_context);
            log::trace!(
                "unresolved {s:x?}: type {ty:?} shared {shared:x?} code {code:x?} ({:?}) context {own:x?} code range {:x?}",
                code.and_then(|c| h.instance_type(c)),
                code.and_then(|c| h.field(c, l.code_instruction_start))
                    .zip(code.and_then(|c| h.field(c, l.code_instruction_size))),
            );
        }
        match r {
            Some(f) => {
                self.stats.named += 1;
                Resolved::Named(f)
            }
            None => {
                self.stats.unknown += 1;
                Resolved::Unknown
            }
        }
    }

    fn try_resolve(&mut self, s: &JsSlots) -> Option<JsFunction> {
        let Some(sfi) = self.checked_sfi(s) else {
            log::trace!("unknown: no SharedFunctionInfo checked ({:?})", s.kind);
            return None;
        };
        if self.stale.contains(&sfi) {
            log::trace!("unknown: {sfi:#x} changed since its copy");
            return None;
        }
        let r = self.sfi_function(sfi);
        if r.is_none() {
            let at_sample = self.at_sample.contains_key(&sfi);
            log::trace!("unknown: {sfi:#x} not named (named at the sample: {at_sample})");
        }
        r
    }
}

#[cfg(test)]
mod tests;
