//! `BPF_MAP_LOOKUP_BATCH`, which aya does not wrap: a thousand entries per syscall instead
//! of two syscalls per entry.

use std::{
    io,
    os::fd::{AsFd, AsRawFd},
};

use aya::{
    Pod,
    maps::{HashMap as BpfHashMap, IterableMap, MapData},
};

/// Entries per syscall.
pub const CHUNK: usize = 1024;
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;

/// The `batch` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Reused between readings.
pub struct Buffers<K, V> {
    keys: Vec<K>,
    values: Vec<V>,
    pairs: Vec<(K, V)>,
}

impl<K, V> Default for Buffers<K, V> {
    fn default() -> Self {
        Buffers {
            keys: Vec::new(),
            values: Vec::new(),
            pairs: Vec::new(),
        }
    }
}

/// Hands every entry of the hash map `map` to `f`, a batch at a time (EINVAL: the kernel
/// cannot, before Linux 5.6).
pub fn read_all<K: Pod, V: Pod>(
    map: &BpfHashMap<MapData, K, V>,
    buf: &mut Buffers<K, V>,
    f: &mut impl FnMut(&[(K, V)]),
) -> io::Result<()> {
    let fd = map.map().fd().as_fd().as_raw_fd();
    // For hash maps the batch cursor is a bucket index.
    let (mut cursor, mut next) = (0u32, 0u32);
    let mut first = true;
    let mut chunk = CHUNK;
    loop {
        buf.keys.clear();
        buf.values.clear();
        buf.keys.reserve(chunk);
        buf.values.reserve(chunk);
        let mut attr = BatchAttr {
            in_batch: if first {
                0
            } else {
                &cursor as *const u32 as u64
            },
            out_batch: &mut next as *mut u32 as u64,
            keys: buf.keys.as_mut_ptr() as u64,
            values: buf.values.as_mut_ptr() as u64,
            count: chunk as u32,
            map_fd: fd as u32,
            ..Default::default()
        };
        // SAFETY: the key and value buffers have room for `count` elements each, the
        // cursors outlive the call, and the kernel writes at most `count` elements.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_BATCH,
                &mut attr as *mut BatchAttr,
                std::mem::size_of::<BatchAttr>(),
            )
        };
        let err = (ret < 0).then(io::Error::last_os_error);
        let n = (attr.count as usize).min(chunk);
        // SAFETY: the kernel filled the first `n` elements of both buffers.
        unsafe {
            buf.keys.set_len(n);
            buf.values.set_len(n);
        }
        match err {
            // A bucket holds more entries than fit: retry it with more room.
            Some(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                chunk *= 2;
                continue;
            }
            Some(e) if e.raw_os_error() != Some(libc::ENOENT) => return Err(e),
            _ => {}
        }
        buf.pairs.clear();
        buf.pairs
            .extend(buf.keys.iter().copied().zip(buf.values.iter().copied()));
        f(&buf.pairs);
        // ENOENT: that was the last batch.
        if err.is_some() {
            return Ok(());
        }
        cursor = next;
        first = false;
    }
}
