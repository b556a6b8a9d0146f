//! What naming a frame's function reads, copied at the sample after its frames' objects: for
//! each SharedFunctionInfo copied, its ScopeInfo's name slots (or its name, a String), the
//! name and inferred name, its Script, the Script's source head and name. Userspace names the
//! function from one sample's copies then, instead of reading them from the process later.

use core::ffi::c_void;

use profiler_common::{MAX_V8_COPIES, scope_info};

use super::*;

/// Most copies one function's name takes: its ScopeInfo, the ScopeInfo's name slots, the
/// name and inferred name (each up to `STRING_CHUNKS` copies), its Script and the Script's
/// name.
const NAME_COPIES: u32 = 2 + 3 * STRING_CHUNKS + 2;
/// A string is copied in up to this many consecutive copies (its header and 200 one-byte
/// characters).
const STRING_CHUNKS: u32 = 3;

impl Walk {
    /// Copies the string at the tagged pointer `p`: its header and as many of its one-byte
    /// characters as [`STRING_CHUNKS`] copies hold (a longer one, or a two-byte one, is read
    /// by userspace as before).
    #[inline(always)]
    fn copy_string(&mut self, p: u64) {
        let Some(k) = self.copy(p) else {
            return;
        };
        let off = self.l.string_length;
        let Some(w) = self.copied(k, off) else {
            return;
        };
        let len = (w >> ((off & 7) * 8)) as u32 as u64;
        let need = self.l.string_chars as u64 + len;
        let chunk = V8_COPY_BYTES as u64;
        if need > chunk {
            self.copy_at(p - 1 + chunk);
        }
        if need > 2 * chunk {
            self.copy_at(p - 1 + 2 * chunk);
        }
    }

    /// Copies what naming the function of the SharedFunctionInfo copied as copy `k` reads:
    /// its Script and the Script's name (unless the last one copied was that Script), and
    /// its name: a String, or a ScopeInfo with the slots of its name and inferred name, as
    /// `names.rs` finds them, and those strings.
    #[inline(always)]
    fn copy_names(&mut self, k: u32) {
        if let Some(script) = self.copied(k, self.l.sfi_script)
            && script != self.last_script
        {
            self.last_script = script;
            if let Some(ks) = self.copy(script) {
                // The source's head: for node's own modules an external string, whose data
                // (static, in node's binary) keys line ends read once per process.
                if let Some(source) = self.copied(ks, self.l.script_source) {
                    self.copy(source);
                }
                if let Some(name) = self.copied(ks, self.l.script_name) {
                    self.copy_string(name);
                }
            }
        }
        let Some(nosi) = self.copied(k, self.l.sfi_name_or_scope_info) else {
            return;
        };
        if !is_heap_object(nosi) {
            return;
        }
        // The ScopeInfo's (or String's) head, then its type: a String is the name itself.
        let Some(kn) = self.copy(nosi) else {
            return;
        };
        if self.type_of(kn) != Some(self.l.scope_info_type as u16) {
            let off = self.l.string_length;
            if let Some(w) = self.copied(kn, off) {
                let len = (w >> ((off & 7) * 8)) as u32 as u64;
                let chunk = V8_COPY_BYTES as u64;
                if self.l.string_chars as u64 + len > chunk {
                    self.copy_at(nosi - 1 + chunk);
                }
            }
            return;
        }
        // Slots are tagged words after the map: slot i at 8 + 8 * i, within the head copy.
        if self.l.scope_context_local_count > 6 {
            return;
        }
        let (Some(raw), Some(count)) = (
            self.copied(kn, 8),
            self.copied(kn, 8 + 8 * self.l.scope_context_local_count),
        ) else {
            return;
        };
        // The slots found as userspace reads them (`profiler_common::scope_info`).
        let flags = scope_info::flags(raw);
        if count & 0xffff_ffff != 0 || (count >> 63) != 0 {
            return;
        }
        let idx = scope_info::name_slot(self.l.scope_first_vars as u64, count >> 32, flags);
        if idx >= scope_info::MAX_SLOTS {
            return;
        }
        let has_name = scope_info::has_name(flags);
        let has_inferred = scope_info::has_inferred_name(flags);
        // The name, the slot after it, the inferred name and the positions after them (the
        // positions alone for an unnamed function).
        let Some(kw) = self.copy_at(nosi - 1 + 8 + 8 * idx) else {
            return;
        };
        if has_name && let Some(p) = self.copied(kw, 0) {
            self.copy_string(p);
        }
        if has_inferred && let Some(p) = self.copied(kw, if has_name { 16 } else { 0 }) {
            self.copy_string(p);
        }
    }
}

/// Copies what naming the `i`th SharedFunctionInfo copied reads (a `for_each` callback;
/// returns non-zero to stop).
pub(super) extern "C" fn name_step(i: u64, _ctx: *mut c_void) -> i64 {
    let Some(w) = walk() else {
        return 1;
    };
    if i >= w.sfis as u64 || w.copies + NAME_COPIES > MAX_V8_COPIES as u32 {
        return 1;
    }
    let k = w.sfi_copies[bounded(i as usize) & (MAX_SFIS - 1)];
    w.copy_names(k);
    0
}

