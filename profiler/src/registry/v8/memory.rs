//! Another process's memory, read from outside (`process_vm_readv`: no ptrace stop) in as
//! few system calls as nearby objects allow, and a batch's reads served from what it already
//! read. Apart from the heap's objects because it knows nothing of V8 but its chunk size:
//! tests put a heap of their own making behind the same [`Memory`] trait.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use crate::registry::reads::Reads;

/// Memory of one process (a trait so that tests can give a heap of their own making).
pub trait Memory {
    /// Fills `buf` from `addr`; false if any byte could not be read.
    fn read(&self, addr: u64, buf: &mut [u8]) -> bool;

    /// The size of the pages reads can be served from, once read whole (None: read each as
    /// asked, as a heap of a test's making wants).
    fn page_size(&self) -> Option<usize> {
        None
    }

    /// A read of a map's field (maps do not move: a view of copies taken at a sample, which
    /// holds no maps, reads them from the memory itself).
    fn read_map(&self, addr: u64, buf: &mut [u8]) -> bool {
        self.read(addr, buf)
    }

    /// Several reads (for a process, in one system call): whether each was done.
    fn read_many(&self, reqs: &mut [(u64, Vec<u8>)]) -> Vec<bool> {
        reqs.iter_mut().map(|(a, b)| self.read(*a, b)).collect()
    }
}

impl<T: Memory> Memory for &T {
    fn page_size(&self) -> Option<usize> {
        (**self).page_size()
    }

    fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
        (**self).read(addr, buf)
    }

    fn read_map(&self, addr: u64, buf: &mut [u8]) -> bool {
        (**self).read_map(addr, buf)
    }

    fn read_many(&self, reqs: &mut [(u64, Vec<u8>)]) -> Vec<bool> {
        (**self).read_many(reqs)
    }
}

/// Reads served from blocks read beforehand (`read_many`, sorted by address), else from
/// pages read whole and kept for the batch (when the memory has pages, see
/// [`Memory::page_size`]), else from the memory itself: naming a batch's frames reads each
/// object's header in two calls, and each page of its other fields (an interpreter's data, a
/// closure's contexts, a SharedFunctionInfo's name) once, however many frames need them.
pub struct Prefetched<'a, M: Memory> {
    pub mem: &'a M,
    pub blocks: &'a RefCell<Vec<(u64, Vec<u8>)>>,
    /// Pages read whole (None: unreadable), by address.
    pub pages: &'a RefCell<HashMap<u64, Option<Box<[u8]>>>>,
}

/// Longest read served from whole pages (names and sources are read as they are).
const MAX_PAGED_READ: usize = 256;

impl<M: Memory> Prefetched<'_, M> {
    /// `buf` from the pages kept (reading those missing); None when the memory has no pages
    /// or the read is too long for them.
    fn read_paged(&self, addr: u64, buf: &mut [u8]) -> Option<bool> {
        let size = self.mem.page_size()? as u64;
        if buf.len() > MAX_PAGED_READ || buf.is_empty() {
            return None;
        }
        let end = addr.checked_add(buf.len() as u64)?;
        let mut pages = self.pages.borrow_mut();
        let mut at = addr;
        while at < end {
            let page = at - at % size;
            let bytes = pages.entry(page).or_insert_with(|| {
                let mut b = vec![0u8; size as usize].into_boxed_slice();
                self.mem.read(page, &mut b).then_some(b)
            });
            let Some(bytes) = bytes else {
                return Some(false);
            };
            let upto = end.min(page + size);
            let o = (at - addr) as usize;
            let n = (upto - at) as usize;
            buf[o..o + n].copy_from_slice(&bytes[(at - page) as usize..(at - page) as usize + n]);
            at = upto;
        }
        Some(true)
    }
}

impl<M: Memory> Memory for Prefetched<'_, M> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
        let end = addr.saturating_add(buf.len() as u64);
        {
            let blocks = self.blocks.borrow();
            // The blocks starting at or before `addr`, nearest first (a few: they rarely
            // overlap).
            let after = blocks.partition_point(|(start, _)| *start <= addr);
            for (start, bytes) in blocks[..after].iter().rev().take(4) {
                if end <= start + bytes.len() as u64 {
                    let o = (addr - start) as usize;
                    buf.copy_from_slice(&bytes[o..o + buf.len()]);
                    return true;
                }
            }
        }
        match self.read_paged(addr, buf) {
            Some(read) => read,
            None => self.mem.read(addr, buf),
        }
    }

    fn read_many(&self, reqs: &mut [(u64, Vec<u8>)]) -> Vec<bool> {
        self.mem.read_many(reqs)
    }
}

/// Another process's memory, through `process_vm_readv` (no ptrace stop; needs the right to
/// ptrace it, which root has). The kernel takes the target's `mmap_lock` once per remote
/// range, so [`read_many`](Memory::read_many) reads nearby objects as one range. Counts its
/// calls and the ranges they went through, for the report (`registry::reads`).
pub struct ProcessMemory {
    pub pid: u32,
    calls: Cell<u64>,
    ranges: Cell<u64>,
}

/// V8 allocates its heap in aligned chunks of this size (a `MemoryChunk`), wholly mapped:
/// two objects in one chunk can be read as one range.
const V8_CHUNK: u64 = 256 << 10;
/// Longest range read for several objects (more would copy more than it saves).
const MAX_SPAN: u64 = 64 << 10;
/// Most ranges per system call (the kernel's UIO_MAXIOV).
const MAX_IOV: usize = 1024;

/// Ranges covering the requests: `(start, len, requests)`, nearby requests (in one V8 chunk,
/// within [`MAX_SPAN`]) merged.
fn spans(reqs: &[(u64, Vec<u8>)]) -> Vec<(u64, u64, Vec<usize>)> {
    let mut order: Vec<usize> = (0..reqs.len()).filter(|&i| !reqs[i].1.is_empty()).collect();
    order.sort_unstable_by_key(|&i| reqs[i].0);
    let mut out: Vec<(u64, u64, Vec<usize>)> = Vec::new();
    for i in order {
        let start = reqs[i].0;
        let end = start.saturating_add(reqs[i].1.len() as u64);
        match out.last_mut() {
            Some((s, e, members))
                if start / V8_CHUNK == *s / V8_CHUNK
                    && (end - 1) / V8_CHUNK == *s / V8_CHUNK
                    && end.max(*e) - *s <= MAX_SPAN =>
            {
                *e = end.max(*e);
                members.push(i);
            }
            _ => out.push((start, end, vec![i])),
        }
    }
    out.into_iter().map(|(s, e, m)| (s, e - s, m)).collect()
}

impl ProcessMemory {
    pub fn new(pid: u32) -> Self {
        ProcessMemory {
            pid,
            calls: Cell::new(0),
            ranges: Cell::new(0),
        }
    }

    /// Its `process_vm_readv` calls so far (`memory`), and the ranges they went through
    /// (`memory_ranges`: those read whole, and the one a call stopped at).
    pub fn reads(&self) -> Reads {
        Reads {
            memory: self.calls.get(),
            memory_ranges: self.ranges.get(),
            ..Reads::default()
        }
    }

    fn count(&self, ranges: usize) {
        self.calls.set(self.calls.get() + 1);
        self.ranges.set(self.ranges.get() + ranges as u64);
    }

    /// Reads `ranges` (address, buffer) in as few calls as the kernel allows: whether each
    /// was read whole. A call stops at the first range it cannot read; the next call starts
    /// after it.
    fn read_ranges(&self, ranges: &mut [(u64, Vec<u8>)]) -> Vec<bool> {
        let mut ok = vec![false; ranges.len()];
        let mut next = 0;
        let total = ranges.len();
        while next < total {
            let batch = &mut ranges[next..(next + MAX_IOV).min(total)];
            let local: Vec<libc::iovec> = batch
                .iter_mut()
                .map(|(_, b)| libc::iovec {
                    iov_base: b.as_mut_ptr().cast(),
                    iov_len: b.len(),
                })
                .collect();
            let remote: Vec<libc::iovec> = batch
                .iter()
                .map(|(a, b)| libc::iovec {
                    iov_base: *a as *mut libc::c_void,
                    iov_len: b.len(),
                })
                .collect();
            // SAFETY: each local iovec covers its own buffer, which outlives the call; the
            // kernel checks the remote ranges and stops short instead of faulting.
            let n = unsafe { crate::kernel::vmread::process_vm_readv(self.pid, &local, &remote) };
            let mut done = n.max(0) as usize;
            let mut whole = 0;
            for (_, b) in batch.iter() {
                if done < b.len() {
                    break;
                }
                done -= b.len();
                whole += 1;
            }
            ok[next..next + whole].fill(true);
            self.count((whole + 1).min(batch.len()));
            // The range it stopped at failed (or the call did): go on after it.
            next += whole + 1;
        }
        ok
    }
}

impl Memory for ProcessMemory {
    fn page_size(&self) -> Option<usize> {
        Some(4096)
    }

    fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
        if buf.is_empty() {
            return true;
        }
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let remote = libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: buf.len(),
        };
        // SAFETY: the local iovec covers `buf`, which outlives the call; the kernel checks the
        // remote range and fails (EFAULT) or stops short instead of faulting.
        let n = unsafe { crate::kernel::vmread::process_vm_readv(self.pid, &[local], &[remote]) };
        self.count(1);
        n == buf.len() as isize
    }

    fn read_many(&self, reqs: &mut [(u64, Vec<u8>)]) -> Vec<bool> {
        let spans = spans(reqs);
        let mut ranges: Vec<(u64, Vec<u8>)> = spans
            .iter()
            .map(|(start, len, _)| (*start, vec![0u8; *len as usize]))
            .collect();
        let read = self.read_ranges(&mut ranges);
        let mut ok: Vec<bool> = reqs.iter().map(|(_, b)| b.is_empty()).collect();
        let mut retry: Vec<usize> = Vec::new();
        for ((start, _, members), ((_, bytes), read)) in spans.iter().zip(ranges.iter().zip(read)) {
            for &i in members {
                if read {
                    let o = (reqs[i].0 - start) as usize;
                    let n = reqs[i].1.len();
                    reqs[i].1.copy_from_slice(&bytes[o..o + n]);
                    ok[i] = true;
                } else if members.len() > 1 {
                    // Something between the objects was not readable: each on its own.
                    retry.push(i);
                }
            }
        }
        if !retry.is_empty() {
            let mut alone: Vec<(u64, Vec<u8>)> = retry
                .iter()
                .map(|&i| (reqs[i].0, vec![0u8; reqs[i].1.len()]))
                .collect();
            let read = self.read_ranges(&mut alone);
            for ((&i, (_, bytes)), read) in retry.iter().zip(&alone).zip(read) {
                if read {
                    reqs[i].1.copy_from_slice(bytes);
                    ok[i] = true;
                }
            }
        }
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reading another process's memory in ranges: nearby objects in one range, each request
    /// given its own bytes, an unreadable one failing alone (here: our own memory, and a page
    /// made unreadable between two objects of one "chunk").
    #[test]
    fn process_memory_reads_many_ranges_each_whole_or_not_at_all() {
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
        let mem = ProcessMemory::new(std::process::id());
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
        // Two ranges (0x10 alone; the chunk's objects, across the unreadable page) in a call
        // that stops at the first, the second in a call of its own; then the chunk's four
        // objects alone: a call that stops at the unreadable one (three ranges), and one for
        // the last.
        let r = mem.reads();
        assert_eq!((r.memory, r.memory_ranges), (4, 6));
        // SAFETY: the mapping made above.
        unsafe { libc::munmap(base, len) };
    }
}
