//! The objects of a batch's V8 frames as the eBPF side copied them at the samples: by
//! address for the frames' checks, and each sample's apart, so that a function whose name,
//! Script and Script's name one sample copied is named from that one snapshot of the heap.

use std::collections::{BTreeMap, HashMap};

use profiler_common::{V8_COPY_BYTES, V8Copy};

use super::memory::Memory;

/// Objects of V8 frames as the eBPF side copied them at the samples of a batch
/// (`profiler_common::V8Copy`: the first [`V8_COPY_BYTES`] of each), by address. Where two
/// samples copied one object, the later copy is kept: as a read at the batch's end would,
/// every frame of the batch is checked against one version of each object. Each sample's
/// copies are also kept apart ([`Copies::at_sample`]): what naming a function reads, when
/// one sample copied all of it, is one snapshot of the heap.
#[derive(Default)]
pub struct Copies {
    objects: HashMap<u64, [u8; V8_COPY_BYTES]>,
    samples: Vec<BTreeMap<u64, [u8; V8_COPY_BYTES]>>,
    /// The last sample that copied an address.
    last: HashMap<u64, usize>,
}

impl Copies {
    /// Adds the copies at the end of a sample's record (whole [`V8Copy`]s, in order).
    pub fn add(&mut self, records: &[u8]) {
        let n = self.samples.len();
        let mut sample = BTreeMap::new();
        for c in records.chunks_exact(size_of::<V8Copy>()) {
            let c: V8Copy = bytemuck::pod_read_unaligned(c);
            self.objects.insert(c.addr, c.bytes);
            self.last.insert(c.addr, n);
            sample.insert(c.addr, c.bytes);
        }
        self.samples.push(sample);
    }

    /// The first `len` bytes of the object at `addr`, if it was copied that far.
    pub fn get(&self, addr: u64, len: usize) -> Option<&[u8]> {
        self.objects.get(&addr)?.get(..len)
    }

    /// The copies of the last sample that copied `addr`, as a memory (nothing else read).
    pub(super) fn at_sample<'a, M: Memory>(
        &'a self,
        addr: u64,
        maps: &'a M,
    ) -> Option<AtSample<'a, M>> {
        let sample = self.samples.get(*self.last.get(&addr)?)?;
        Some(AtSample { sample, maps })
    }
}

/// One sample's copies, as a memory: a read is served from them (across consecutive copies)
/// or fails; only maps' fields are read from `maps` (maps do not move).
pub(super) struct AtSample<'a, M: Memory> {
    sample: &'a BTreeMap<u64, [u8; V8_COPY_BYTES]>,
    maps: &'a M,
}

impl<M: Memory> Memory for AtSample<'_, M> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
        let mut done = 0;
        while done < buf.len() {
            let at = addr.wrapping_add(done as u64);
            let Some((start, bytes)) = (self.sample.range(..=at).rev().take(4))
                .find(|(s, _)| at - **s < V8_COPY_BYTES as u64)
            else {
                return false;
            };
            let o = (at - start) as usize;
            let n = (V8_COPY_BYTES - o).min(buf.len() - done);
            buf[done..done + n].copy_from_slice(&bytes[o..o + n]);
            done += n;
        }
        true
    }

    fn read_map(&self, addr: u64, buf: &mut [u8]) -> bool {
        self.maps.read_map(addr, buf)
    }
}

/// A function's name and its Script's fields as one sample's copies held them (see
/// `checks::recheck_copied_sfis`).
#[derive(Clone, Debug)]
pub(super) struct NamedAtSample {
    /// The SharedFunctionInfo's name-or-scope-info and script fields.
    pub(super) fields: (u64, u64),
    pub(super) name: String,
    pub(super) start: Option<i32>,
    /// The Script's name and source fields, and its name if copied whole; None when the
    /// field holds no Script.
    pub(super) script: Option<((u64, u64), Option<String>)>,
    /// For node's own modules, where the source lies (`Heap::external_source`), as copied.
    pub(super) builtin: Option<(u64, usize, bool)>,
}
