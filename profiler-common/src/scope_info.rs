//! Where a V8 ScopeInfo keeps a function's name: both sides find it alike, the eBPF programs
//! to copy the slots at a sample and userspace to read them (or check what was copied).
//!
//! A ScopeInfo is a map, then tagged slots: its flags (slot 0), counts (among them the
//! context locals', at the version's `context_local_count`), then, from the version's
//! `first_vars`, the context locals' names and infos, an optional saved class variable, the
//! function's name and its info, the inferred name, then the source positions.

/// V8 keeps the names of up to this many context locals in the ScopeInfo itself (more go to
/// a hash table, one slot).
pub const MAX_INLINED_LOCAL_NAMES: u64 = 75;

/// Deepest slot either side reads.
pub const MAX_SLOTS: u64 = 1024;

/// The flags of a ScopeInfo's slot 0: a Smi until V8 12 (its value in the upper half), a raw
/// 32-bit field since. The bits used (saved class variable 10, function variable 12-13,
/// inferred name 14) have not moved from V8 10 to 13.
#[inline(always)]
pub const fn flags(raw: u64) -> u32 {
    if raw != 0 && raw & 0xffff_ffff == 0 {
        (raw >> 32) as u32
    } else {
        raw as u32
    }
}

/// Whether the function has its own name (a function variable) in its ScopeInfo.
#[inline(always)]
pub const fn has_name(flags: u32) -> bool {
    (flags >> 12) & 3 != 0
}

/// Whether the ScopeInfo holds the name V8 inferred for the function.
#[inline(always)]
pub const fn has_inferred_name(flags: u32) -> bool {
    flags & (1 << 14) != 0
}

/// The slot after the context locals and the saved class variable, from `first_vars` (the
/// version's) with `count` context locals: the function's name if it has one (then its info),
/// else the inferred name if any, else the source positions.
#[inline(always)]
pub const fn name_slot(first_vars: u64, count: u64, flags: u32) -> u64 {
    let names = if count < MAX_INLINED_LOCAL_NAMES {
        count
    } else {
        1
    };
    let class_variable = if flags & (1 << 10) != 0 { 1 } else { 0 };
    first_vars + names + count + class_variable
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_read_from_a_smi_or_a_raw_field() {
        // V8 11: a Smi (value << 32); V8 12 on: the low 32 bits.
        assert_eq!(flags(0x5000 << 32), 0x5000);
        assert_eq!(flags(0x5000), 0x5000);
        assert_eq!(flags(0), 0);
        assert!(has_name(flags(1 << 12)) && !has_inferred_name(flags(1 << 12)));
        assert!(has_inferred_name(flags((1 << 14) << 32)) && !has_name(flags(1 << 14)));
    }

    #[test]
    fn the_name_follows_the_locals_and_the_class_variable() {
        // Three locals: three names and three infos.
        assert_eq!(name_slot(4, 3, 0), 10);
        // A saved class variable takes one slot more.
        assert_eq!(name_slot(4, 3, 1 << 10), 11);
        // 75 locals and more: their names are in one hash table.
        assert_eq!(name_slot(4, 74, 0), 4 + 74 + 74);
        assert_eq!(name_slot(4, 75, 0), 4 + 1 + 75);
    }
}
