//! Objects moved, replaced and collected under a frame, on a heap of the tests' own making
//! (Node 20's layout): a frame is named only while what it held still fits together, and a
//! cached name only while its object's fields are unchanged.

use super::super::*;

/// A heap of one's own making: objects at fixed addresses, each replaceable (what a GC does
/// when it moves an object and puts another at its address).
#[derive(Default)]
pub(super) struct FakeHeap(std::cell::RefCell<std::collections::BTreeMap<u64, Vec<u8>>>);

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
    /// Every object: its address and bytes.
    pub(super) fn objects(&self) -> Vec<(u64, Vec<u8>)> {
        self.0
            .borrow()
            .iter()
            .map(|(a, b)| (*a, b.clone()))
            .collect()
    }

    /// The object at `addr` gone (its memory unmapped).
    pub(super) fn remove(&self, addr: u64) {
        self.0.borrow_mut().remove(&addr);
    }

    /// An object at `addr` (untagged) made of 8-byte words.
    pub(super) fn put(&self, addr: u64, words: &[u64]) {
        let bytes = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        self.0.borrow_mut().insert(addr, bytes);
    }
}

pub(super) const fn smi_of(v: u64) -> u64 {
    v << 32
}

/// Node 20's layout: map types at 0x1000.., objects at 0x10000.. (tagged: +1).
pub(super) struct World {
    pub(super) heap: FakeHeap,
    pub(super) layout: Arc<Layout>,
}

const M_FUNCTION: u64 = 0x1000;
const M_SFI: u64 = 0x1100;
const M_SCOPE: u64 = 0x1200;
pub(super) const M_SCRIPT: u64 = 0x1300;
pub(super) const M_STRING: u64 = 0x1400;
const M_CODE: u64 = 0x1500;
const M_BYTECODE: u64 = 0x1600;
const M_ARRAY: u64 = 0x1700;
const M_CONTEXT: u64 = 0x1800;

impl World {
    pub(super) fn new() -> World {
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
    pub(super) fn put_hot(&self) {
        self.function(F, HOT, "hot", 12, 0x5000_0000);
    }

    /// `other` at [`F`] (its SFI at [`OTHER`], defined at column 40, its code at
    /// 0x6000_0000): what the GC made at `hot`'s address after moving it.
    fn put_other(&self) {
        self.function(F, OTHER, "other", 40, 0x6000_0000);
    }

    pub(super) fn string(&self, at: u64, s: &str) -> u64 {
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
        self.function_in(f, sfi, name, pos, code_start, script);
    }

    /// [`function`](Self::function) in the script at `script` (untagged), made by the caller.
    pub(super) fn function_in(
        &self,
        f: u64,
        sfi: u64,
        name: &str,
        pos: u64,
        code_start: u64,
        script: u64,
    ) {
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

/// The JSFunction the tests' frames hold, and the SFIs of the two functions the tests put at
/// its address in turn (`hot`, then `other` where the GC moved `hot`).
pub(super) const F: u64 = 0x20000;
pub(super) const HOT: u64 = 0x30000;
const OTHER: u64 = 0x40000;

/// A frame of compiled code of the function at `f`, at `pc`, in `context`.
pub(super) fn compiled(f: u64, pc: u64, context: u64) -> JsSlots {
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
        v8.resolve_all(&[hot_frame], &Default::default()),
        vec![named("hot", "app.js:2:3")]
    );
    // The GC moved it and made another function (of other code, in another context) at its
    // address: the frame's return address is not in that function's code, and the frame's
    // context is not its context.
    w.put_other();
    assert_eq!(
        v8.resolve_all(&[hot_frame], &Default::default()),
        vec![Resolved::Unknown]
    );
    // A frame of `other` running code that is not its current one (on-stack replacement):
    // named, its context being the function's own.
    let osr = compiled(F, 0x5800_0010, OTHER + 0x300);
    assert_eq!(
        v8.resolve_all(&[osr], &Default::default()),
        vec![named("other", "app.js:2:31")]
    );
    // Its function's memory gone: unknown.
    w.heap.0.borrow_mut().remove(&F);
    assert_eq!(
        v8.resolve_all(&[osr], &Default::default()),
        vec![Resolved::Unknown]
    );
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
    assert!(
        matches!(&v8.resolve_all(&[frame], &Default::default())[0], Resolved::Named(j) if j.name == "hot")
    );
    // Another function at its address: its bytecode is not the frame's.
    w.put_other();
    assert_eq!(
        v8.resolve_all(&[frame], &Default::default()),
        vec![Resolved::Unknown]
    );
    // An offset outside the bytecode: not an interpreted frame of it.
    w.put_hot();
    let outside = JsSlots {
        kind: SlotKind::Interpreted {
            bytecode_array: HOT + 0x100 + 1,
            offset: 4096,
        },
        ..frame
    };
    assert_eq!(
        v8.resolve_all(&[outside], &Default::default()),
        vec![Resolved::Unknown]
    );
}

#[test]
fn a_cached_name_is_dropped_when_its_sfi_address_holds_another() {
    let w = World::new();
    let sfi = HOT;
    w.function(F, sfi, "first", 12, 0x5000_0000);
    let mut v8 = w.v8();
    let frame = compiled(F, 0x5000_0010, sfi + 0x300);
    assert!(
        matches!(&v8.resolve_all(&[frame], &Default::default())[0], Resolved::Named(j) if j.name == "first")
    );
    // Another SharedFunctionInfo at the same address (its scope info elsewhere).
    w.function(F, sfi, "second", 12, 0x5000_0000);
    let scope = w.heap.0.borrow()[&(sfi + 0x500)].clone();
    w.heap.0.borrow_mut().insert(sfi + 0x600, scope);
    w.heap.put(
        sfi,
        &[M_SFI + 1, sfi + 0x100 + 1, sfi + 0x600 + 1, 0, 0x9000 + 1],
    );
    assert!(
        matches!(&v8.resolve_all(&[frame], &Default::default())[0], Resolved::Named(j) if j.name == "second")
    );
}

/// Each function named is handed once to the kernel side, which then stops copying its name
/// at the samples; named again from the cache, it is not handed again; another function at
/// its JSFunction's address after a GC is named and handed in turn.
#[test]
fn functions_named_are_handed_to_the_kernel_side_once() {
    let w = World::new();
    w.put_hot();
    let mut v8 = V8Process::new(Arc::clone(&w.layout), &w.heap);
    let named = |v8: &mut V8Process<&FakeHeap>, frame| {
        let r = v8.resolve_all(&[frame], &Default::default());
        assert!(matches!(&r[0], Resolved::Named(_)), "{r:?}");
        v8.take_named()
    };
    let hot = compiled(F, 0x5000_0010, HOT + 0x300);
    assert_eq!(named(&mut v8, hot), [HOT + 1]);
    assert_eq!(named(&mut v8, hot), Vec::<u64>::new());
    w.put_other();
    let other = compiled(F, 0x6000_0010, OTHER + 0x300);
    assert_eq!(named(&mut v8, other), [OTHER + 1]);
}

/// What a sample copies of a function's name (its first three 72-byte pieces: 200 one-byte
/// characters) names it from the sample only when the name fits: a longer one is read whole
/// from the process, never cut; and only when that one sample copied its Script too.
#[test]
fn a_name_longer_than_a_sample_copies_is_read_whole_from_the_process() {
    // (name, whether one sample copied the Script with the rest, named at the sample)
    for (name, same_sample, at_sample) in [
        ("f".repeat(20), true, 1),
        ("f".repeat(230), true, 0),
        // A function's pieces from two samples are two moments of the heap: read.
        ("f".repeat(20), false, 0),
    ] {
        let w = World::new();
        w.function(F, HOT, &name, 12, 0x5000_0000);
        super::reads::pad_headers(&w);
        // As the eBPF side copies them: the function, its SharedFunctionInfo, code and
        // ScopeInfo, the name's pieces, the Script and the Script's name.
        let (sfi, code, scope, string) = (HOT, HOT + 0x200, HOT + 0x500, HOT + 0x400);
        let record = |objects: &[u64]| super::gone::record_of(&w, objects);
        let function = [F, sfi, code, scope, string, string + 72, string + 144];
        let script = [0x9000, 0x9200];
        let mut copies = Copies::default();
        if same_sample {
            copies.add(&record(&[&function[..], &script[..]].concat()));
        } else {
            copies.add(&record(&script));
            copies.add(&record(&function));
        }
        let mut v8 = V8Process::new(Arc::clone(&w.layout), &w.heap);
        let r = v8.resolve_all(&[compiled(F, 0x5000_0010, HOT + 0x300)], &copies);
        assert!(
            matches!(&r[0], Resolved::Named(j) if j.name == name && j.location == "app.js:2:3"),
            "{r:?}"
        );
        assert_eq!(v8.stats.at_sample, at_sample, "{} characters", name.len());
    }
}
