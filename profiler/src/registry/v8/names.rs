//! A JavaScript function's name and where it is defined, read from its SharedFunctionInfo as
//! V8 itself writes them into its perf map: `name script:line:column`, the name being the
//! function's own (or, for an anonymous function, the one V8 inferred, e.g. `obj.method`) and
//! the position its definition's start (line and column from 1), so that both sources name a
//! function alike.

use profiler_common::scope_info;

use super::heap::{Heap, MAX_SOURCE, is_heap_object, smi};
use super::memory::Memory;

/// What a function's ScopeInfo says about it.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ScopeNames {
    pub name: Option<String>,
    pub inferred: Option<String>,
    pub start: Option<i32>,
}

impl<M: Memory> Heap<'_, M> {
    fn slot(&self, scope_info: u64, i: u64) -> Option<u64> {
        // Its variable part is skipped by counts, not read.
        if i >= scope_info::MAX_SLOTS {
            return None;
        }
        self.field(scope_info, 8 + 8 * i)
    }

    /// A function's name, inferred name and start position from its ScopeInfo (its slots
    /// found as the eBPF side finds them to copy: `profiler_common::scope_info`).
    pub fn scope_names(&self, si: u64) -> Option<ScopeNames> {
        let sil = &self.layout.scope_info;
        let flags = scope_info::flags(self.slot(si, 0)?);
        let count = u64::try_from(smi(self.slot(si, sil.context_local_count)?)?).ok()?;
        let mut idx = scope_info::name_slot(sil.first_vars, count, flags);
        let mut out = ScopeNames::default();
        if scope_info::has_name(flags) {
            out.name = self.optional_string(self.slot(si, idx)?)?;
            idx += 2;
        }
        if scope_info::has_inferred_name(flags) {
            out.inferred = self.optional_string(self.slot(si, idx)?)?;
            idx += 1;
        }
        let position = if sil.fixed_position_info {
            sil.context_local_count + 1
        } else {
            idx
        };
        let (start, end) = (
            smi(self.slot(si, position)?),
            smi(self.slot(si, position + 1)?),
        );
        out.start = match (start, end) {
            (Some(s), Some(e)) if 0 <= s && s <= e => Some(s),
            _ => None,
        };
        Some(out)
    }

    /// A slot that holds a name or nothing: Some(None) for no name (a Smi, another object,
    /// an empty string), None if it cannot be told: an object whose map or characters cannot
    /// be read (gone since, as when a Worker's isolate has ended) is not taken for no name.
    fn optional_string(&self, v: u64) -> Option<Option<String>> {
        if !is_heap_object(v) {
            return Some(None);
        }
        if self.instance_type(v)? >= self.layout.strings.first_nonstring_type {
            return Some(None);
        }
        Some(Some(self.name(v)?).filter(|n| !n.is_empty()))
    }

    /// The function's name as V8 prints it (its own, else the inferred one, else none) and
    /// its start position, from a SharedFunctionInfo (already checked to be one).
    pub fn sfi_name(&self, sfi: u64) -> Option<(String, Option<i32>)> {
        let l = self.layout;
        let nosi = self.field(sfi, l.sfi_name_or_scope_info)?;
        let ty = self.instance_type(nosi);
        if ty == Some(l.scope_info_type) {
            let s = self.scope_names(nosi)?;
            let name = s.name.or(s.inferred).unwrap_or_default();
            Some((name, s.start))
        } else if ty.is_some_and(|t| t < l.strings.first_nonstring_type) {
            Some((self.name(nosi)?, None))
        } else if !is_heap_object(nosi) {
            // No name (V8's sentinel, a Smi) and no scope info.
            Some((String::new(), None))
        } else {
            // Another object, or none readable: not what the SharedFunctionInfo held (moved
            // or gone since), so no name rather than an anonymous one.
            None
        }
    }

    /// A script's name: its file or URL, empty for an unnamed one (None if it cannot be
    /// told, as `optional_string` says).
    pub fn script_name(&self, script: u64) -> Option<String> {
        let name = self.field(script, self.layout.script_name)?;
        Some(self.optional_string(name)?.unwrap_or_default())
    }

    /// What a script's line ends (the position of each line's last character, as V8 computes
    /// them) come from: the script itself when V8 has computed them, else its source.
    pub fn script_line_ends(&self, script: u64) -> Option<LineEndsFrom> {
        let l = self.layout;
        let ends = self.field(script, l.script_line_ends)?;
        match self.typed(ends, l.fixed_array_type) {
            Some(arr) => Some(LineEndsFrom::Computed(self.smi_array(arr, 1 << 22)?)),
            None => {
                let string = self.field(script, l.script_source)?;
                let len = self.string_length(string)?;
                Some(LineEndsFrom::Source { string, len })
            }
        }
    }

    /// A script's line ends, its source read whole if V8 has not computed them.
    pub fn read_line_ends(&self, script: u64) -> Option<Vec<i32>> {
        match self.script_line_ends(script)? {
            LineEndsFrom::Computed(ends) => Some(ends),
            LineEndsFrom::Source { string, .. } => {
                Some(line_ends(&self.units(string, MAX_SOURCE)?))
            }
        }
    }

    /// Where a script's source lies when V8 keeps it outside its heap (an external string,
    /// its data cached): (address, length, one byte per character).
    pub fn external_source(&self, script: u64) -> Option<(u64, usize, bool)> {
        let sl = &self.layout.strings;
        let source = self.field(script, self.layout.script_source)?;
        let ty = self.instance_type(source)?;
        if ty >= sl.first_nonstring_type || ty & sl.representation_mask != sl.external_tag {
            return None;
        }
        let len = self.field(source, sl.length)? as u32 as usize;
        let data = self.field(source, sl.external_resource + 8)?;
        (data != 0).then_some((data, len, ty & sl.encoding_mask == sl.one_byte_tag))
    }
}

/// Where a script's line ends come from.
#[derive(Debug, PartialEq, Eq)]
pub enum LineEndsFrom {
    /// V8 computed them (read from the Script).
    Computed(Vec<i32>),
    /// Its source string, `len` UTF-16 code units long.
    Source { string: u64, len: usize },
}

/// V8's line ends of a source: each line terminator's position (`\r\n` counts at its `\n`),
/// and one past the end.
pub fn line_ends(src: &[u16]) -> Vec<i32> {
    let mut ends = Vec::new();
    for (i, &c) in src.iter().enumerate() {
        let terminator = match c {
            0x0d => src.get(i + 1) != Some(&0x0a),
            0x0a | 0x2028 | 0x2029 => true,
            _ => false,
        };
        if terminator {
            ends.push(i as i32);
        }
    }
    ends.push(src.len() as i32);
    ends
}

/// Line and column (from 1) of a position, as V8's perf map writes them.
pub fn line_column(ends: &[i32], pos: i32) -> Option<(usize, usize)> {
    let line = ends.partition_point(|&e| e < pos);
    if line >= ends.len() {
        return None;
    }
    let line_start = if line == 0 { 0 } else { ends[line - 1] + 1 };
    Some((line + 1, (pos - line_start) as usize + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn units(s: &str) -> Vec<u16> {
        s.encode_utf16().collect()
    }

    #[test]
    fn lines_and_columns_count_as_v8_does() {
        let src = units("'use strict';\nfunction hotAllocator(n) {\r\n  return n;\r}\n");
        let ends = line_ends(&src);
        // \n at 13, \r\n counts at its \n, a lone \r counts, then one past the end.
        assert_eq!(ends, vec![13, 41, 53, 55, 56]);
        // The `(` of hotAllocator's parameters: line 2, column 22.
        let pos = 14 + "function hotAllocator".len() as i32;
        assert_eq!(line_column(&ends, pos), Some((2, 22)));
        assert_eq!(line_column(&ends, 0), Some((1, 1)));
        assert_eq!(line_column(&ends, 999), None);
        assert_eq!(line_ends(&[]), vec![0]);
    }
}
