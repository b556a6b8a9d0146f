//! The objects of a sample's V8 frames, copied at the sample from the sampled thread's own
//! memory: each frame's JSFunction, its SharedFunctionInfo and code, and the BytecodeArray an
//! interpreted frame holds (their first [`V8_COPY_BYTES`], what userspace checks and names
//! from). Userspace would otherwise read them from the process soon after, with
//! `process_vm_readv`, which takes the target's `mmap_lock` for each range: the very lock
//! whose waits are measured. A copy here takes no lock (`bpf_probe_read_user` does not fault)
//! and sees the objects as the stack held them, before the GC moved any.
//!
//! The frames are found without unwinding. The sample is taken in a syscall, and the C
//! library's frames between it and the first V8 frame keep no frame pointer, so the stack
//! copy is scanned from its top (the stack pointer) for the first word that starts a chain of
//! frame pointers (each pointing higher up the copy) on which at least two frames look like
//! V8's (their context and function slots hold tagged heap pointers). The chain is then
//! followed and the objects of its V8-looking frames copied. A wrong guess costs a few reads
//! and nothing else: userspace unwinds the stack itself and uses a copy only for an object it
//! asks for, at the very address it asks for, reading the rest as before. Measured on the
//! JavaScript-names fixture (every API, 2,000 samples): the chain found held 99.9% of the
//! sampled V8 frames, after 22-53 steps.

use core::{ffi::c_void, ptr};

use aya_ebpf::{
    helpers::{bpf_probe_read_user, bpf_probe_read_user_buf},
    macros::map,
    maps::{HashMap, LruHashMap, PerCpuArray},
};
use profiler_common::{
    MAX_FRAME_COPIES, MAX_V8_COPIES, STACK_BYTES, V8_COPY_BYTES, V8_COPY_SLOTS, V8_NAMED_ENTRIES,
    V8Copy, V8Frames, V8Named,
};

use crate::maps::{SAMPLE_BUF, for_each};

mod names;
use names::name_step;

/// Each process's frame layout (its node's), by tgid, set by userspace once it has read
/// node's V8 metadata: a process without one has nothing copied (userspace reads).
#[map]
pub static V8_FRAMES: HashMap<u32, V8Frames> = HashMap::with_max_entries(8192, 0);

/// The SharedFunctionInfos userspace has named, by process: their names are not copied again
/// (see `profiler_common::V8Named`).
#[map]
pub static V8_NAMED: LruHashMap<V8Named, u8> = LruHashMap::with_max_entries(V8_NAMED_ENTRIES, 0);

/// Steps of the scan (one word looked at, or one link of a chain followed).
const SCAN_STEPS: u32 = 192;
/// How far above the stack pointer a chain's first link is looked for.
const SCAN_BYTES: u64 = 8192;
/// A chain's first link spans at most this (a frame's size).
const FIRST_LINK: u64 = 8192;
/// Links of a chain followed, at most.
const LINKS: u32 = 32;
/// V8-looking frames that make a chain the one.
const V8_FRAMES_NEEDED: u32 = 2;
/// No offset (of the scan's current chain link, or of the chain found).
const NONE: u64 = u64::MAX;
const ENTRY: usize = size_of::<V8Copy>();

/// The walk's state, in a per-CPU map rather than on the stack: the verifier then knows
/// nothing of its values from one step to the next, so each step is checked once, not once
/// per value the scan could hold (on the stack, the two loops went past a million checked
/// instructions).
struct Walk {
    /// The sampled thread's process.
    tgid: u32,
    /// The stack copy: the user address of its first byte, and its length.
    sp: u64,
    len: u64,
    l: V8Frames,
    /// The scan: the next word to look at, and the chain being tried (its first link, the
    /// current one, how many links and V8-looking frames so far).
    x: u64,
    start: u64,
    f: u64,
    links: u32,
    v8: u32,
    /// Objects copied, and the last function copied (a recursive frame is copied once).
    copies: u32,
    /// SharedFunctionInfos copied (their copies' indexes), whose names are copied next.
    sfis: u32,
    last_function: u64,
    last_script: u64,
    last_map: u64,
    sfi_copies: [u32; MAX_SFIS],
}

/// Most SharedFunctionInfos whose names are copied (a power of two: masked index).
const MAX_SFIS: usize = 32;
#[map]
static WALK: PerCpuArray<Walk> = PerCpuArray::with_max_entries(1, 0);

/// This CPU's sample buffer's stack array (what `sampling::send` copied the stack into).
#[inline(always)]
fn buf() -> Option<*mut u8> {
    // SAFETY: a per-CPU array element, valid for the map's life (see `walk`).
    SAMPLE_BUF
        .get_ptr_mut(0)
        .map(|e| unsafe { (*e).stack.as_mut_ptr() })
}

/// This CPU's walk (only the program running on it uses it, see `sampling::send`).
#[inline(always)]
fn walk<'a>() -> Option<&'a mut Walk> {
    // SAFETY: a per-CPU array element, valid for the map's life; programs do not migrate
    // while they run, and none runs nested in another that samples on one CPU.
    WALK.get_ptr_mut(0).map(|w| unsafe { &mut *w })
}

impl Walk {
    /// Whether userspace has named the SharedFunctionInfo at `sfi` (tagged) of this process.
    #[inline(always)]
    fn named(&self, sfi: u64) -> bool {
        let key = V8Named {
            tgid: self.tgid,
            _pad: 0,
            sfi,
        };
        // SAFETY: only whether the key is there is used.
        unsafe { V8_NAMED.get(key) }.is_some()
    }

    /// The stack word at offset `o` of the copy.
    #[inline(always)]
    fn word(&self, o: u64) -> Option<u64> {
        let len = self.len;
        if len > STACK_BYTES as u64 || o >= len || len - o < 8 || !o.is_multiple_of(8) {
            return None;
        }
        let buf = buf()?;
        // A multiple of 8 below the copy's length: the mask only shows the verifier the bound.
        let o = bounded(o as usize) & (STACK_BYTES - 8);
        // SAFETY: `buf` is the per-CPU sample buffer's stack array, `o + 8` within it.
        Some(unsafe { ptr::read(buf.add(o).cast::<u64>()) })
    }

    /// The word at `off` (a slot's offset, negative below the frame pointer) from the frame
    /// whose pointer is at offset `f`.
    #[inline(always)]
    fn slot(&self, f: u64, off: i32) -> Option<u64> {
        let at = f as i64 + off as i64;
        if at < 0 {
            return None;
        }
        self.word(at as u64)
    }

    /// The offset of the next link of the chain from the link at `f`, if it points higher up
    /// the copy (a frame pointer saved by the frame above).
    #[inline(always)]
    fn next(&self, f: u64) -> Option<u64> {
        let n = self.word(f)?;
        let at = self.sp.wrapping_add(f);
        (n > at && n < self.sp.wrapping_add(self.len) && n.is_multiple_of(8)).then(|| n - self.sp)
    }

    /// Whether the frame at `f` looks like a V8 JavaScript frame.
    #[inline(always)]
    fn v8_like(&self, f: u64) -> bool {
        let tagged = |w: Option<u64>| w.is_some_and(is_heap_object);
        tagged(self.slot(f, self.l.fp_context)) && tagged(self.slot(f, self.l.fp_function))
    }

    /// Copies the object at the tagged pointer `p`; its index among the copies.
    #[inline(always)]
    fn copy(&mut self, p: u64) -> Option<u32> {
        if !is_heap_object(p) {
            return None;
        }
        self.copy_at(p - 1)
    }

    /// Copies [`V8_COPY_BYTES`] at the (untagged) address `addr`; its index among the copies.
    #[inline(always)]
    fn copy_at(&mut self, addr: u64) -> Option<u32> {
        let k = self.copies;
        if k >= MAX_V8_COPIES as u32 {
            return None;
        }
        let buf = buf()?;
        let at = slot_at(k);
        // SAFETY: `slot_at` lies within the sample buffer's array, an entry's length before
        // its end.
        let dst = unsafe { core::slice::from_raw_parts_mut(buf.add(at + 8), V8_COPY_BYTES) };
        // SAFETY: bpf_probe_read_user fails instead of faulting on unmapped user memory.
        if unsafe { bpf_probe_read_user_buf(addr as *const u8, dst) }.is_err() {
            return None;
        }
        // SAFETY: as above; the entry's first 8 bytes.
        unsafe { ptr::write_unaligned(buf.add(at).cast::<u64>(), addr) };
        self.copies = k + 1;
        Some(k)
    }

    /// The word at `off` (an 8-byte word below 64) of copy `k`.
    #[inline(always)]
    fn copied(&self, k: u32, off: u32) -> Option<u64> {
        let buf = buf()?;
        let at = slot_at(k) + 8 + (bounded(off as usize) & 0x38);
        // SAFETY: within copy `k`'s bytes, so within the buffer.
        Some(unsafe { ptr::read_unaligned(buf.add(at).cast::<u64>()) })
    }

    /// The instance type of copy `k`'s map (read from the map itself: maps do not move).
    #[inline(always)]
    fn type_of(&self, k: u32) -> Option<u16> {
        let map = self.copied(k, 0)?;
        if !is_heap_object(map) {
            return None;
        }
        let at = (map - 1).wrapping_add(self.l.map_instance_type as u64);
        // SAFETY: bpf_probe_read_user fails instead of faulting on unmapped user memory.
        unsafe { bpf_probe_read_user(at as *const u16) }.ok()
    }

}

/// Where copy `k` goes in the sample buffer's array: past the stack's room, at a masked
/// offset (a mask is arithmetic, so its bound holds wherever the compiler keeps the value;
/// a compared bound is lost by verifiers before about 6.8 once it is spilled, and 6.1
/// rejected the access so).
#[inline(always)]
fn slot_at(k: u32) -> usize {
    STACK_BYTES + (bounded(k as usize) & (V8_COPY_SLOTS - 1)) * ENTRY
}

/// `x`, as a value the compiler knows nothing of: the mask applied next then bounds the very
/// register the verifier sees used as the offset (the compiler drops a mask it can prove
/// idle from an earlier check, which the verifier does not see).
#[inline(always)]
fn bounded(x: usize) -> usize {
    core::hint::black_box(x)
}

/// A V8 tagged pointer to a heap object (the low two bits 01).
#[inline(always)]
fn is_heap_object(w: u64) -> bool {
    w & 3 == 1
}

/// One step of the scan (a `for_each` callback; returns non-zero to stop).
extern "C" fn scan_step(_i: u64, _ctx: *mut c_void) -> i64 {
    let Some(w) = walk() else {
        return 1;
    };
    if w.f == NONE {
        if w.x >= SCAN_BYTES {
            return 1;
        }
        let Some(y) = w.word(w.x) else {
            return 1;
        };
        let at = w.sp.wrapping_add(w.x);
        if y > at && y - at <= FIRST_LINK && y < w.sp.wrapping_add(w.len) && y.is_multiple_of(8) {
            (w.start, w.f, w.links, w.v8) = (w.x, w.x, 0, 0);
        } else {
            w.x += 8;
        }
        return 0;
    }
    if w.v8_like(w.f) {
        w.v8 += 1;
        if w.v8 >= V8_FRAMES_NEEDED {
            w.f = w.start;
            return 1;
        }
    }
    w.links += 1;
    match w.next(w.f) {
        Some(n) if w.links < LINKS => w.f = n,
        _ => {
            w.f = NONE;
            w.x = w.start + 8;
        }
    }
    0
}

/// One link of the chain found: its objects copied if it looks like a V8 frame (a
/// `for_each` callback; returns non-zero to stop).
extern "C" fn copy_step(_i: u64, _ctx: *mut c_void) -> i64 {
    let Some(w) = walk() else {
        return 1;
    };
    let f = w.f;
    if f == NONE || w.copies + 5 > MAX_FRAME_COPIES as u32 {
        return 1;
    }
    // The layout's fields are read where used, not copied whole onto the stack: 6.1's
    // verifier counts a callback's stack with its callers' (512 bytes in all).
    if w.v8_like(f)
        && let Some(function) = w.slot(f, w.l.fp_function)
        && function != w.last_function
    {
            w.last_function = function;
            if let Some(k) = w.copy(function) {
                // Its map (per isolate: its type is read once per map), unless the last
                // function's was the same.
                if let Some(m) = w.copied(k, 0)
                    && m != w.last_map
                {
                    w.last_map = m;
                    w.copy(m);
                }
                if let Some(p) = w.copied(k, w.l.function_shared)
                    && let Some(ks) = w.copy(p)
                    && (w.sfis as usize) < MAX_SFIS
                    && !w.named(p)
                {
                    w.sfi_copies[bounded(w.sfis as usize) & (MAX_SFIS - 1)] = ks;
                    w.sfis += 1;
                }
                if let Some(p) = w.copied(k, w.l.function_code) {
                    w.copy(p);
                }
            }
            // An interpreted (or baseline) frame's BytecodeArray, beside a Smi offset.
            if let (Some(b), Some(o)) = (
                w.slot(f, w.l.fp_bytecode_array),
                w.slot(f, w.l.fp_bytecode_offset),
            ) && o & 1 == 0
            {
                w.copy(b);
            }
    }
    w.f = w.next(f).unwrap_or(NONE);
    0
}

/// Copies the objects of the V8 frames in the sample buffer's stack copy (`len` bytes from
/// `sp`) of a thread of process `tgid`, into the buffer past the stack's room: how many
/// ([`V8Copy`]s, from `STACK_BYTES` on), 0 for a process whose layout userspace has not set.
#[inline(never)]
pub fn copy_objects(tgid: u32, sp: u64, len: u32) -> u32 {
    // SAFETY: a hash map value, read once into the walk.
    let Some(l) = (unsafe { V8_FRAMES.get(tgid) }) else {
        return 0;
    };
    if len as usize > STACK_BYTES {
        return 0;
    }
    let Some(w) = walk() else {
        return 0;
    };
    // Field by field, the layout copied from map value to map value: a tuple built first
    // would be a temporary on this function's stack, which 6.1's verifier counts with its
    // callers' and callbacks' (512 bytes in all).
    w.tgid = tgid;
    w.sp = sp;
    w.len = len as u64;
    // SAFETY: both are valid map values of this type, distinct maps.
    unsafe { ptr::copy_nonoverlapping(l, &mut w.l, 1) };
    w.x = 0;
    w.start = NONE;
    w.f = NONE;
    w.links = 0;
    w.v8 = 0;
    w.copies = 0;
    w.last_function = 0;
    w.sfis = 0;
    w.last_script = 0;
    w.last_map = 0;
    let ctx = ptr::null_mut();
    for_each::<SCAN_STEPS>(SCAN_STEPS, scan_step, ctx);
    let Some(w) = walk() else {
        return 0;
    };
    if w.v8 < V8_FRAMES_NEEDED {
        return 0;
    }
    for_each::<LINKS>(LINKS, copy_step, ctx);
    let Some(w) = walk() else {
        return 0;
    };
    let sfis = w.sfis;
    for_each::<{ MAX_SFIS as u32 }>(sfis, name_step, ctx);
    let Some(w) = walk() else {
        return 0;
    };
    w.copies
}
