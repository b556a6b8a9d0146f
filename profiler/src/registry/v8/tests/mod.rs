//! Names read from a live node's heap against V8's own perf map, for functions of every shape
//! (declared, arrow, method, class constructor, getter, closure with context, anonymous with an
//! inferred name, async, generator, and one with more context locals than V8 inlines).
//! Objects moved and replaced under a frame, on a heap of the tests' own making: `moved`;
//! gone by the time a batch is named: `gone`; what naming reads: `reads`.

mod gone;
mod moved;
mod reads;
mod scripts;

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

/// A command running `node`, through `MMAPLOCK_PROF_TEST_NODE_RUNNER` when set (a command
/// and its arguments, split at spaces: `qemu-aarch64-static -L /usr/aarch64-linux-gnu`, with
/// which xtask runs npm's arm64 node beside these tests' arm64 build under qemu-user).
pub(super) fn node_command(node: &std::path::Path) -> Command {
    let runner = std::env::var("MMAPLOCK_PROF_TEST_NODE_RUNNER").unwrap_or_default();
    let mut words = runner.split_whitespace();
    match words.next() {
        Some(program) => {
            let mut c = Command::new(program);
            c.args(words).arg(node);
            c
        }
        None => Command::new(node),
    }
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
    let mut child = node_command(&node)
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
    let mut v8 = V8Process::new(layout, ProcessMemory::new(pid));
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
    let mut child = node_command(&node)
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
