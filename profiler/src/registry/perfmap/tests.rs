//! Perf maps read as node writes them, as they grow, after their file is gone, and refused
//! (too large, a link, lines too long) as an adversary's file may be.

use std::path::Path;

use super::*;

/// Lines as node 20 writes them with `--perf-basic-prof`.
const MAP: &str = "\
55d0c8a00000 40 Builtin:ArgumentsAdaptorTrampoline
7fbb0400ad80 198 JS:^hotAllocator /tmp/jsw.js:2:22
7fbb0400b100 28c JS:*hotAllocator /tmp/jsw.js:2:22
7fbb0400c000 80 JS:~ /tmp/jsw.js:4:7
7fbb0400d000 100 RegExp:[a-z]+
";

#[test]
fn v8_names_become_functions_and_files() {
    let m = PerfMap::from_text(MAP);
    assert_eq!(m.len(), 5);
    let js = |name: &str, location: &str| {
        Some(JitName::Js(JsFunction {
            name: name.into(),
            location: location.into(),
        }))
    };
    assert_eq!(
        m.lookup(0x7fbb0400b100),
        js("hotAllocator", "/tmp/jsw.js:2:22")
    );
    assert_eq!(
        m.lookup(0x7fbb0400b100 + 0x28b),
        js("hotAllocator", "/tmp/jsw.js:2:22")
    );
    assert_eq!(m.lookup(0x7fbb0400b100 + 0x28c), None, "past the end");
    assert_eq!(
        m.lookup(0x7fbb0400ad90),
        js("hotAllocator", "/tmp/jsw.js:2:22")
    );
    assert_eq!(
        m.lookup(0x7fbb0400c010),
        js("(anonymous)", "/tmp/jsw.js:4:7")
    );
    assert_eq!(
        m.lookup(0x7fbb0400d010),
        Some(JitName::Other("RegExp:[a-z]+".into()))
    );
    assert_eq!(m.lookup(0x1000), None);
}

/// Node 24 and 26 mark context-specialized code (`'`) and on-stack replacement code (`o`):
/// the marks are not part of the name, and a name may begin with `o`.
#[test]
fn newer_tier_marks_are_not_names() {
    for (raw, name) in [
        (
            "JS:+'isPosixPathSeparator node:path:69:30",
            "isPosixPathSeparator",
        ),
        ("JS:*'g /x.js:2:11", "g"),
        ("JS:o+viaClosures /x.js:84:21", "viaClosures"),
        ("JS:o*viaClosures /x.js:84:21", "viaClosures"),
        ("JS:o*'f /x.js:1:1", "f"),
        ("JS:onData /x.js:3:1", "onData"),
        ("JS:~onData /x.js:3:1", "onData"),
        ("JS:^o /x.js:3:1", "o"),
    ] {
        match JitName::parse(raw) {
            JitName::Js(js) => assert_eq!(js.name, name, "{raw}"),
            other => panic!("{raw}: {other:?}"),
        }
    }
}

/// A map of `path` as `PerfMap::open` makes it, for a file of ours.
fn map_of(path: &Path) -> PerfMap {
    PerfMap {
        path: path.to_path_buf(),
        owner: rustix::process::geteuid().as_raw(),
        ..PerfMap::default()
    }
}

#[test]
fn appended_lines_are_read_once_and_a_partial_line_waits() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("perf-1.map");
    fs::write(
        &path,
        "7f0000001000 10 JS:*a /x.js:1:1\n7f0000002000 10 JS:*b",
    )
    .unwrap();
    let mut m = map_of(&path);
    m.refresh();
    assert_eq!(m.len(), 1, "the unfinished line is not read");
    m.refresh();
    assert_eq!(m.len(), 1, "nothing new");
    let mut f = fs::OpenOptions::new().append(true).open(&path).unwrap();
    std::io::Write::write_all(&mut f, b" /x.js:2:1\n7f0000003000 10 JS:*c /x.js:3:1\n").unwrap();
    m.refresh();
    assert_eq!(m.len(), 3);
    assert!(matches!(m.lookup(0x7f0000002005), Some(JitName::Js(f)) if f.name == "b"));
    assert!(matches!(m.lookup(0x7f0000003005), Some(JitName::Js(f)) if f.location == "/x.js:3:1"));
    // Each byte was read once.
    assert_eq!(m.read_len, fs::metadata(&path).unwrap().len());
}

/// A container's perf map goes with the container: what was appended before it went is
/// read from the file held open.
#[test]
fn lines_appended_before_the_file_went_away_are_still_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("perf-3.map");
    fs::write(&path, "7f0000001000 10 JS:*a /x.js:1:1\n").unwrap();
    let mut m = map_of(&path);
    m.refresh();
    assert_eq!(m.len(), 1);
    let mut f = fs::OpenOptions::new().append(true).open(&path).unwrap();
    std::io::Write::write_all(&mut f, b"7f0000002000 10 JS:*b /x.js:2:1\n").unwrap();
    drop(f);
    fs::remove_file(&path).unwrap();
    m.refresh();
    assert_eq!(m.len(), 2, "read from the file held open");
    assert!(matches!(m.lookup(0x7f0000002005), Some(JitName::Js(f)) if f.name == "b"));
    m.refresh();
    assert_eq!(m.len(), 2);
}

#[test]
fn long_lines_are_skipped_and_each_refresh_reads_a_bounded_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("perf-2.map");
    let mut text = String::from("7f0000001000 10 JS:*first /x.js:1:1\n");
    text.push_str(&format!(
        "7f0000005000 10 JS:*{}\n",
        "x".repeat(MAX_PERF_MAP_LINE)
    ));
    // Enough lines for three chunks.
    let line = "7f0000009000 10 JS:*filler /y.js:1:1\n";
    let n = 2 * PERF_MAP_CHUNK / line.len() + 10;
    text.push_str(&line.repeat(n));
    text.push_str("7f000000a000 10 JS:*last /x.js:9:9\n");
    fs::write(&path, &text).unwrap();
    let mut m = map_of(&path);
    m.refresh();
    assert_eq!(m.read_len, PERF_MAP_CHUNK as u64, "one chunk per refresh");
    assert!(untrusted::warned(&path), "the long line is said once");
    m.refresh();
    m.refresh();
    assert_eq!(m.read_len, text.len() as u64);
    assert_eq!(m.len(), n + 2, "every line but the long one");
    assert!(m.lookup(0x7f0000005005).is_none());
    assert!(matches!(m.lookup(0x7f000000a001), Some(JitName::Js(f)) if f.name == "last"));
}

#[test]
fn a_map_larger_than_the_bound_or_a_link_is_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let huge = dir.path().join("perf-3.map");
    let f = fs::File::create(&huge).unwrap();
    f.set_len(MAX_PERF_MAP_BYTES + 1).unwrap();
    // What `open` does with a candidate: refused, with one warning.
    let policy = untrusted::Policy {
        owner: Some(rustix::process::geteuid().as_raw()),
        max_size: MAX_PERF_MAP_BYTES,
        inode: None,
    };
    let e = untrusted::open(&huge, &policy).err().unwrap();
    assert!(e.is_suspicious(), "{e}");
    // A map that grows past the bound while read: read up to it, then no more.
    let grown = dir.path().join("perf-4.map");
    let mut m = map_of(&grown);
    let line = "7f0000009000 10 JS:*filler /y.js:1:1\n";
    fs::write(&grown, line).unwrap();
    m.refresh();
    assert_eq!(m.len(), 1);
    fs::OpenOptions::new()
        .write(true)
        .open(&grown)
        .unwrap()
        .set_len(MAX_PERF_MAP_BYTES * 2)
        .unwrap();
    for _ in 0..(MAX_PERF_MAP_BYTES as usize / PERF_MAP_CHUNK + 2) {
        m.refresh();
    }
    assert_eq!(m.read_len, MAX_PERF_MAP_BYTES);
    assert!(m.done && untrusted::warned(&grown));
    // A link in place of the map: refused, said once.
    let link = dir.path().join("perf-5.map");
    std::os::unix::fs::symlink(&grown, &link).unwrap();
    let mut m = map_of(&link);
    m.refresh();
    assert!(m.done && m.len() == 0 && untrusted::warned(&link));
}
