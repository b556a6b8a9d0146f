//! Ground-truth tests: capture our own registers and stack bytes the way the
//! eBPF side does, then unwind them with `ProcessUnwinder` on our own pid.

use super::*;
use std::arch::asm;
use std::cell::RefCell;
use std::ffi::{c_int, c_void};
use std::hint::black_box;

const STACK_BYTES: usize = 16 * 1024;
const MAX_FRAMES: usize = 128;

#[derive(Clone, Debug)]
struct Captured {
    regs: UserRegs,
    stack: Vec<u8>,
}

/// The registers at a point inside the calling function (after its prologue, so its CFI
/// row is valid), as the kernel saves them at an entry from there.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn registers() -> UserRegs {
    let (ip, sp, bp): (u64, u64, u64);
    // SAFETY: only reads registers.
    unsafe {
        asm!(
            "lea {ip}, [rip]",
            "mov {sp}, rsp",
            "mov {bp}, rbp",
            ip = out(reg) ip,
            sp = out(reg) sp,
            bp = out(reg) bp,
            options(nomem, nostack, preserves_flags),
        );
    }
    UserRegs {
        ip,
        sp,
        fp: bp,
        lr: 0,
    }
}

#[cfg(target_arch = "aarch64")]
#[inline(always)]
fn registers() -> UserRegs {
    let (ip, sp, fp, lr): (u64, u64, u64, u64);
    // SAFETY: only reads registers.
    unsafe {
        asm!(
            "adr {ip}, .",
            "mov {sp}, sp",
            "mov {fp}, x29",
            "mov {lr}, x30",
            ip = out(reg) ip,
            sp = out(reg) sp,
            fp = out(reg) fp,
            lr = out(reg) lr,
            options(nomem, nostack, preserves_flags),
        );
    }
    UserRegs { ip, sp, fp, lr }
}

/// Captures the registers at a point inside this function and copies up to 16 KiB above
/// `sp`, clamped to the end of the stack mapping, like `bpf_probe_read_user` would be.
#[inline(never)]
fn capture() -> Captured {
    let mut stack = vec![0u8; STACK_BYTES];
    let regs = registers();
    let sp = regs.sp;
    let maps = Maps::read(std::process::id()).unwrap();
    let end = maps.find(sp).expect("sp is mapped").end;
    let len = STACK_BYTES.min((end - sp) as usize);
    // SAFETY: [sp, sp + len) is inside our own mapped stack; everything written
    // after the capture point (callee frames of this function) lies below sp.
    unsafe { std::ptr::copy_nonoverlapping(sp as *const u8, stack.as_mut_ptr(), len) };
    stack.truncate(len);
    Captured { regs, stack }
}

// `black_box` after each call keeps the calls from becoming tail calls.
#[inline(never)]
fn level_c() -> Captured {
    black_box(capture())
}
#[inline(never)]
fn level_b() -> Captured {
    black_box(level_c())
}
#[inline(never)]
fn level_a() -> Captured {
    black_box(level_b())
}

fn names(frames: &[Frame]) -> Vec<String> {
    frames
        .iter()
        .map(|f| f.symbol.clone().unwrap_or_default())
        .collect()
}

fn dump(frames: &[Frame]) {
    for (i, f) in frames.iter().enumerate() {
        let dso = f.dso.as_deref().map(|p| p.display().to_string());
        eprintln!(
            "  #{i:<2} {:#014x} {:<60} {}",
            f.addr,
            f.symbol.as_deref().unwrap_or("?"),
            dso.unwrap_or_default()
        );
    }
}

/// This process's stack as `c` captured it, unwound from its frame pointer `fp` (0: no
/// frame-pointer fallback) and symbolized (and shown, for a failure's sake).
fn unwind_own(c: &Captured, fp: u64) -> Vec<Frame> {
    let mut u = ProcessUnwinder::new(std::process::id(), Shared::default()).unwrap();
    let regs = UserRegs { fp, ..c.regs };
    let unwound = u.unwind(regs, &c.stack, MAX_FRAMES);
    let frames = u.symbolize_stack(&unwound.addrs());
    dump(&frames);
    frames
}

/// The frame pointer for an unwind by CFI alone: 0 on x86_64 (Rust's code keeps none, so a
/// frame pointer fallback would stop at once); the real one on arm64, whose CFI finds a
/// frame from x29 wherever the function keeps one (Rust's code for arm64 Linux does).
fn cfi_fp(c: &Captured) -> u64 {
    if cfg!(target_arch = "aarch64") {
        c.regs.fp
    } else {
        0
    }
}

/// Index of the first frame at or after `from` whose symbol contains `needle`.
fn position(frames: &[Frame], from: usize, needle: &str) -> usize {
    (from..frames.len())
        .find(|&i| {
            frames[i]
                .symbol
                .as_deref()
                .is_some_and(|s| s.contains(needle))
        })
        .unwrap_or_else(|| panic!("no frame {needle:?} after #{from} in {:#?}", names(frames)))
}

/// Asserts that the needles appear in this order (innermost first).
fn assert_chain(frames: &[Frame], needles: &[&str]) -> Vec<usize> {
    let mut at = 0;
    needles
        .iter()
        .map(|n| {
            at = position(frames, at, n);
            at
        })
        .collect()
}

#[test]
fn unwinds_rust_chain_with_eh_frame_only() {
    // On x86_64 bp = 0: any frame-pointer fallback would stop immediately, so reaching
    // level_a proves the CFI path is taken.
    let c = level_a();
    let frames = unwind_own(&c, cfi_fp(&c));
    let idx = assert_chain(
        &frames,
        &[
            "capture",
            "level_c",
            "level_b",
            "level_a",
            "unwinds_rust_chain_with_eh_frame_only",
        ],
    );
    assert_eq!(idx[0], 0, "first frame is ip inside capture");
    let exe = std::env::current_exe().unwrap();
    assert_eq!(frames[idx[1]].dso.as_deref(), Some(exe.as_path()));
    assert!(
        !frames[idx[1]].symbol.as_deref().unwrap().contains("::h"),
        "demangled without hash"
    );
}

unsafe extern "C" {
    fn qsort(
        base: *mut c_void,
        n: usize,
        size: usize,
        compare: unsafe extern "C" fn(*const c_void, *const c_void) -> c_int,
    );
    fn mmap(
        addr: *mut c_void,
        len: usize,
        prot: c_int,
        flags: c_int,
        fd: c_int,
        off: i64,
    ) -> *mut c_void;
    fn mprotect(addr: *mut c_void, len: usize, prot: c_int) -> c_int;
}

thread_local! {
    static QSORT_CAPTURE: RefCell<Option<Captured>> = const { RefCell::new(None) };
}

unsafe extern "C" fn compare_and_capture(a: *const c_void, b: *const c_void) -> c_int {
    QSORT_CAPTURE.with(|c| {
        let mut c = c.borrow_mut();
        if c.is_none() {
            *c = Some(capture());
        }
    });
    // SAFETY: qsort passes pointers to elements of our i32 array.
    let (a, b) = unsafe { (*(a as *const i32), *(b as *const i32)) };
    a.cmp(&b) as c_int
}

#[inline(never)]
fn sort_through_libc() -> Captured {
    let mut v: Vec<i32> = (0..64).rev().collect();
    // SAFETY: valid array of 64 i32s and a matching comparator.
    unsafe { qsort(v.as_mut_ptr().cast(), v.len(), 4, compare_and_capture) };
    black_box(&v);
    QSORT_CAPTURE.with(|c| c.borrow_mut().take()).unwrap()
}

#[test]
fn unwinds_through_glibc_without_frame_pointers() {
    let c = sort_through_libc();
    let frames = unwind_own(&c, cfi_fp(&c));
    let idx = assert_chain(
        &frames,
        &["capture", "compare_and_capture", "sort_through_libc"],
    );
    let is_libc = |f: &Frame| {
        f.dso
            .as_deref()
            .and_then(Path::file_name)
            .is_some_and(|n| n == "libc.so.6")
    };
    let libc: Vec<usize> = (0..frames.len()).filter(|&i| is_libc(&frames[i])).collect();
    assert!(
        libc.iter().any(|&i| idx[1] < i && i < idx[2]),
        "a libc.so.6 frame between comparator and caller: {libc:?}"
    );
    assert!(libc.iter().any(|&i| {
        frames[i]
            .symbol
            .as_deref()
            .is_some_and(|s| s.contains("qsort") || s.contains("msort"))
    }));
    // glibc's sort calls the comparator from a function of its own (`msort_with_tmp`), which
    // its stripped `.dynsym` does not name: its separate debug file does, when installed
    // (Debian's libc6-dbg; `cargo xtask test` installs it).
    let id = frames[libc[0]].build_id.clone().expect("libc's build id");
    let bytes: Vec<u8> = (0..id.len() / 2)
        .map(|i| u8::from_str_radix(&id[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    if super::debugfile::by_build_id(&bytes, &super::debugfile::DEBUG_DIRS).is_some() {
        let unnamed: Vec<&Frame> = libc
            .iter()
            .map(|&i| &frames[i])
            .filter(|f| f.symbol.is_none())
            .collect();
        assert!(unnamed.is_empty(), "libc frames left unnamed: {unnamed:?}");
        assert!(
            libc.iter().any(|&i| frames[i]
                .symbol
                .as_deref()
                .is_some_and(|s| s.starts_with("msort_with_tmp"))),
            "{:?}",
            libc.iter().map(|&i| &frames[i].symbol).collect::<Vec<_>>()
        );
    } else {
        eprintln!("no debug file for libc {id}: its internal functions stay unnamed");
    }
}

thread_local! {
    static JIT_CAPTURE: RefCell<Option<Captured>> = const { RefCell::new(None) };
}

extern "C" fn jit_callback() {
    let c = capture();
    JIT_CAPTURE.with(|j| *j.borrow_mut() = Some(c));
}

/// Machine code without any unwind info, in an anonymous executable mapping,
/// that keeps a frame-pointer chain like V8 does:
/// `push rbp; mov rbp, rsp; call rdi; pop rbp; ret`.
#[cfg(target_arch = "x86_64")]
const TRAMPOLINE: &[u8] = &[0x55, 0x48, 0x89, 0xe5, 0xff, 0xd7, 0x5d, 0xc3];

/// The same on arm64: `stp x29, x30, [sp, #-16]!; mov x29, sp; blr x0;
/// ldp x29, x30, [sp], #16; ret`.
#[cfg(target_arch = "aarch64")]
const TRAMPOLINE: &[u8] = &[
    0xfd, 0x7b, 0xbf, 0xa9, 0xfd, 0x03, 0x00, 0x91, 0x00, 0x00, 0x3f, 0xd6, 0xfd, 0x7b, 0xc1, 0xa8,
    0xc0, 0x03, 0x5f, 0xd6,
];

/// Makes the instructions just written at `p` (within one cache line) visible to
/// instruction fetch: arm64 keeps its instruction cache apart from the data cache.
#[cfg(target_arch = "aarch64")]
fn sync_icache(p: *mut c_void) {
    // SAFETY: cache maintenance of our own mapping's line; no memory is changed.
    unsafe {
        asm!(
            "dc cvau, {p}",
            "dsb ish",
            "ic ivau, {p}",
            "dsb ish",
            "isb",
            p = in(reg) p,
            options(nostack, preserves_flags),
        );
    }
}

#[cfg(target_arch = "x86_64")]
fn sync_icache(_: *mut c_void) {}

fn make_jit_trampoline() -> extern "C" fn(extern "C" fn()) {
    // SAFETY: fresh private anonymous mapping, written then made RX; leaked on purpose.
    unsafe {
        let p = mmap(std::ptr::null_mut(), 4096, 1 | 2, 0x02 | 0x20, -1, 0);
        assert_ne!(p as isize, -1, "mmap");
        std::ptr::copy_nonoverlapping(TRAMPOLINE.as_ptr(), p.cast(), TRAMPOLINE.len());
        assert_eq!(mprotect(p, 4096, 1 | 4), 0, "mprotect");
        sync_icache(p);
        std::mem::transmute::<*mut c_void, extern "C" fn(extern "C" fn())>(p)
    }
}

#[inline(never)]
fn call_through_jit(trampoline: extern "C" fn(extern "C" fn())) -> Captured {
    trampoline(jit_callback);
    black_box(JIT_CAPTURE.with(|j| j.borrow_mut().take()).unwrap())
}

#[test]
fn falls_back_to_frame_pointers_in_anonymous_code() {
    let trampoline = make_jit_trampoline();
    let c = call_through_jit(trampoline);
    // Real frame pointer here: CFI restores the trampoline's, then the fallback walks it.
    let frames = unwind_own(&c, c.regs.fp);
    let idx = assert_chain(
        &frames,
        &[
            "capture",
            "jit_callback",
            "call_through_jit",
            "falls_back_to_frame_pointers",
        ],
    );
    assert_eq!(
        idx[2],
        idx[1] + 2,
        "exactly one JIT frame between callback and caller"
    );
    let jit = &frames[idx[1] + 1];
    let start = trampoline as usize as u64;
    assert!(
        (start..start + TRAMPOLINE.len() as u64).contains(&jit.addr),
        "{:#x} in trampoline",
        jit.addr
    );
    assert_eq!(jit.dso, None);
}

/// Names are cached by file and offset for every process sharing `Shared`: a second
/// unwinder (another process of the same binary, here this one again) names the same stack
/// alike from the cache, which holds each frame once and grows no more.
#[test]
fn names_are_shared_by_file_and_offset() {
    let c = level_a();
    let shared = Shared::default();
    let named = |shared: &Shared| {
        let mut u = ProcessUnwinder::new(std::process::id(), shared.clone()).unwrap();
        let regs = UserRegs {
            fp: cfi_fp(&c),
            ..c.regs
        };
        let unwound = u.unwind(regs, &c.stack, MAX_FRAMES);
        names(&u.symbolize_stack(&unwound.addrs()))
    };
    let first = named(&shared);
    let cached = shared.symbols.borrow().len();
    assert!(cached >= 5, "{cached} names cached for {first:?}");
    assert_eq!(named(&shared), first);
    assert_eq!(shared.symbols.borrow().len(), cached);
    // A name in the cache is what is given: the cache is used, not only filled.
    let key = (shared.symbols.borrow().keys())
        .find(|k| {
            shared.symbols.borrow()[*k]
                .as_deref()
                .is_some_and(|s| s.contains("level_b"))
        })
        .cloned()
        .expect("level_b cached");
    shared
        .symbols
        .borrow_mut()
        .insert(key, Some("renamed_in_cache".into()));
    assert!(named(&shared).iter().any(|n| n == "renamed_in_cache"));
    assert!(
        !named(&Shared::default())
            .iter()
            .any(|n| n == "renamed_in_cache")
    );
}
