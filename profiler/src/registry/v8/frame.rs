//! A frame's V8 slots (its JSFunction, context, and for the interpreter its BytecodeArray and
//! bytecode offset), taken from the stack copy the kernel made: what the stack held when the
//! lock was taken, to be checked against the heap when it is read (`checks`).

use super::heap::{is_heap_object, smi};
use super::metadata::Layout;

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
