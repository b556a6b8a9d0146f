//! V8's postmortem metadata (`v8dbg_*` symbols) of the binary that holds V8 in a process (node
//! itself, or `libnode.so` for Debian's builds), turned into the [`Layout`] the frame and heap
//! readers use (the symbols are read in `symbols`). Every offset comes from that binary: names change between V8 versions (e.g.
//! `JSFunction__shared__SharedFunctionInfo`, `SharedFunctionInfo__script__Tagged_HeapObject_`),
//! so fields are found by prefix. The few fields some releases leave out are derived from the
//! fields they do export (e.g. `JSFunction::code` is the one tagged slot between `shared` and
//! `prototype_or_initial_map` that no other symbol names); anything missing that cannot be
//! derived makes the layout unknown, with a one-line reason, and no frame is named from it.

use super::symbols::{Symbols, version_of};

/// Why a binary's V8 layout cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("{0}: not a V8 binary (no v8dbg_ symbols)")]
    NotV8(String),
    #[error("V8 {version} in {file}: unsupported layout ({why})")]
    Unsupported {
        version: String,
        file: String,
        why: String,
    },
    #[error("{file}: {why}")]
    Unreadable { file: String, why: String },
}

/// What the V8 readers need, in bytes unless said otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub version: (u32, u32, u32),
    /// Frame slots, relative to the frame pointer.
    pub fp_marker: i64,
    pub fp_function: i64,
    pub fp_bytecode_array: i64,
    pub fp_bytecode_offset: i64,
    /// `Map::instance_type` (u16) inside a map; the map is the first word of every object.
    pub map_instance_type: u64,
    pub js_function_first: u16,
    pub js_function_last: u16,
    pub sfi_type: u16,
    pub script_type: u16,
    pub scope_info_type: u16,
    pub bytecode_array_type: u16,
    pub fixed_array_type: u16,
    pub code_type: u16,
    pub interpreter_data_type: u16,
    pub js_function_shared: u64,
    pub js_function_code: u64,
    pub js_function_context: u64,
    /// A Context's slot holding the context it was made in (`previous`), as an offset.
    pub context_previous: u64,
    /// The SFI's slots before `name_or_scope_info` hold its function data (bytecode, baseline
    /// code, interpreter data): `[8, sfi_name_or_scope_info)`.
    pub sfi_name_or_scope_info: u64,
    pub sfi_script: u64,
    pub script_name: u64,
    pub script_source: u64,
    pub script_line_ends: u64,
    pub fixed_array_length: u64,
    pub fixed_array_data: u64,
    pub bytecode_array_length: u64,
    /// Code: where its instructions start (`code_instructions_inline`: at this offset in the
    /// object itself; else a pointer field at this offset), and their size (i32).
    pub code_instruction_start: u64,
    pub code_instructions_inline: bool,
    pub code_instruction_size: u64,
    pub strings: StringLayout,
    pub scope_info: ScopeInfoLayout,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StringLayout {
    pub first_nonstring_type: u16,
    pub representation_mask: u16,
    pub encoding_mask: u16,
    pub seq_tag: u16,
    pub cons_tag: u16,
    pub external_tag: u16,
    pub sliced_tag: u16,
    pub thin_tag: u16,
    pub one_byte_tag: u16,
    pub length: u64,
    pub seq_one_byte_chars: u64,
    pub seq_two_byte_chars: u64,
    pub cons_first: u64,
    pub cons_second: u64,
    pub thin_actual: u64,
    pub sliced_parent: u64,
    pub sliced_offset: u64,
    pub external_resource: u64,
}

/// ScopeInfo, as tagged slot indexes after the map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeInfoLayout {
    pub context_local_count: u64,
    pub first_vars: u64,
    /// Since V8 12.8 the function's start and end positions sit in fixed slots right after the
    /// context local count (so `first_vars` is three slots after it, not one); before, they
    /// follow the variable parts.
    pub fixed_position_info: bool,
}

/// Looks fields up by prefix: V8 appends the field's type to the name, which changes.
struct Lookup<'a> {
    syms: &'a Symbols,
    missing: Vec<&'static str>,
}

impl Lookup<'_> {
    fn find(&self, prefix: &str) -> Option<i64> {
        let full = format!("v8dbg_{prefix}");
        if let Some(v) = self.syms.get(&full) {
            return Some(*v);
        }
        // The shortest name with that prefix (a field name is not a prefix of another's type).
        self.syms
            .iter()
            .filter(|(k, _)| k.starts_with(&full))
            .min_by_key(|(k, _)| k.len())
            .map(|(_, v)| *v)
    }

    fn get(&mut self, prefix: &'static str) -> i64 {
        self.find(prefix).unwrap_or_else(|| {
            self.missing.push(prefix);
            0
        })
    }

    fn off(&mut self, prefix: &'static str) -> u64 {
        u64::try_from(self.get(prefix)).unwrap_or(0)
    }

    fn ty(&mut self, prefix: &'static str) -> u16 {
        u16::try_from(self.get(prefix)).unwrap_or(0)
    }
}

impl Layout {
    /// What the eBPF side needs to copy the objects of this V8's frames at a sample
    /// (`profiler_common::V8Frames`); None if a JSFunction's fields lie past what it copies
    /// (the eBPF side takes them below 64 bytes, 8-byte words).
    pub fn frames(&self) -> Option<profiler_common::V8Frames> {
        let within = |off: u64| (off < 64 && off.is_multiple_of(8)).then_some(off as u32);
        Some(profiler_common::V8Frames {
            fp_context: i32::try_from(self.fp_marker).ok()?,
            fp_function: i32::try_from(self.fp_function).ok()?,
            fp_bytecode_array: i32::try_from(self.fp_bytecode_array).ok()?,
            fp_bytecode_offset: i32::try_from(self.fp_bytecode_offset).ok()?,
            function_shared: within(self.js_function_shared)?,
            function_code: within(self.js_function_code)?,
            sfi_name_or_scope_info: within(self.sfi_name_or_scope_info)?,
            sfi_script: within(self.sfi_script)?,
            script_name: within(self.script_name)?,
            map_instance_type: u32::try_from(self.map_instance_type).ok()?,
            scope_info_type: u32::from(self.scope_info_type),
            scope_context_local_count: u32::try_from(self.scope_info.context_local_count).ok()?,
            scope_first_vars: u32::try_from(self.scope_info.first_vars).ok()?,
            string_length: u32::try_from(self.strings.length).ok()?,
            string_chars: u32::try_from(self.strings.seq_one_byte_chars).ok()?,
            script_source: within(self.script_source)?,
        })
    }

    /// The layout described by a binary's symbols, or why it cannot be used.
    pub fn from_symbols(syms: &Symbols, file: &str) -> Result<Layout, LayoutError> {
        let version = version_of(syms).unwrap_or((0, 0, 0));
        let unsupported = |why: String| LayoutError::Unsupported {
            version: format!("{}.{}.{}", version.0, version.1, version.2),
            file: file.to_string(),
            why,
        };
        let mut l = Lookup {
            syms,
            missing: Vec::new(),
        };
        // Tagging: 8-byte tagged values, Smis in the upper half (no pointer compression).
        if l.find("TaggedSize") != Some(8)
            || l.find("SmiShiftSize") != Some(31)
            || l.find("HeapObjectTag").is_some_and(|t| t != 1)
        {
            return Err(unsupported(
                "tagged values are not 8-byte words with 32-bit Smis (pointer compression?)".into(),
            ));
        }
        let js_function_type = l.ty("type_JSFunction__JS_FUNCTION_TYPE");
        let js_function_shared = l.off("class_JSFunction__shared__");
        let context = l.off("class_JSFunction__context__");
        let feedback = l.off("class_JSFunction__raw_feedback_cell__");
        let proto = l.off("class_JSFunction__prototype_or_initial_map__");
        // JSFunction::code: exported by some releases only; otherwise the one slot of the
        // function's fields (after JSObject's map, properties and elements) nobody else names.
        let js_function_code = match l.find("class_JSFunction__code__") {
            Some(v) => u64::try_from(v).unwrap_or(0),
            None => {
                let named = [js_function_shared, context, feedback, proto];
                let free: Vec<u64> = (3..=proto / 8)
                    .map(|i| i * 8)
                    .filter(|o| !named.contains(o))
                    .collect();
                match free[..] {
                    [one] => one,
                    _ => return Err(unsupported("JSFunction::code not found".into())),
                }
            }
        };
        let code_size = l.find("class_Code__instruction_size__");
        let (code_instruction_start, code_instructions_inline, code_instruction_size) =
            match (l.find("class_Code__instruction_start__"), code_size) {
                // Before V8 11.1, instructions followed the Code header: the symbol is its size.
                (Some(start), Some(size)) if version < (11, 1, 0) => {
                    (start as u64, true, size as u64)
                }
                (Some(start), Some(size)) => (start as u64, false, size as u64),
                // V8 11.1 to 11.6 export none of Code's own fields but its tagged ones: the
                // instruction start pointer follows the source position table and the code
                // wrapper, the flags and the size come after it (with two 16-bit fields
                // before the size until 11.4).
                (None, None) => match l.find("class_Code__source_position_table__") {
                    Some(spt) if ((11, 1, 0)..(11, 7, 0)).contains(&version) => {
                        let start = spt as u64 + 16;
                        let size = start + 8 + 4 + if version < (11, 4, 0) { 4 } else { 0 };
                        (start, false, size)
                    }
                    _ => return Err(unsupported("Code's instruction range not found".into())),
                },
                _ => return Err(unsupported("Code's instruction range not found".into())),
            };
        let first_vars = l.off("scopeinfo_idx_first_vars");
        let context_local_count = l.off("scopeinfo_idx_ncontextlocals");
        let layout = Layout {
            version,
            fp_marker: l.get("off_fp_context_or_frame_type"),
            fp_function: l.get("off_fp_function"),
            fp_bytecode_array: l.get("off_fp_bytecode_array"),
            fp_bytecode_offset: l.get("off_fp_bytecode_offset"),
            map_instance_type: l.off("class_Map__instance_type__"),
            js_function_first: l
                .find("FirstJSFunctionType")
                .map_or(js_function_type, |v| v as u16),
            // JS_FUNCTION_TYPE and 15 kinds of constructors after it (Array, Promise,
            // RegExp, the 11 typed arrays, classes: the last, 2081 in Node 20); newer releases
            // export the range (one more typed array since V8 12).
            js_function_last: l
                .find("LastJSFunctionType")
                .map_or(js_function_type + 15, |v| v as u16),
            sfi_type: l.ty("type_SharedFunctionInfo__SHARED_FUNCTION_INFO_TYPE"),
            script_type: l.ty("type_Script__SCRIPT_TYPE"),
            scope_info_type: l.ty("type_ScopeInfo__SCOPE_INFO_TYPE"),
            bytecode_array_type: l.ty("type_BytecodeArray__BYTECODE_ARRAY_TYPE"),
            fixed_array_type: l.ty("type_FixedArray__FIXED_ARRAY_TYPE"),
            code_type: l.ty("type_Code__CODE_TYPE"),
            interpreter_data_type: l.ty("type_InterpreterData__INTERPRETER_DATA_TYPE"),
            js_function_shared,
            js_function_code,
            js_function_context: context,
            context_previous: l.off("class_FixedArray__data__") + 8 * l.off("context_idx_prev"),
            sfi_name_or_scope_info: l.off("class_SharedFunctionInfo__name_or_scope_info__"),
            sfi_script: match l.find("class_SharedFunctionInfo__script_or_debug_info__") {
                Some(v) => v as u64,
                None => l.off("class_SharedFunctionInfo__script__"),
            },
            script_name: l.off("class_Script__name__"),
            script_source: l.off("class_Script__source__"),
            script_line_ends: l.off("class_Script__line_ends__"),
            fixed_array_length: l.off("class_FixedArrayBase__length__"),
            fixed_array_data: l.off("class_FixedArray__data__"),
            bytecode_array_length: l
                .find("class_BytecodeArray__length__")
                .map_or_else(|| l.off("class_FixedArrayBase__length__"), |v| v as u64),
            code_instruction_start,
            code_instructions_inline,
            code_instruction_size,
            strings: StringLayout {
                first_nonstring_type: l.ty("FirstNonstringType"),
                representation_mask: l.ty("StringRepresentationMask"),
                encoding_mask: l.ty("StringEncodingMask"),
                seq_tag: l.find("SeqStringTag").unwrap_or(0) as u16,
                cons_tag: l.ty("ConsStringTag"),
                external_tag: l.ty("ExternalStringTag"),
                sliced_tag: l.ty("SlicedStringTag"),
                thin_tag: l.ty("ThinStringTag"),
                one_byte_tag: l.ty("OneByteStringTag"),
                length: l.off("class_String__length__"),
                seq_one_byte_chars: l.off("class_SeqOneByteString__chars__"),
                seq_two_byte_chars: l.off("class_SeqTwoByteString__chars__"),
                cons_first: l.off("class_ConsString__first__"),
                cons_second: l.off("class_ConsString__second__"),
                thin_actual: l.off("class_ThinString__actual__"),
                sliced_parent: l.off("class_SlicedString__parent__"),
                sliced_offset: l.off("class_SlicedString__offset__"),
                external_resource: l.off("class_ExternalString__resource__"),
            },
            scope_info: ScopeInfoLayout {
                context_local_count,
                first_vars,
                fixed_position_info: first_vars == context_local_count + 3,
            },
        };
        if !l.missing.is_empty() {
            return Err(unsupported(format!("no {}", l.missing.join(", "))));
        }
        let sane = layout.fp_function < 0
            && layout.fp_marker < 0
            && layout.fp_bytecode_array < 0
            && layout.fp_bytecode_offset < 0
            && layout.js_function_first <= layout.js_function_last
            && (layout.scope_info.first_vars == layout.scope_info.context_local_count + 1
                || layout.scope_info.fixed_position_info);
        if !sane {
            return Err(unsupported("unexpected frame or ScopeInfo layout".into()));
        }
        Ok(layout)
    }

    #[cfg(test)]
    pub fn version_string(&self) -> String {
        format!("{}.{}.{}", self.version.0, self.version.1, self.version.2)
    }
}

#[cfg(test)]
#[path = "metadata_tests.rs"]
pub(crate) mod tests;
