//! JavaScript function names with no node flags: the JSFunction (and, for interpreted frames,
//! the BytecodeArray and bytecode offset) that each V8 frame holds at fixed slots below its
//! frame pointer, taken from the stack copy the kernel made before the lock was taken, and
//! resolved soon after the sample from the process's memory with the offsets of its own
//! binary's `v8dbg_*` symbols (`metadata`).
//!
//! Objects move (the scavenger moves every young object at each minor GC; compaction moves
//! old ones) and die, and the stack copy is older than the heap read. A name is therefore
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

pub mod heap;
pub mod memory;
pub mod metadata;
pub mod names;

use std::{
    cell::RefCell,
    collections::{BTreeMap, HashMap},
    path::Path,
    rc::Rc,
    sync::Arc,
};

use heap::{Heap, is_heap_object, smi};
use memory::{Memory, Prefetched, ProcessMemory};
use metadata::{Layout, LayoutError};
use names::line_column;

use crate::registry::perfmap::JsFunction;

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
        let l = metadata::read_symbols(path)
            .and_then(|s| Layout::from_symbols(&s, shown))
            .map(Arc::new);
        self.0.borrow_mut().insert(key, l.clone());
        l
    }
}

/// What kind of V8 frame a frame looked like in the stack copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotKind {
    /// Compiled code (baseline, Maglev, TurboFan) in V8's code space: check `pc`.
    Compiled,
    /// The interpreter (a bytecode handler or trampoline of the embedded builtins).
    Interpreted { bytecode_array: u64, offset: i32 },
}

/// A frame's V8 slots, as the stack copy had them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JsSlots {
    /// The frame's index in the unwound stack.
    pub index: usize,
    /// The code address in that frame (a return address except for the first frame).
    pub pc: u64,
    pub fp: u64,
    pub function: u64,
    /// The frame's context (its marker slot).
    pub context: u64,
    pub kind: SlotKind,
}

/// The V8 slots of a frame whose code is V8's (`jit`: generated code; else the embedded
/// builtins), read from `stack` (`[sp, sp + len)`). Frames with a type marker instead of a
/// context (stubs, exit, entry, construct frames) hold no function and give None, as do
/// builtins' own frames (a frame of the embedded code counts only when it is interpreted).
pub fn slots(
    layout: &Layout,
    index: usize,
    pc: u64,
    fp: u64,
    jit: bool,
    sp: u64,
    stack: &[u8],
) -> Option<JsSlots> {
    let word = |off: i64| -> Option<u64> {
        let at = fp.checked_add_signed(off)?;
        let o = usize::try_from(at.checked_sub(sp)?).ok()?;
        let b = stack.get(o..o.checked_add(8)?)?;
        Some(u64::from_le_bytes(b.try_into().ok()?))
    };
    if fp == 0 || !fp.is_multiple_of(8) {
        return None;
    }
    // A JavaScript frame's marker slot holds its context (a heap object); other frames hold a
    // type marker there (a Smi-like value).
    let context = word(layout.fp_marker)?;
    if !is_heap_object(context) {
        return None;
    }
    let function = word(layout.fp_function)?;
    if !is_heap_object(function) {
        return None;
    }
    let bytecode = word(layout.fp_bytecode_array)
        .filter(|b| is_heap_object(*b))
        .zip(word(layout.fp_bytecode_offset).and_then(smi));
    let kind = match (jit, bytecode) {
        (true, _) => SlotKind::Compiled,
        (false, Some((bytecode_array, offset))) => SlotKind::Interpreted {
            bytecode_array,
            offset,
        },
        (false, None) => return None,
    };
    Some(JsSlots {
        index,
        pc,
        fp,
        function,
        context,
        kind,
    })
}

/// What was read of heap objects (SharedFunctionInfos, Scripts) by address, each with the two
/// fields it was read from: an entry is used only while they are unchanged (the object may
/// have been moved or replaced since). Emptied rather than grown past [`MAX_CACHED`].
struct Checked<V> {
    entries: HashMap<u64, ((u64, u64), V)>,
}

impl<V: Clone> Checked<V> {
    fn new() -> Self {
        Checked {
            entries: HashMap::new(),
        }
    }

    fn get(&self, addr: u64, fields: (u64, u64)) -> Option<V> {
        self.entries
            .get(&addr)
            .filter(|(f, _)| *f == fields)
            .map(|(_, v)| v.clone())
    }

    fn insert(&mut self, addr: u64, fields: (u64, u64), v: V) {
        if self.entries.len() >= MAX_CACHED {
            self.entries.clear();
        }
        self.entries.insert(addr, (fields, v));
    }
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
}

/// Most SharedFunctionInfos and Scripts cached per process (a process that compiles without
/// end gets its cache emptied and rebuilt rather than growing it).
const MAX_CACHED: usize = 65_536;

/// The V8 heap of one process, and what was read from it.
pub struct V8Process<M: Memory = ProcessMemory> {
    pub layout: Arc<Layout>,
    mem: M,
    /// Headers read ahead for the stack being resolved.
    blocks: RefCell<Vec<(u64, Vec<u8>)>>,
    /// Pages read for the batch being resolved.
    pages: RefCell<HashMap<u64, Option<Box<[u8]>>>>,
    map_types: RefCell<HashMap<u64, u16>>,
    /// A SharedFunctionInfo's name, by (name or scope info, script).
    sfis: Checked<Option<JsFunction>>,
    /// A Script's name and line ends, by (name, source).
    scripts: Checked<Option<(String, Arc<Vec<i32>>)>>,
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
            sfis: Checked::new(),
            scripts: Checked::new(),
            stats: ResolveStats::default(),
        }
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
    /// Code objects' and BytecodeArrays' (see the module doc for what is checked). Each
    /// distinct object is read once, however many frames hold it.
    pub fn resolve_all(&mut self, slots: &[JsSlots]) -> Vec<Resolved> {
        const HEADER: usize = 72;
        let untag = |p: u64| p.wrapping_sub(heap::HEAP_OBJECT_TAG);
        let functions: BTreeMap<u64, usize> = slots
            .iter()
            .filter(|s| is_heap_object(s.function))
            .map(|s| (untag(s.function), HEADER))
            .collect();
        let first = self.prefetch(functions);
        let word = |b: &[u8], off: u64| {
            b.get(off as usize..off as usize + 8)
                .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
        };
        let l = Arc::clone(&self.layout);
        let mut second: BTreeMap<u64, usize> = BTreeMap::new();
        for (_, b) in &first {
            for off in [l.js_function_shared, l.js_function_code] {
                if let Some(p) = word(b, off).filter(|p| is_heap_object(*p)) {
                    second.insert(untag(p), HEADER);
                }
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
        let second = self.prefetch(second);
        {
            let mut blocks = self.blocks.borrow_mut();
            blocks.clear();
            blocks.extend(first);
            blocks.extend(second);
            blocks.sort_unstable_by_key(|(a, _)| *a);
        }
        let out = slots.iter().map(|s| self.resolve(s)).collect();
        // The heap moves on: nothing read is kept past the batch (but names, checked).
        self.blocks.borrow_mut().clear();
        self.pages.borrow_mut().clear();
        out
    }

    /// Reads the ranges `(address, length)` in one call of the memory; those read.
    fn prefetch(&self, ranges: BTreeMap<u64, usize>) -> Vec<(u64, Vec<u8>)> {
        let mut reqs: Vec<(u64, Vec<u8>)> =
            ranges.into_iter().map(|(a, n)| (a, vec![0u8; n])).collect();
        let ok = self.mem.read_many(&mut reqs);
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
        let sfi = self.checked_sfi(s)?;
        self.sfi_function(sfi)
    }

    /// The frame's SharedFunctionInfo, if what the frame held still fits together.
    fn checked_sfi(&self, s: &JsSlots) -> Option<u64> {
        let h = self.heap();
        let l = &*self.layout;
        let f = s.function;
        let ty = h.instance_type(f)?;
        if !(l.js_function_first..=l.js_function_last).contains(&ty) {
            return None;
        }
        let sfi = h.typed(h.field(f, l.js_function_shared)?, l.sfi_type)?;
        match s.kind {
            SlotKind::Interpreted {
                bytecode_array,
                offset,
            } => {
                let b = h.typed(bytecode_array, l.bytecode_array_type)?;
                let len = smi(h.field(b, l.bytecode_array_length)?)?;
                // The offset counts from the tagged array pointer: header, then bytecode.
                if offset <= 0 || offset > len.checked_add(128)? {
                    return None;
                }
                self.sfi_has_bytecode(sfi, b).then_some(sfi)
            }
            SlotKind::Compiled => {
                if self.code_contains(h.field(f, l.js_function_code)?, s.pc, s.index > 0) {
                    return Some(sfi);
                }
                // Compiled code that is not the function's current one (on-stack
                // replacement, deoptimized since): the frame's context must be the function's
                // own, or one made inside it (a second slot of the frame, read apart, that
                // agrees with the object now at the function's address).
                let own = h.field(f, l.js_function_context)?;
                let mut ctx = s.context;
                let mut unchanged = false;
                for _ in 0..4 {
                    if ctx == own {
                        unchanged = true;
                        break;
                    }
                    match h.field(ctx, l.context_previous) {
                        Some(prev) if is_heap_object(prev) => ctx = prev,
                        _ => break,
                    }
                }
                unchanged.then_some(sfi)
            }
        }
    }

    /// Whether the SharedFunctionInfo's function data is `bytecode` (directly, or through
    /// the interpreter data or baseline code that holds it).
    fn sfi_has_bytecode(&self, sfi: u64, bytecode: u64) -> bool {
        let h = self.heap();
        let l = &*self.layout;
        let data_slots = (8..l.sfi_name_or_scope_info).step_by(8);
        data_slots.filter_map(|o| h.field(sfi, o)).any(|d| {
            d == bytecode
                || (is_heap_object(d)
                    && h.instance_type(d)
                        .is_some_and(|t| t == l.interpreter_data_type || t == l.code_type)
                    && (8..48).step_by(8).any(|o| h.field(d, o) == Some(bytecode)))
        })
    }

    /// Whether `pc` lies inside the instructions of the Code object `code` (a return address:
    /// after the call, possibly at the very end).
    fn code_contains(&self, code: u64, pc: u64, return_address: bool) -> bool {
        let h = self.heap();
        let l = &*self.layout;
        let Some(code) = h.typed(code, l.code_type) else {
            return false;
        };
        let start = if l.code_instructions_inline {
            Some((code - heap::HEAP_OBJECT_TAG).wrapping_add(l.code_instruction_start))
        } else {
            h.field(code, l.code_instruction_start)
        };
        let size = h
            .field(code, l.code_instruction_size)
            .map(|w| w as u32 as u64);
        match (start, size) {
            // Code objects are at most a few MiB: a bigger size is a misread layout.
            (Some(start), Some(size)) if size < (64 << 20) => {
                if return_address {
                    start < pc && pc <= start.saturating_add(size)
                } else {
                    start <= pc && pc < start.saturating_add(size)
                }
            }
            _ => false,
        }
    }

    /// The name and definition of a JSFunction (checked by type only: for tests, with a
    /// function known to be alive).
    #[cfg(test)]
    pub fn function_name(&mut self, f: u64) -> Option<JsFunction> {
        let sfi = {
            let h = self.heap();
            let l = &*self.layout;
            let ty = h.instance_type(f)?;
            if !(l.js_function_first..=l.js_function_last).contains(&ty) {
                return None;
            }
            h.typed(h.field(f, l.js_function_shared)?, l.sfi_type)?
        };
        self.sfi_function(sfi)
    }

    /// The name and definition of a SharedFunctionInfo, cached and checked on each use.
    fn sfi_function(&mut self, sfi: u64) -> Option<JsFunction> {
        let l = Arc::clone(&self.layout);
        let (nosi, script) = {
            let h = self.heap();
            (
                h.field(sfi, l.sfi_name_or_scope_info)?,
                h.field(sfi, l.sfi_script)?,
            )
        };
        if let Some(function) = self.sfis.get(sfi, (nosi, script)) {
            return function;
        }
        let function = self.read_function(sfi, script);
        self.sfis.insert(sfi, (nosi, script), function.clone());
        function
    }

    fn read_function(&mut self, sfi: u64, script: u64) -> Option<JsFunction> {
        let (name, start) = self.heap().sfi_name(sfi)?;
        let name = if name.is_empty() {
            "(anonymous)".to_string()
        } else {
            name
        };
        let location = match self.script(script) {
            Some((script_name, ends)) => match start.and_then(|p| line_column(&ends, p)) {
                // As V8 writes it in its perf map: no column before V8 11.
                Some((line, _)) if self.layout.version < (11, 0, 0) => {
                    format!("{script_name}:{line}")
                }
                Some((line, column)) => format!("{script_name}:{line}:{column}"),
                None => script_name,
            },
            None => String::new(),
        };
        Some(JsFunction { name, location })
    }

    /// A script's name and line ends, cached and checked on each use.
    fn script(&mut self, script: u64) -> Option<(String, Arc<Vec<i32>>)> {
        let l = Arc::clone(&self.layout);
        let (name, source) = {
            let h = self.heap();
            h.typed(script, l.script_type)?;
            (
                h.field(script, l.script_name)?,
                h.field(script, l.script_source)?,
            )
        };
        if let Some(resolved) = self.scripts.get(script, (name, source)) {
            return resolved;
        }
        let resolved = self
            .heap()
            .script_lines(script)
            .map(|(n, ends)| (n, Arc::new(ends)));
        self.scripts
            .insert(script, (name, source), resolved.clone());
        resolved
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
