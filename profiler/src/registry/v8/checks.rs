//! Whether what a frame held still fits together when the heap is read, as the module doc of
//! `v8` lists the checks: the frame's SharedFunctionInfo, or none (never another function's).

use std::collections::{BTreeMap, HashSet};

use super::{
    Copies, JsSlots, NamedAtSample, SlotKind, V8Process,
    heap::{self, Heap, is_heap_object, smi},
    memory::Memory,
};

impl<M: Memory> V8Process<M> {
    /// The frame's SharedFunctionInfo, if what the frame held still fits together.
    pub(super) fn checked_sfi(&self, s: &JsSlots) -> Option<u64> {
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

    /// A SharedFunctionInfo copied at the sample points to its name and script as they were
    /// then, but they are read now: a GC since may have moved them (and put other objects
    /// there), or the Worker's isolate may have ended. Where its name is cached, the cache's
    /// check settles it (see `cache`); else it is read again now, and its frames are named
    /// only if it still holds the map, name and script its copy holds. It is read by the
    /// page, as its name is next: V8 allocates a function's SharedFunctionInfo and ScopeInfo
    /// together, so the page read for the check is mostly the one the name is read from.
    /// Of `fetched` (untagged addresses and what was found there), those in `sfis` that came
    /// from `copies`.
    pub(super) fn recheck_copied_sfis(
        &mut self,
        fetched: &[(u64, Vec<u8>)],
        sfis: &HashSet<u64>,
        copies: &Copies,
    ) {
        let l = &*self.layout;
        let fields = |b: &[u8]| {
            [0, l.sfi_name_or_scope_info, l.sfi_script].map(|o| {
                (b.get(o as usize..o as usize + 8))
                    .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
            })
        };
        let unsure: BTreeMap<u64, [Option<u64>; 3]> = (fetched.iter())
            .filter(|(a, b)| sfis.contains(a) && copies.get(*a, b.len()).is_some())
            .map(|(a, b)| (*a, fields(b)))
            .filter(|(a, f)| match f {
                [_, Some(nosi), Some(script)] => {
                    !self.sfi_cached(a + heap::HEAP_OBJECT_TAG, (*nosi, *script))
                }
                _ => true,
            })
            .collect();
        // Those whose name (and Script) one sample copied whole with them are named from that
        // sample's copies: one snapshot of the heap, in which the SharedFunctionInfo held
        // that name and Script (nothing of it is read now, so nothing moved since matters).
        let named: Vec<(u64, NamedAtSample)> = (unsure.keys())
            .filter_map(|a| Some((a + heap::HEAP_OBJECT_TAG, self.named_at_sample(*a, copies)?)))
            .collect();
        self.stats.at_sample += named.len() as u64;
        let done: HashSet<u64> = named.iter().map(|(t, _)| *t).collect();
        let unsure: BTreeMap<u64, [Option<u64>; 3]> = (unsure.into_iter())
            .filter(|(a, _)| !done.contains(&(a + heap::HEAP_OBJECT_TAG)))
            .collect();
        self.at_sample.extend(named);
        // The blocks are the batch's copies and reads once this returns: none yet, so that
        // what is read here is the heap as it is now.
        debug_assert!(self.blocks.borrow().is_empty());
        let h = self.heap();
        let stale: Vec<u64> = (unsure.into_iter())
            .filter(|(a, copied)| {
                let tagged = a + heap::HEAP_OBJECT_TAG;
                let now = [0, l.sfi_name_or_scope_info, l.sfi_script].map(|o| h.field(tagged, o));
                now != *copied
            })
            .map(|(a, _)| a + heap::HEAP_OBJECT_TAG)
            .collect();
        self.stale.extend(stale);
    }

    /// The name of the SharedFunctionInfo at `sfi` (untagged) and its Script's fields, from
    /// the copies of the last sample that copied it alone (None if any of it is missing
    /// there: it is then read as before).
    fn named_at_sample(&self, sfi: u64, copies: &Copies) -> Option<NamedAtSample> {
        let maps = self.heap();
        let l = &*self.layout;
        let h = Heap::new(copies.at_sample(sfi, &maps.mem)?, l, &self.map_types);
        // Its type is checked by `checked_sfi`, from this very copy (the batch keeps each
        // object's last copy).
        let sfi = sfi + heap::HEAP_OBJECT_TAG;
        let fields = (
            h.field(sfi, l.sfi_name_or_scope_info)?,
            h.field(sfi, l.sfi_script)?,
        );
        let (name, start) = h.sfi_name(sfi)?;
        let script = fields.1;
        let mut builtin = None;
        // No Script (a builtin's): no location. A Script's type not copied: not named here.
        let script = if !is_heap_object(script) || h.instance_type(script)? != l.script_type {
            None
        } else {
            let own = (
                h.field(script, l.script_name)?,
                h.field(script, l.script_source)?,
            );
            let name = h.script_name(script);
            if name.as_ref().is_some_and(|n| n.starts_with("node:")) {
                builtin = h.external_source(script);
            }
            Some((own, name))
        };
        Some(NamedAtSample {
            fields,
            name,
            start,
            script,
            builtin,
        })
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
}
