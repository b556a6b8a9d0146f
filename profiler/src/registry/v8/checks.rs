//! Whether what a frame held still fits together when the heap is read, as the module doc of
//! `v8` lists the checks: the frame's SharedFunctionInfo, or none (never another function's).

use super::{
    JsSlots, SlotKind, V8Process,
    heap::{self, is_heap_object, smi},
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
