//! An application's script loaded by several isolates (a fresh Worker per task) has its source
//! read whole once: the other copies are recognised by their name, length and ends.

use super::super::*;
use super::moved::{FakeHeap, M_SCRIPT, M_STRING, World, compiled};
use super::reads::{Counting, external};
use crate::registry::v8::scripts::{PROBE_UNITS, SHARED_MIN_UNITS};

/// A source of `lines` lines of 63 characters and a newline, with `extra` inserted at the
/// start of line 1 (a source whose head differs).
fn source(lines: usize, extra: &str) -> String {
    let mut s = extra.to_string();
    for i in 0..lines {
        s.push_str(&format!("{:<63}\n", format!("// line {}", i + 1)));
    }
    s
}

/// A Script at `at` named `name` whose source is `text`, one byte per character (kept
/// outside the heap here, so that what is read of it is told apart from its header): returns
/// the script and where its characters are.
fn app_script(w: &World, at: u64, name: &str, text: &str) -> (u64, u64) {
    let data = at + 0x10_0000 - 0x8000;
    let mut bytes = text.as_bytes().to_vec();
    bytes.resize(text.len().div_ceil(8) * 8, 0);
    let words: Vec<u64> = (bytes.chunks(8))
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    w.heap.put(data, &words);
    let source = external(w, at + 0x200, data, text.len() as u64);
    let name = w.string(at + 0x100, name);
    w.heap.put(at, &[M_SCRIPT + 1, source, name, 0, 0, 0, 0, 0]);
    (at, data)
}

/// Names a function defined at `pos` of `script` in `v8` (isolate `i`'s objects at `base`).
fn location(
    v8: &mut V8Process<&Counting<'_, FakeHeap>>,
    w: &World,
    base: u64,
    script: u64,
    pos: u64,
) -> String {
    let (f, sfi, code) = (base + 0x10_0000, base + 0x20_0000, base + 0x30_0000);
    w.function_in(f, sfi, "fn", pos, code, script);
    match &v8.resolve_all(
        &[compiled(f, code + 0x10, sfi + 0x300)],
        &Default::default(),
    )[0]
    {
        Resolved::Named(j) => j.location.clone(),
        r => panic!("{r:?}"),
    }
}

/// Isolates of one process loading the same file: the first reads its source whole, the
/// others only its two ends, and all name the same line. A copy whose head differs (a line
/// moved), or another file with the same text, is read whole, and placed by its own lines.
#[test]
fn an_application_script_is_read_whole_once_for_the_isolates_that_load_it() {
    let w = World::new();
    let text = source(400, "");
    let len = text.len() as u64;
    assert!(text.len() >= SHARED_MIN_UNITS);
    // Line 300, column 4.
    let pos = 299 * 64 + 3;
    let counting = Counting::new(&w.heap);
    let mut v8 = V8Process::new(Arc::clone(&w.layout), &counting);
    let mut read = Vec::new();
    for (i, (name, extra)) in [
        ("/app/lib.js", ""),
        ("/app/lib.js", ""),
        ("/app/lib.js", ""),
        // The same length, a line more at the start (its last line's newline is dropped).
        ("/app/lib.js", "\n"),
        ("/app/other.js", ""),
    ]
    .into_iter()
    .enumerate()
    {
        let base = 0x1000_0000 * (i as u64 + 1);
        let text = if extra.is_empty() {
            text.clone()
        } else {
            let mut t = source(400, extra);
            t.truncate(text.len());
            t
        };
        let (script, chars) = app_script(&w, base, name, &text);
        // The line moved one down: the position is a column earlier on the next line.
        let at = if extra.is_empty() { "300:4" } else { "301:3" };
        assert_eq!(
            location(&mut v8, &w, base, script, pos),
            format!("{name}:{at}"),
            "isolate {i}"
        );
        read.push(counting.bytes_of(chars, len));
    }
    let probes = 2 * PROBE_UNITS as u64;
    assert_eq!(
        read,
        [len, probes, probes, len + probes, len],
        "bytes of each copy read"
    );
    assert_eq!(v8.stats.sources_shared, 2);
}

/// Processes share what their isolates read (the registry gives each the host's
/// `ScriptSources`); a source too short to gain from the probes is read whole each time.
#[test]
fn scripts_are_shared_by_the_processes_given_the_same_sources_and_short_ones_read_whole() {
    let w = World::new();
    let long = source(400, "");
    let short = source(SHARED_MIN_UNITS / 64 - 1, "");
    assert!(short.len() < SHARED_MIN_UNITS);
    let shared = ScriptSources::default();
    for (text, sharing, expected) in [
        (&long, true, [long.len() as u64, 2 * PROBE_UNITS as u64]),
        (&long, false, [long.len() as u64; 2]),
        (&short, true, [short.len() as u64; 2]),
    ] {
        let mut read = Vec::new();
        let name = format!("/app/{}-{sharing}.js", text.len());
        for process in 0..2u64 {
            let counting = Counting::new(&w.heap);
            let v8 = V8Process::new(Arc::clone(&w.layout), &counting);
            let mut v8 = if sharing {
                v8.sharing_scripts(shared.clone())
            } else {
                v8
            };
            let base = 0x1000_0000 * (process + 1);
            let (script, chars) = app_script(&w, base, &name, text);
            assert_eq!(
                location(&mut v8, &w, base, script, 64 * 9 + 1),
                format!("{name}:10:2")
            );
            read.push(counting.bytes_of(chars, text.len() as u64));
        }
        assert_eq!(read, expected, "{name}");
    }
}

/// A Script at `at` named `name` whose source is `text` as an external two-byte string (a
/// file with characters past Latin-1): returns the script and where its code units are.
fn two_byte_script(w: &World, at: u64, name: &str, text: &str) -> (u64, u64, u64) {
    // Past the function's objects (`location`'s, up to `at` + 0x30_0000 and some).
    let data = at + 0x80_0000;
    let mut units: Vec<u16> = text.encode_utf16().collect();
    let len = units.len() as u64;
    units.resize(units.len().div_ceil(4) * 4, 0);
    let words: Vec<u64> = (units.chunks(4))
        .map(|c| c.iter().rev().fold(0u64, |a, &u| (a << 16) | u as u64))
        .collect();
    w.heap.put(data, &words);
    // External (2), two-byte (0), not internalized (0x20).
    let map = M_STRING + 0xc0;
    w.heap.put(map, &[0, 0x22_u64 << 32]);
    w.heap.put(at + 0x200, &[map + 1, len << 32, 0, data]);
    let name = w.string(at + 0x100, name);
    w.heap
        .put(at, &[M_SCRIPT + 1, at + 0x201, name, 0, 0, 0, 0, 0]);
    (at, data, len)
}

/// A two-byte source (each line with a character past Latin-1) is shared as a one-byte one
/// is: read whole once, the second isolate's copy at its two ends only (two bytes a code
/// unit), and the same line placed in code units.
#[test]
fn a_two_byte_source_is_shared_by_its_code_units() {
    let w = World::new();
    let text: String = (0..400)
        .map(|i| format!("{:<62}\n", format!("// line {} \u{2192}", i + 1)))
        .collect();
    let counting = Counting::new(&w.heap);
    let mut v8 = V8Process::new(Arc::clone(&w.layout), &counting);
    let mut read = Vec::new();
    for i in 0..2u64 {
        let base = 0x1000_0000 * (i + 1);
        let (script, chars, units) = two_byte_script(&w, base, "/app/arrows.js", &text);
        assert_eq!(units as usize, 400 * 63);
        assert!(units as usize >= SHARED_MIN_UNITS);
        // Line 300, column 5: positions count code units.
        assert_eq!(
            location(&mut v8, &w, base, script, 299 * 63 + 4),
            "/app/arrows.js:300:5",
            "isolate {i}"
        );
        read.push(counting.bytes_of(chars, 2 * units));
    }
    let units = 400 * 63;
    assert_eq!(read, [2 * units, 4 * PROBE_UNITS as u64], "bytes read");
    assert_eq!(v8.stats.sources_shared, 1);
}
