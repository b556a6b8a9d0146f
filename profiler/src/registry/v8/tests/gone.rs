//! Objects gone by the time a batch is named: moved by the GC since the sample, or freed with
//! a Worker's isolate that ended (its memory unmapped or reused): a frame is then unknown,
//! never "(anonymous)" or a name read from whatever now lies at the old address.

use super::super::*;
use super::moved::{F, HOT, World, compiled};
use super::reads::{pad_headers, words_of};
use profiler_common::V8Copy;

/// The tagged pointer at `at` of the fake heap, untagged.
fn pointer(w: &World, at: u64) -> u64 {
    let mut b = [0u8; 8];
    assert!(w.heap.read(at, &mut b));
    u64::from_le_bytes(b) - 1
}

/// One sample's copies of `objects`, as the kernel side sends them after its stack (what the
/// fake heap does not hold is copied as zeros).
pub(super) fn record_of(w: &World, objects: &[u64]) -> Vec<u8> {
    let mut record = Vec::new();
    for &at in objects {
        let mut c = V8Copy {
            addr: at,
            bytes: [0; V8_COPY_BYTES],
        };
        let _ = w.heap.read(at, &mut c.bytes);
        record.extend_from_slice(bytemuck::bytes_of(&c));
    }
    record
}

/// The copies of `objects`, made at one sample.
fn copies_of(w: &World, objects: &[u64]) -> Copies {
    let mut copies = Copies::default();
    copies.add(&record_of(w, objects));
    copies
}

/// The copies of `hot`'s function, SharedFunctionInfo and code, as the kernel side sends them
/// after the stack; and the SharedFunctionInfo's and code's addresses.
pub(super) fn copies_of_hot(w: &World) -> (Copies, u64, u64) {
    let sfi = pointer(w, F + w.layout.js_function_shared);
    let code = pointer(w, F + w.layout.js_function_code);
    (copies_of(w, &[F, sfi, code]), sfi, code)
}

/// Sets the name-or-scope-info field of the SharedFunctionInfo at `sfi` to `v` (what the GC
/// does when it moves the object the field points to); returns the field's old value.
fn set_name_or_scope_info(w: &World, sfi: u64, v: u64) -> u64 {
    let mut header = [0u8; 72];
    assert!(w.heap.read(sfi, &mut header));
    let at = w.layout.sfi_name_or_scope_info as usize;
    let old = u64::from_le_bytes(header[at..at + 8].try_into().unwrap());
    header[at..at + 8].copy_from_slice(&v.to_le_bytes());
    w.heap.put(sfi, &words_of(&header));
    old
}

/// A SharedFunctionInfo copied at the sample whose name the GC moved since (the object now
/// at its address points elsewhere), or that is gone (its isolate ended): what its copy
/// points to is not its name any more, so its frame is unknown, never "(anonymous)" or a
/// name read from whatever now lies at the old address.
#[test]
fn a_copied_function_whose_name_moved_since_is_unknown() {
    let w = World::new();
    w.put_hot();
    pad_headers(&w);
    let (copies, sfi, _) = copies_of_hot(&w);
    let frame = compiled(F, 0x5000_0010, HOT + 0x300);
    // Its name or scope info moved: the live object's field changed, the old address now
    // holds a string of another name.
    let old = set_name_or_scope_info(&w, sfi, 0x7_0001);
    w.string(old - 1, "another");
    let mut v8 = V8Process::new(Arc::clone(&w.layout), &w.heap);
    assert_eq!(v8.resolve_all(&[frame], &copies), [Resolved::Unknown]);
    // Gone: the SharedFunctionInfo cannot be read any more.
    w.heap.remove(sfi);
    let mut v8 = V8Process::new(Arc::clone(&w.layout), &w.heap);
    assert_eq!(v8.resolve_all(&[frame], &copies), [Resolved::Unknown]);
}

/// A name or scope info that is another object (what lies at a stale address) gives no
/// name, not an anonymous one; V8's sentinel (a Smi) is an anonymous function.
#[test]
fn a_name_of_another_type_is_no_name() {
    let w = World::new();
    w.put_hot();
    pad_headers(&w);
    let (_, sfi, _) = copies_of_hot(&w);
    let frame = compiled(F, 0x5000_0010, HOT + 0x300);
    let set_name = |v: u64| {
        set_name_or_scope_info(&w, sfi, v);
    };
    // The function itself: an object of a type that is no name.
    set_name(F + 1);
    let mut v8 = V8Process::new(Arc::clone(&w.layout), &w.heap);
    assert_eq!(
        v8.resolve_all(&[frame], &Default::default()),
        [Resolved::Unknown]
    );
    set_name(0);
    let mut v8 = V8Process::new(Arc::clone(&w.layout), &w.heap);
    assert!(
        matches!(&v8.resolve_all(&[frame], &Default::default())[0], Resolved::Named(j) if j.name == "(anonymous)"),
    );
}

/// The name of a function whose ScopeInfo is still readable but whose name string is not
/// (freed with its isolate): unknown, not anonymous. A function whose script's name cannot be
/// read (the isolate being torn down as it is named) is unknown too, and not remembered so:
/// once the script reads again, the function is named with its file.
#[test]
fn an_unreadable_name_is_no_name_at_all() {
    let w = World::new();
    w.put_hot();
    pad_headers(&w);
    let frame = compiled(F, 0x5000_0010, HOT + 0x300);
    w.heap.remove(0x9200);
    let mut v8 = V8Process::new(Arc::clone(&w.layout), &w.heap);
    assert_eq!(
        v8.resolve_all(&[frame], &Default::default()),
        [Resolved::Unknown]
    );
    w.string(0x9200, "app.js");
    assert!(
        matches!(&v8.resolve_all(&[frame], &Default::default())[0], Resolved::Named(j) if j.name == "hot" && j.location.starts_with("app.js:")),
    );
    w.heap.remove(HOT + 0x400);
    let mut v8 = V8Process::new(Arc::clone(&w.layout), &w.heap);
    assert_eq!(
        v8.resolve_all(&[frame], &Default::default()),
        [Resolved::Unknown]
    );
}

/// A script whose name reads but whose line ends cannot be (neither computed by V8 nor read
/// from its source): the function is named, its location the script's name alone.
#[test]
fn a_script_without_readable_lines_is_named_by_its_file_alone() {
    let w = World::new();
    w.put_hot();
    pad_headers(&w);
    let frame = compiled(F, 0x5000_0010, HOT + 0x300);
    w.heap.remove(0x9100);
    w.heap.remove(0x9300);
    let mut v8 = V8Process::new(Arc::clone(&w.layout), &w.heap);
    assert!(
        matches!(&v8.resolve_all(&[frame], &Default::default())[0], Resolved::Named(j) if j.name == "hot" && j.location == "app.js"),
    );
}

/// A copied function whose name and Script one sample copied with it (as the eBPF side does
/// for a frame's SharedFunctionInfo) is named from that sample: its name moved since does
/// not matter, and the SharedFunctionInfo is not read again. A copy that lacks any of it
/// (here: the Script's) leaves it to the check as before (unknown, its name having moved).
#[test]
fn a_copied_function_whose_name_was_copied_with_it_is_named_from_its_sample() {
    let w = World::new();
    w.put_hot();
    pad_headers(&w);
    let (_, sfi, code) = copies_of_hot(&w);
    let word = |at: u64| pointer(&w, at);
    let scope = word(sfi + w.layout.sfi_name_or_scope_info);
    let script = word(sfi + w.layout.sfi_script);
    // The ScopeInfo's name slot (slot 3: no context local) and the script's name.
    let name = word(scope + 8 + 8 * 3);
    let script_name = word(script + w.layout.script_name);
    let whole = copies_of(&w, &[F, sfi, code, scope, name, script, script_name]);
    let partial = copies_of(&w, &[F, sfi, code, scope, name]);
    let frame = compiled(F, 0x5000_0010, HOT + 0x300);
    // Its name or scope info moved since: the old address holds another name now.
    let old = set_name_or_scope_info(&w, sfi, 0x7_0001);
    w.string(old - 1, "another");
    let mut v8 = V8Process::new(Arc::clone(&w.layout), &w.heap);
    assert_eq!(v8.resolve_all(&[frame], &partial), [Resolved::Unknown]);
    let mut v8 = V8Process::new(Arc::clone(&w.layout), &w.heap);
    let r = v8.resolve_all(&[frame], &whole);
    assert!(
        matches!(&r[0], Resolved::Named(j) if j.name == "hot" && j.location.starts_with("app.js:2:")),
        "{r:?}"
    );
    assert_eq!(v8.stats.at_sample, 1);
}
