//! Reading V8's heap through a [`Memory`]: tagged values, objects checked by their map's
//! instance type, and strings in their several representations. Every read is bounded and may
//! fail (the object moved, was collected, or its memory is gone): callers turn a failure into
//! "not named", never into a guess.

use std::cell::RefCell;
use std::collections::HashMap;

use super::memory::Memory;
use super::metadata::Layout;

/// Longest string read for a name (function or script).
const MAX_NAME: usize = 1024;
/// Longest script source read to find its line ends.
pub const MAX_SOURCE: usize = 32 << 20;
/// Deepest nesting of cons, thin and sliced strings followed.
const MAX_STRING_DEPTH: u32 = 16;

pub const HEAP_OBJECT_TAG: u64 = 1;

pub fn is_heap_object(v: u64) -> bool {
    v & 3 == HEAP_OBJECT_TAG
}

/// A Smi's value (x86_64 without pointer compression: the upper 32 bits).
pub fn smi(v: u64) -> Option<i32> {
    (v & 0xffff_ffff == 0).then_some((v >> 32) as i32)
}

/// The heap of one process, read through `mem` with `layout`, remembering each map's instance
/// type (maps are never moved while objects point at them; a map collected and another made at
/// its address would be another map of the same kind of object only by chance, and every
/// object is checked further by what points at it).
pub struct Heap<'a, M: Memory> {
    pub mem: M,
    pub layout: &'a Layout,
    map_types: &'a RefCell<HashMap<u64, u16>>,
}

impl<'a, M: Memory> Heap<'a, M> {
    pub fn new(mem: M, layout: &'a Layout, map_types: &'a RefCell<HashMap<u64, u16>>) -> Self {
        Heap {
            mem,
            layout,
            map_types,
        }
    }

    pub fn word(&self, addr: u64) -> Option<u64> {
        let mut b = [0u8; 8];
        self.mem.read(addr, &mut b).then(|| u64::from_le_bytes(b))
    }

    /// A field of the object `obj` (tagged) at `offset`; None if `obj` is no heap object.
    pub fn field(&self, obj: u64, offset: u64) -> Option<u64> {
        if !is_heap_object(obj) {
            return None;
        }
        self.word((obj - HEAP_OBJECT_TAG).checked_add(offset)?)
    }

    /// The instance type of the object `obj` (tagged pointer), from its map.
    pub fn instance_type(&self, obj: u64) -> Option<u16> {
        if !is_heap_object(obj) {
            return None;
        }
        let map = self.word(obj - HEAP_OBJECT_TAG)?;
        self.map_type(map)
    }

    /// The instance type a map describes.
    pub fn map_type(&self, map: u64) -> Option<u16> {
        if !is_heap_object(map) {
            return None;
        }
        if let Some(t) = self.map_types.borrow().get(&map) {
            return Some(*t);
        }
        let mut b = [0u8; 2];
        if !self.mem.read_map(
            (map - HEAP_OBJECT_TAG).wrapping_add(self.layout.map_instance_type),
            &mut b,
        ) {
            return None;
        }
        let t = u16::from_le_bytes(b);
        self.map_types.borrow_mut().insert(map, t);
        Some(t)
    }

    /// `obj` if it is a heap object of type `ty`.
    pub fn typed(&self, obj: u64, ty: u16) -> Option<u64> {
        (self.instance_type(obj)? == ty).then_some(obj)
    }

    /// A string's contents (at most `max` UTF-16 code units), following its representation.
    pub fn string(&self, s: u64, max: usize) -> Option<String> {
        Some(String::from_utf16_lossy(&self.units(s, max)?))
    }

    /// A short name (function, script).
    pub fn name(&self, s: u64) -> Option<String> {
        self.string(s, MAX_NAME)
    }

    /// A string's UTF-16 code units (positions in a script's source count these), at most `max`.
    pub fn units(&self, s: u64, max: usize) -> Option<Vec<u16>> {
        let mut out = Vec::new();
        self.units_into(s, 0, usize::MAX, max, &mut out, MAX_STRING_DEPTH)?;
        Some(out)
    }

    /// A string's length in UTF-16 code units (None: not a string, or unreadable).
    pub fn string_length(&self, s: u64) -> Option<usize> {
        let sl = &self.layout.strings;
        if self.instance_type(s)? >= sl.first_nonstring_type {
            return None;
        }
        Some(self.field(s, sl.length)? as u32 as usize)
    }

    /// The code units `[from, from + count)` of string `s` (fewer past its end).
    pub fn units_range(&self, s: u64, from: usize, count: usize) -> Option<Vec<u16>> {
        let mut out = Vec::new();
        self.units_into(s, from, count, count, &mut out, MAX_STRING_DEPTH)?;
        Some(out)
    }

    /// Appends the code units `[from, from + count)` of string `s` to `out`.
    fn units_into(
        &self,
        s: u64,
        from: usize,
        count: usize,
        max: usize,
        out: &mut Vec<u16>,
        depth: u32,
    ) -> Option<()> {
        let sl = &self.layout.strings;
        let ty = self.instance_type(s)?;
        if depth == 0 || ty >= sl.first_nonstring_type {
            return None;
        }
        let len = self.field(s, sl.length)? as u32 as usize;
        if from > len {
            return None;
        }
        let count = count.min(len - from);
        if out.len() + count > max {
            return None;
        }
        let one_byte = ty & sl.encoding_mask == sl.one_byte_tag;
        let repr = ty & sl.representation_mask;
        let chars = |start: u64, out: &mut Vec<u16>| -> Option<()> {
            if one_byte {
                let mut b = vec![0u8; count];
                if !self.mem.read(start.wrapping_add(from as u64), &mut b) {
                    return None;
                }
                out.extend(b.iter().map(|&c| u16::from(c)));
            } else {
                let mut b = vec![0u8; count * 2];
                if !self.mem.read(start.wrapping_add(2 * from as u64), &mut b) {
                    return None;
                }
                out.extend(b.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])));
            }
            Some(())
        };
        let base = s - HEAP_OBJECT_TAG;
        if repr == sl.seq_tag {
            let off = if one_byte {
                sl.seq_one_byte_chars
            } else {
                sl.seq_two_byte_chars
            };
            chars(base.wrapping_add(off), out)
        } else if repr == sl.cons_tag {
            let first = self.field(s, sl.cons_first)?;
            let second = self.field(s, sl.cons_second)?;
            let first_len = self.field(first, sl.length)? as u32 as usize;
            if from < first_len {
                let n = count.min(first_len - from);
                self.units_into(first, from, n, max, out, depth - 1)?;
                if n < count {
                    self.units_into(second, 0, count - n, max, out, depth - 1)?;
                }
                Some(())
            } else {
                self.units_into(second, from - first_len, count, max, out, depth - 1)
            }
        } else if repr == sl.thin_tag {
            let actual = self.field(s, sl.thin_actual)?;
            self.units_into(actual, from, count, max, out, depth - 1)
        } else if repr == sl.sliced_tag {
            let parent = self.field(s, sl.sliced_parent)?;
            let offset = usize::try_from(smi(self.field(s, sl.sliced_offset)?)?).ok()?;
            self.units_into(parent, from + offset, count, max, out, depth - 1)
        } else if repr == sl.external_tag {
            // The resource's data pointer, cached right after the resource pointer (V8 does
            // not cache it for "uncached" external strings, which are not read).
            let data = self.field(s, sl.external_resource + 8)?;
            if data == 0 {
                return None;
            }
            chars(data, out)
        } else {
            None
        }
    }

    /// The elements of a FixedArray of Smis (e.g. a script's line ends), at most `max`.
    pub fn smi_array(&self, arr: u64, max: usize) -> Option<Vec<i32>> {
        let l = self.layout;
        let len = usize::try_from(smi(self.field(arr, l.fixed_array_length)?)?).ok()?;
        if len > max {
            return None;
        }
        let mut b = vec![0u8; len * 8];
        if !self.mem.read(
            (arr - HEAP_OBJECT_TAG).wrapping_add(l.fixed_array_data),
            &mut b,
        ) {
            return None;
        }
        b.chunks_exact(8)
            .map(|c| smi(u64::from_le_bytes(c.try_into().expect("8 bytes"))))
            .collect()
    }
}
