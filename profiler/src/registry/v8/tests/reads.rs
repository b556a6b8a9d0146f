//! What naming frames reads of a heap (each read of another process's memory takes its
//! `mmap_lock`): node's own modules' sources once per process, and an unreadable page once
//! per batch.

use std::cell::RefCell;

use super::super::*;
use super::moved::{F, HOT, M_SCRIPT, M_STRING, World, compiled};

/// A memory that records the address and length of every read.
pub(super) struct Counting<'a, M: Memory> {
    mem: &'a M,
    reads: RefCell<Vec<(u64, usize)>>,
}

impl<M: Memory> Memory for Counting<'_, M> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
        self.reads.borrow_mut().push((addr, buf.len()));
        self.mem.read(addr, buf)
    }

    fn page_size(&self) -> Option<usize> {
        self.mem.page_size()
    }
}

impl<'a, M: Memory> Counting<'a, M> {
    pub(super) fn new(mem: &'a M) -> Self {
        Counting {
            mem,
            reads: RefCell::default(),
        }
    }

    /// Bytes read of `[at, at + len)`.
    pub(super) fn bytes_of(&self, at: u64, len: u64) -> u64 {
        let reads = self.reads.borrow();
        reads
            .iter()
            .map(|&(a, n)| (a + n as u64).min(at + len).saturating_sub(a.max(at)))
            .sum()
    }

    /// Reads that touched `[at, at + len)`.
    pub(super) fn of(&self, at: u64, len: u64) -> usize {
        let reads = self.reads.borrow();
        reads
            .iter()
            .filter(|&&(a, n)| a < at + len && at < a + n as u64)
            .count()
    }
}

/// A one-byte external string (V8 keeps its characters at `data`, outside its heap).
pub(super) fn external(w: &World, at: u64, data: u64, len: u64) -> u64 {
    // External (2), one byte (8), not internalized (0x20).
    let ty = 0x2a_u64;
    let map = M_STRING + 0x80;
    w.heap.put(map, &[0, ty << 32]);
    w.heap.put(at, &[map + 1, len << 32, 0, data]);
    at + 1
}

/// A script named `name` whose source is external at `data`, with no line ends computed.
fn script(w: &World, at: u64, name: &str, source_data: u64, len: u64) -> u64 {
    let name = w.string(at + 0x100, name);
    let source = external(w, at + 0x200, source_data, len);
    w.heap.put(at, &[M_SCRIPT + 1, source, name, 0, 0, 0, 0, 0]);
    at
}

/// Each Worker has its own Script objects for node's modules, whose sources are the same
/// static bytes of node's binary: their line ends are read from the first one only. A
/// script of the application's is read for each.
#[test]
fn node_module_sources_are_read_once_per_process_not_once_per_isolate() {
    let w = World::new();
    // Lines end at 9 and 19: "012345678\n012345678\n".
    let src = 0x70_0000;
    let text = b"012345678\n012345678\n";
    w.heap.put(
        src,
        &text
            .chunks(8)
            .map(|c| {
                let mut b = [0u8; 8];
                b[..c.len()].copy_from_slice(c);
                u64::from_le_bytes(b)
            })
            .collect::<Vec<_>>(),
    );
    let len = text.len() as u64;
    // Two isolates' `node:internal/x`, then two of an application's file whose source is
    // external too.
    let isolates = [
        (0x10_0000, "node:internal/x"),
        (0x20_0000, "node:internal/x"),
        (0x30_0000, "/app/x.js"),
        (0x40_0000, "/app/x.js"),
    ];
    let counting = Counting::new(&w.heap);
    let mut v8 = V8Process::new(Arc::clone(&w.layout), &counting);
    for (i, (base, name)) in isolates.into_iter().enumerate() {
        let s = script(&w, base, name, src, len);
        let (f, sfi, code) = (
            base + 0x1_0000,
            base + 0x2_0000,
            0x5000_0000 * (i as u64 + 1),
        );
        // Defined at 12: line 2, column 3.
        w.function_in(f, sfi, "fn", 12, code, s);
        let named = v8.resolve_all(
            &[compiled(f, code + 0x10, sfi + 0x300)],
            &Default::default(),
        );
        assert_eq!(
            named,
            [Resolved::Named(JsFunction {
                name: "fn".into(),
                location: format!("{name}:2:3"),
            })],
            "isolate {i}"
        );
        let source_reads = counting.of(src, len);
        let expected = match i {
            0 | 1 => 1,
            n => n,
        };
        assert_eq!(source_reads, expected, "after isolate {i}");
    }
}

/// The processes of one binary linked at a fixed address share node's module sources' line
/// ends: a second process reads none of the source its first did; processes that do not
/// share (a position-independent binary) read it each.
#[test]
fn node_module_sources_are_read_once_per_binary_when_shared() {
    let w = World::new();
    let src = 0x70_0000;
    let text = b"012345678\n012345678\n";
    let words: Vec<u64> = (text.chunks(8))
        .map(|c| {
            let mut b = [0u8; 8];
            b[..c.len()].copy_from_slice(c);
            u64::from_le_bytes(b)
        })
        .collect();
    w.heap.put(src, &words);
    let len = text.len() as u64;
    let s = script(&w, 0x10_0000, "node:internal/x", src, len);
    let (f, sfi, code) = (0x11_0000, 0x12_0000, 0x5000_0000);
    w.function_in(f, sfi, "fn", 12, code, s);
    let frame = compiled(f, code + 0x10, sfi + 0x300);
    let binary = ("fe:00".to_string(), 247_580);
    let shared = SharedSources::default();
    let reads_by = |sharing: Option<(FileKey, SharedSources)>| {
        let counting = Counting::new(&w.heap);
        let mut v8 = V8Process::new(Arc::clone(&w.layout), &counting).sharing_sources(sharing);
        let named = v8.resolve_all(&[frame], &Default::default());
        assert!(
            matches!(&named[0], Resolved::Named(j) if j.location == "node:internal/x:2:3"),
            "{named:?}"
        );
        counting.of(src, len)
    };
    let first = reads_by(Some((binary.clone(), shared.clone())));
    let second = reads_by(Some((binary.clone(), shared.clone())));
    let another_binary = reads_by(Some((("fe:00".to_string(), 1), shared.clone())));
    let unshared = (reads_by(None), reads_by(None));
    assert_eq!((first, second, another_binary, unshared), (1, 0, 1, (1, 1)));
}

/// Only an executable linked at a fixed address shares: not a position-independent one
/// (this test's own binary), nor what is no ELF file.
#[test]
fn sources_are_shared_only_by_binaries_linked_at_a_fixed_address() {
    let dir = tempfile::tempdir().unwrap();
    let mut header = b"\x7fELF".to_vec();
    header.resize(18, 0);
    let fixed = dir.path().join("fixed");
    header[16] = 2; // ET_EXEC
    std::fs::write(&fixed, &header).unwrap();
    let pie = dir.path().join("pie");
    header[16] = 3; // ET_DYN
    std::fs::write(&pie, &header).unwrap();
    let text = dir.path().join("text");
    std::fs::write(&text, b"#!/bin/sh\nexit 0\n").unwrap();
    let shared = SharedSources::default();
    let key = |i: u64| ("0:1".to_string(), i);
    assert!(shared.of(&key(1), &fixed).is_some());
    assert!(shared.of(&key(2), &pie).is_none());
    assert!(shared.of(&key(3), &text).is_none());
    assert!(shared.of(&key(4), &dir.path().join("missing")).is_none());
    // Decided once per binary.
    std::fs::remove_file(&fixed).unwrap();
    assert!(shared.of(&key(1), &fixed).is_some());
}

/// A heap read as a process's is: whole 4 KiB pages, a page missing being unreadable.
struct Paged(std::collections::BTreeMap<u64, Vec<u8>>);

const PAGE: u64 = 4096;

impl Paged {
    fn of(w: &World) -> Self {
        let mut pages = std::collections::BTreeMap::new();
        for (at, bytes) in w.heap.objects() {
            for (i, b) in bytes.into_iter().enumerate() {
                let a = at + i as u64;
                pages
                    .entry(a - a % PAGE)
                    .or_insert_with(|| vec![0u8; PAGE as usize])[(a % PAGE) as usize] = b;
            }
        }
        Paged(pages)
    }
}

impl Memory for Paged {
    fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
        for (i, b) in buf.iter_mut().enumerate() {
            let a = addr + i as u64;
            match self.0.get(&(a - a % PAGE)) {
                Some(page) => *b = page[(a % PAGE) as usize],
                None => return false,
            }
        }
        true
    }

    fn page_size(&self) -> Option<usize> {
        Some(PAGE as usize)
    }
}

/// A frame whose function's page is gone (unmapped since the sample): the page is tried
/// once for the batch, not once more by each check that needs the function.
#[test]
fn an_unreadable_page_is_read_once_per_batch() {
    let w = World::new();
    w.put_hot();
    let mut paged = Paged::of(&w);
    let frame = compiled(F, 0x5000_0010, HOT + 0x300);
    {
        let counting = Counting::new(&paged);
        let mut v8 = V8Process::new(Arc::clone(&w.layout), &counting);
        assert!(
            matches!(&v8.resolve_all(&[frame], &Default::default())[0], Resolved::Named(j) if j.name == "hot")
        );
    }
    paged.0.remove(&F);
    let counting = Counting::new(&paged);
    let mut v8 = V8Process::new(Arc::clone(&w.layout), &counting);
    assert_eq!(
        v8.resolve_all(&[frame, frame], &Default::default()),
        [Resolved::Unknown, Resolved::Unknown]
    );
    assert_eq!(counting.of(F, PAGE), 1, "{:x?}", counting.reads.borrow());
}

/// Objects at least a header long, as a real heap's are: the headers are read ahead.
pub(super) fn pad_headers(w: &World) {
    for (at, mut bytes) in w.heap.objects() {
        bytes.resize(bytes.len().max(72), 0);
        w.heap.put(at, &words_of(&bytes));
    }
}

/// The object at `at` moved by the GC: its map word is now the new copy's address (no heap
/// object tag), the rest of its header unchanged.
fn forward(w: &World, at: u64) {
    let mut header = [0u8; 72];
    assert!(w.heap.read(at, &mut header));
    header[..8].copy_from_slice(&0x8_0000u64.to_le_bytes());
    w.heap.put(at, &words_of(&header));
}

pub(super) fn words_of(bytes: &[u8]) -> Vec<u64> {
    (bytes.chunks(8))
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// A function moved by the GC since the sample (its old copy's map word now a forwarding
/// address) is read no further: its frame is unknown whatever its SharedFunctionInfo says.
/// An interpreted frame's function has its Code object left unread (only a compiled frame's
/// is checked).
#[test]
fn only_what_the_checks_use_is_read() {
    let w = World::new();
    w.put_hot();
    pad_headers(&w);
    let interpreted = JsSlots {
        kind: SlotKind::Interpreted {
            bytecode_array: HOT + 0x100 + 1,
            offset: 60,
        },
        ..compiled(F, 0x1234, HOT + 0x300)
    };
    let code = HOT + 0x200;
    let counting = Counting::new(&w.heap);
    let mut v8 = V8Process::new(Arc::clone(&w.layout), &counting);
    assert!(
        matches!(&v8.resolve_all(&[interpreted], &Default::default())[0], Resolved::Named(j) if j.name == "hot")
    );
    assert_eq!(counting.of(code, 8), 0, "{:x?}", counting.reads.borrow());
    // Moved: the map word is the new copy's address (no heap object tag).
    forward(&w, F);
    counting.reads.borrow_mut().clear();
    let moved = compiled(F, 0x5000_0010, HOT + 0x300);
    assert_eq!(
        v8.resolve_all(&[moved], &Default::default()),
        [Resolved::Unknown]
    );
    assert_eq!(
        counting.of(HOT, 0x1000),
        0,
        "{:x?}",
        counting.reads.borrow()
    );
}

/// The objects the eBPF side copied at the sample (a function, its SharedFunctionInfo and
/// code) are taken from the copies, not read; and a copy is what the frame is checked
/// against, not the heap as it is by the time the batch is named: a function the GC moved
/// since the sample is still named, as it was when the stack held it.
#[test]
fn objects_copied_at_the_sample_are_not_read() {
    let w = World::new();
    w.put_hot();
    pad_headers(&w);
    let (copies, sfi, code) = super::gone::copies_of_hot(&w);
    let frame = compiled(F, 0x5000_0010, HOT + 0x300);
    let counting = Counting::new(&w.heap);
    let mut v8 = V8Process::new(Arc::clone(&w.layout), &counting);
    let named = |r: &[Resolved]| matches!(&r[0], Resolved::Named(j) if j.name == "hot");
    assert!(named(&v8.resolve_all(&[frame], &copies)));
    // The SharedFunctionInfo, whose name is not cached yet, is read again to check it still
    // holds what its copy holds (its name and script are read now): its map, name and
    // script words (in a process, by the page its name is read from: the next test).
    let untouched = |c: &Counting<_>| [F, sfi, code].map(|at| c.of(at, 72));
    assert_eq!(
        untouched(&counting),
        [0, 3, 0],
        "{:x?}",
        counting.reads.borrow()
    );
    assert_eq!(v8.stats.copied, 3);
    // Moved since the sample: the heap's map word is now a forwarding address. Its name is
    // cached by now: nothing is read.
    forward(&w, F);
    assert!(named(&v8.resolve_all(&[frame], &copies)));
    assert_eq!(
        untouched(&counting),
        [0, 3, 0],
        "{:x?}",
        counting.reads.borrow()
    );
    // Without the copies, the heap as it is now: moved, so unknown.
    assert_eq!(
        v8.resolve_all(&[frame], &Copies::default()),
        [Resolved::Unknown]
    );
}

/// In a process, whose memory is read by the page, checking a copied SharedFunctionInfo
/// whose name is not cached reads no page more than naming it does: its page is the one its
/// ScopeInfo and name are read from (V8 allocates them together; here, in one page). Three
/// reads in all, each page once: that page, the maps' (their instance types) and the
/// script's; none of the function's.
#[test]
fn the_check_of_a_copied_function_reads_no_page_more_than_its_name() {
    let w = World::new();
    w.put_hot();
    pad_headers(&w);
    let (copies, sfi, _) = super::gone::copies_of_hot(&w);
    let paged = Paged::of(&w);
    let counting = Counting::new(&paged);
    let mut v8 = V8Process::new(Arc::clone(&w.layout), &counting);
    let frame = compiled(F, 0x5000_0010, HOT + 0x300);
    assert!(matches!(&v8.resolve_all(&[frame], &copies)[0], Resolved::Named(j) if j.name == "hot"));
    let reads = counting.reads.borrow().clone();
    let pages: Vec<u64> = reads.iter().map(|(a, _)| a - a % PAGE).collect();
    assert_eq!(pages, [sfi - sfi % PAGE, 0x1000, 0x9000], "{reads:x?}");
    assert_eq!(counting.of(F, 72), 0);
}

/// A memory that records, at each read, whether the reading thread ran at `SCHED_FIFO`.
struct Policies<'a, M: Memory> {
    mem: &'a M,
    fifo: RefCell<Vec<bool>>,
}

impl<M: Memory> Memory for Policies<'_, M> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
        // SAFETY: a plain syscall on the calling thread.
        let policy = unsafe { libc::sched_getscheduler(0) };
        self.fifo.borrow_mut().push(policy == libc::SCHED_FIFO);
        self.mem.read(addr, buf)
    }

    fn page_size(&self) -> Option<usize> {
        self.mem.page_size()
    }
}

/// Every read of a batch's naming runs unpreempted (it holds the process's lock), where the
/// profiler may raise its priority (root), and the thread's priority is restored after.
#[test]
fn a_batch_is_read_unpreempted() {
    let w = World::new();
    w.put_hot();
    let paged = Paged::of(&w);
    let raised = crate::kernel::priority::Unpreempted::new().raised();
    let policies = Policies {
        mem: &paged,
        fifo: RefCell::default(),
    };
    let mut v8 = V8Process::new(Arc::clone(&w.layout), &policies);
    let frame = compiled(F, 0x5000_0010, HOT + 0x300);
    assert!(
        matches!(&v8.resolve_all(&[frame], &Default::default())[0], Resolved::Named(j) if j.name == "hot")
    );
    let fifo = policies.fifo.borrow();
    assert!(!fifo.is_empty());
    assert!(
        fifo.iter().all(|&f| f == raised),
        "raised {raised}: {fifo:?}"
    );
    // SAFETY: as above.
    assert_ne!(unsafe { libc::sched_getscheduler(0) }, libc::SCHED_FIFO);
}
