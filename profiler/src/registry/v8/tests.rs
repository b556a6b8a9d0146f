//! Names read from a live node's heap against V8's own perf map, for functions of every shape
//! (declared, arrow, method, class constructor, getter, closure with context, anonymous with an
//! inferred name, async, generator, and one with more context locals than V8 inlines).

use super::*;
use crate::registry::perfmap::JitName;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

const SCRIPT: &str = r#"'use strict';
function hotAllocator(n) { return n + 1; }
const arrow = (x) => x * 2;
class Foo {
  constructor(v) { this.v = v; }
  method() { return this.v; }
  static make() { return new Foo(1); }
  get value() { return this.v; }
}
const obj = {};
obj.handler = function () { return 3; };
function outer() {
  let a = 1, b = 2;
  return function withContext() { a++; return a + b; };
}
const withContext = outer();
async function asyncFn() { return 1; }
function* gen() { yield 1; }
function manyLocals() {
  __LOCALS__
  return () => __SUM__;
}
const many = manyLocals();
const fns = { hotAllocator, arrow, ctor: Foo, method: Foo.prototype.method, make: Foo.make,
  getter: Object.getOwnPropertyDescriptor(Foo.prototype, 'value').get,
  handler: obj.handler, withContext, asyncFn, gen, manyLocals };
for (let i = 0; i < 3; i++) {
  hotAllocator(i); arrow(i); Foo.make().method(); Foo.make().value; obj.handler();
  withContext(); asyncFn(); gen().next(); many();
}
// Old objects stay where they are while nothing allocates much: print them once promoted.
gc(); gc();
for (const [k, f] of Object.entries(fns)) {
  process.stdout.write(k + ' ');
  %DebugPrint(f);
}
process.stdout.write('ready\n');
process.stdin.once('data', () => process.exit(0));
"#;

fn script() -> String {
    let locals: Vec<String> = (0..80).map(|i| format!("let v{i} = {i};")).collect();
    let sum: Vec<String> = (0..80).map(|i| format!("v{i}")).collect();
    SCRIPT
        .replace("__LOCALS__", &locals.join(" "))
        .replace("__SUM__", &sum.join(" + "))
}

/// The node binary to test: `MMAPLOCK_PROF_TEST_NODE` (another version's, with its libraries
/// through `LD_LIBRARY_PATH`), else the installed one, if any.
pub(super) fn node() -> Option<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("MMAPLOCK_PROF_TEST_NODE") {
        return Some(p.into());
    }
    let out = Command::new("sh")
        .args(["-c", "command -v node"])
        .output()
        .ok()?;
    let p = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (!p.is_empty())
        .then(|| std::fs::canonicalize(p).ok())
        .flatten()
}

#[test]
fn functions_of_every_shape_are_named_as_v8s_perf_map_names_them() {
    let Some(node) = node() else {
        eprintln!("no node installed: nothing to compare");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let js = dir.path().join("shapes.js");
    std::fs::write(&js, script()).unwrap();
    let mut child = Command::new(&node)
        .args([
            "--allow-natives-syntax",
            "--expose-gc",
            "--perf-basic-prof",
            "--interpreted-frames-native-stack",
        ])
        .arg(&js)
        .current_dir(dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    // `name DebugPrint: 0xADDR: [Function] ...` once per function, then "ready".
    let mut functions = Vec::new();
    loop {
        let mut line = String::new();
        assert_ne!(out.read_line(&mut line).unwrap(), 0, "node ended early");
        if line.starts_with("ready") {
            break;
        }
        if let Some((key, rest)) = line.split_once(" DebugPrint: 0x") {
            let hex: String = rest.chars().take_while(|c| c.is_ascii_hexdigit()).collect();
            functions.push((key.to_string(), u64::from_str_radix(&hex, 16).unwrap()));
        }
    }
    assert_eq!(functions.len(), 11, "{functions:?}");
    // The binary that holds V8: libnode.so (Debian's node 18) or node itself.
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", child.id())).unwrap();
    let v8_binary = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.contains("libnode.so"))
        .map_or(node.clone(), std::path::PathBuf::from);
    let syms = symbols::read_symbols(&v8_binary).unwrap();
    let layout = Arc::new(Layout::from_symbols(&syms, "node").unwrap());
    let pid = child.id();
    let mut v8 = V8Process::new(layout, ProcessMemory { pid });
    let perf = std::fs::read_to_string(format!("/tmp/perf-{pid}.map")).unwrap();
    let _ = std::fs::remove_file(format!("/tmp/perf-{pid}.map"));
    let mut named = Vec::new();
    for (key, f) in &functions {
        let ty = v8.heap().instance_type(*f);
        let ours = v8
            .function_name(*f)
            .unwrap_or_else(|| panic!("{key}: no name (instance type {ty:?})"));
        // V8's names of the same function in its perf map (any tier).
        let theirs: Vec<JsFunction> = perf
            .lines()
            .filter_map(|l| match JitName::parse(l.splitn(3, ' ').nth(2)?) {
                JitName::Js(j) if j.name == ours.name => Some(j),
                _ => None,
            })
            .collect();
        assert!(
            theirs.contains(&ours),
            "{key}: ours {ours:?}, the perf map's {theirs:?}"
        );
        named.push(ours.name);
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(named.contains(&"obj.handler".to_string()), "{named:?}");
    assert!(named.contains(&"withContext".to_string()), "{named:?}");
}

/// A live node's unwinder finds the binary that holds V8 and its layout (the time it takes,
/// read once per binary, is printed).
#[test]
fn a_live_nodes_unwinder_reads_its_v8_layout() {
    let Some(node) = node() else { return };
    let mut child = Command::new(&node)
        .args(["-e", "setTimeout(() => {}, 5000)"])
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let t0 = std::time::Instant::now();
    let u = crate::registry::unwind::ProcessUnwinder::new(child.id(), Default::default()).unwrap();
    eprintln!("unwinder and V8 layout read in {:?}", t0.elapsed());
    let _ = child.kill();
    let _ = child.wait();
    let v8 = u.v8.as_ref().expect("a V8 layout");
    assert!(v8.layout.version.0 >= 10, "{:?}", v8.layout.version);
    assert_eq!(u.v8_note, None);
}

/// A heap of one's own making: objects at fixed addresses, each replaceable (what a GC does
/// when it moves an object and puts another at its address).
#[derive(Default)]
struct FakeHeap(std::cell::RefCell<std::collections::BTreeMap<u64, Vec<u8>>>);

impl memory::Memory for FakeHeap {
    fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
        let m = self.0.borrow();
        let Some((start, bytes)) = m.range(..=addr).next_back() else {
            return false;
        };
        let o = (addr - start) as usize;
        match bytes.get(o..o + buf.len()) {
            Some(b) => {
                buf.copy_from_slice(b);
                true
            }
            None => false,
        }
    }
}

impl FakeHeap {
    /// An object at `addr` (untagged) made of 8-byte words.
    fn put(&self, addr: u64, words: &[u64]) {
        let bytes = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        self.0.borrow_mut().insert(addr, bytes);
    }
}

const fn smi_of(v: u64) -> u64 {
    v << 32
}

/// Node 20's layout: map types at 0x1000.., objects at 0x10000.. (tagged: +1).
struct World {
    heap: FakeHeap,
    layout: Arc<Layout>,
}

const M_FUNCTION: u64 = 0x1000;
const M_SFI: u64 = 0x1100;
const M_SCOPE: u64 = 0x1200;
const M_SCRIPT: u64 = 0x1300;
const M_STRING: u64 = 0x1400;
const M_CODE: u64 = 0x1500;
const M_BYTECODE: u64 = 0x1600;
const M_ARRAY: u64 = 0x1700;
const M_CONTEXT: u64 = 0x1800;

/// The JSFunction the frames below hold, and the SFIs of the functions put at its address.
const F: u64 = 0x20000;
const HOT: u64 = 0x30000;
const OTHER: u64 = 0x40000;

impl World {
    fn new() -> World {
        let layout = Arc::new(Layout::from_symbols(&metadata::tests::node20(), "node").unwrap());
        let heap = FakeHeap::default();
        // Maps: the instance type (u16) at 12.
        for (m, ty) in [
            (M_FUNCTION, layout.js_function_first),
            (M_SFI, layout.sfi_type),
            (M_SCOPE, layout.scope_info_type),
            (M_SCRIPT, layout.script_type),
            (M_STRING, 40),
            (M_CODE, layout.code_type),
            (M_BYTECODE, layout.bytecode_array_type),
            (M_ARRAY, layout.fixed_array_type),
            (M_CONTEXT, 200),
        ] {
            heap.put(m, &[0, u64::from(ty) << 32]);
        }
        World { heap, layout }
    }

    /// A process reading this heap.
    fn v8(&self) -> V8Process<&FakeHeap> {
        V8Process::new(Arc::clone(&self.layout), &self.heap)
    }

    /// `hot` at [`F`] (its SFI at [`HOT`], defined at column 12, its code at 0x5000_0000).
    fn put_hot(&self) {
        self.function(F, HOT, "hot", 12, 0x5000_0000);
    }

    /// `other` at [`F`] (its SFI at [`OTHER`], defined at column 40, its code at
    /// 0x6000_0000): what the GC made at `hot`'s address after moving it.
    fn put_other(&self) {
        self.function(F, OTHER, "other", 40, 0x6000_0000);
    }

    fn string(&self, at: u64, s: &str) -> u64 {
        let mut words = vec![M_STRING + 1, (s.len() as u64) << 32];
        let mut chars = s.as_bytes().to_vec();
        chars.resize(s.len().div_ceil(8) * 8, 0);
        words.extend(
            chars
                .chunks(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap())),
        );
        self.heap.put(at, &words);
        at + 1
    }

    /// A function `name` defined at `pos` of a script whose lines end at 9 and 99, with its
    /// SFI at `sfi`, bytecode at `sfi + 0x100`, code at `sfi + 0x200` (instructions at
    /// `code_start`, 0x100 bytes), a context at `sfi + 0x300`, and the JSFunction at `f`.
    fn function(&self, f: u64, sfi: u64, name: &str, pos: u64, code_start: u64) {
        let script = 0x9000;
        let ends = 0x9100;
        self.heap
            .put(ends, &[M_ARRAY + 1, smi_of(2), smi_of(9), smi_of(99)]);
        let script_name = self.string(0x9200, "app.js");
        let source = self.string(0x9300, "x");
        self.heap.put(
            script,
            &[M_SCRIPT + 1, source, script_name, 0, 0, 0, 0, ends + 1],
        );
        let name = self.string(sfi + 0x400, name);
        // Flags: the function variable's name slot is there (bits 12-13); no context local.
        let scope = sfi + 0x500;
        self.heap.put(
            scope,
            &[
                M_SCOPE + 1,
                smi_of(3 << 12),
                smi_of(1),
                smi_of(0),
                name,
                smi_of(0),
                smi_of(pos),
                smi_of(pos + 5),
            ],
        );
        let bytecode = sfi + 0x100;
        self.heap.put(bytecode, &[M_BYTECODE + 1, smi_of(64)]);
        self.heap
            .put(sfi, &[M_SFI + 1, bytecode + 1, scope + 1, 0, script + 1]);
        let code = sfi + 0x200;
        self.heap
            .put(code, &[M_CODE + 1, 0, 0, 0, 0, code_start, 0, 0x100]);
        let context = sfi + 0x300;
        self.heap.put(context, &[M_CONTEXT + 1, smi_of(2), 0, 0]);
        self.heap.put(
            f,
            &[M_FUNCTION + 1, 0, 0, sfi + 1, context + 1, 0, code + 1, 0],
        );
    }
}

fn compiled(f: u64, pc: u64, context: u64) -> JsSlots {
    JsSlots {
        index: 1,
        pc,
        fp: 0x7000_0000,
        function: f + 1,
        context: context + 1,
        kind: SlotKind::Compiled,
    }
}

#[test]
fn a_function_moved_and_another_at_its_address_is_never_named_for_it() {
    let w = World::new();
    w.put_hot();
    let mut v8 = w.v8();
    let hot_frame = compiled(F, 0x5000_0010, HOT + 0x300);
    let named = |name: &str, loc: &str| {
        Resolved::Named(JsFunction {
            name: name.into(),
            location: loc.into(),
        })
    };
    // Line 2 (ends 9, 99), column 12 - 10 + 1.
    assert_eq!(
        v8.resolve_all(&[hot_frame]),
        vec![named("hot", "app.js:2:3")]
    );
    // The GC moved it and made another function (of other code, in another context) at its
    // address: the frame's return address is not in that function's code, and the frame's
    // context is not its context.
    w.put_other();
    assert_eq!(v8.resolve_all(&[hot_frame]), vec![Resolved::Unknown]);
    // A frame of `other` running code that is not its current one (on-stack replacement):
    // named, its context being the function's own.
    let osr = compiled(F, 0x5800_0010, OTHER + 0x300);
    assert_eq!(v8.resolve_all(&[osr]), vec![named("other", "app.js:2:31")]);
    // Its function's memory gone: unknown.
    w.heap.0.borrow_mut().remove(&F);
    assert_eq!(v8.resolve_all(&[osr]), vec![Resolved::Unknown]);
}

#[test]
fn an_interpreted_frame_is_named_only_with_its_own_bytecode() {
    let w = World::new();
    w.put_hot();
    let mut v8 = w.v8();
    let frame = JsSlots {
        kind: SlotKind::Interpreted {
            bytecode_array: HOT + 0x100 + 1,
            offset: 60,
        },
        ..compiled(F, 0x1234, HOT + 0x300)
    };
    assert!(matches!(&v8.resolve_all(&[frame])[0], Resolved::Named(j) if j.name == "hot"));
    // Another function at its address: its bytecode is not the frame's.
    w.put_other();
    assert_eq!(v8.resolve_all(&[frame]), vec![Resolved::Unknown]);
    // An offset outside the bytecode: not an interpreted frame of it.
    w.put_hot();
    let outside = JsSlots {
        kind: SlotKind::Interpreted {
            bytecode_array: HOT + 0x100 + 1,
            offset: 4096,
        },
        ..frame
    };
    assert_eq!(v8.resolve_all(&[outside]), vec![Resolved::Unknown]);
}

#[test]
fn a_cached_name_is_dropped_when_its_sfi_address_holds_another() {
    let w = World::new();
    let sfi = HOT;
    w.function(F, sfi, "first", 12, 0x5000_0000);
    let mut v8 = w.v8();
    let frame = compiled(F, 0x5000_0010, sfi + 0x300);
    assert!(matches!(&v8.resolve_all(&[frame])[0], Resolved::Named(j) if j.name == "first"));
    // Another SharedFunctionInfo at the same address (its scope info elsewhere).
    w.function(F, sfi, "second", 12, 0x5000_0000);
    let scope = w.heap.0.borrow()[&(sfi + 0x500)].clone();
    w.heap.0.borrow_mut().insert(sfi + 0x600, scope);
    w.heap.put(
        sfi,
        &[M_SFI + 1, sfi + 0x100 + 1, sfi + 0x600 + 1, 0, 0x9000 + 1],
    );
    assert!(matches!(&v8.resolve_all(&[frame])[0], Resolved::Named(j) if j.name == "second"));
}

/// Reading another process's memory in ranges: nearby objects in one range, each request
/// given its own bytes, an unreadable one failing alone (here: our own memory, and a page
/// made unreadable between two objects of one "chunk").
#[test]
fn process_memory_reads_many_ranges_each_whole_or_not_at_all() {
    use memory::{Memory, ProcessMemory};
    let page = 4096usize;
    // Three pages, 256 KiB-aligned as V8 chunks are, the middle one unreadable.
    let len = 512 << 10;
    // SAFETY: a fresh anonymous mapping, unmapped at the end of the test.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(base, libc::MAP_FAILED);
    let chunk = ((base as usize + (256 << 10) - 1) & !((256 << 10) - 1)) as *mut u8;
    for i in 0..3 * page {
        // SAFETY: inside the mapping (a 256 KiB-aligned chunk lies within 512 KiB).
        unsafe { *chunk.add(i) = (i % 251) as u8 };
    }
    // SAFETY: the middle page of the three, inside the mapping.
    assert_eq!(
        unsafe { libc::mprotect(chunk.add(page).cast(), page, libc::PROT_NONE) },
        0
    );
    let at = |o: usize| chunk as u64 + o as u64;
    let want = |o: usize, n: usize| (o..o + n).map(|i| (i % 251) as u8).collect::<Vec<_>>();
    let mem = ProcessMemory {
        pid: std::process::id(),
    };
    let mut reqs = vec![
        (at(2 * page + 8), vec![0u8; 72]),
        (at(16), vec![0u8; 72]),
        (at(page + 8), vec![0u8; 24]),
        (at(40), vec![0u8; 72]),
        (0x10, vec![0u8; 8]),
        (at(64), vec![]),
    ];
    let ok = mem.read_many(&mut reqs);
    assert_eq!(ok, [true, true, false, true, false, true]);
    assert_eq!(reqs[0].1, want(2 * page + 8, 72));
    assert_eq!(reqs[1].1, want(16, 72));
    assert_eq!(reqs[3].1, want(40, 72));
    // SAFETY: the mapping made above.
    unsafe { libc::munmap(base, len) };
}
