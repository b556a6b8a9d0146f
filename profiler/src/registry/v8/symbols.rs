//! The `v8dbg_*` symbols (V8's postmortem metadata) and V8's version, read from the ELF file
//! that holds V8: the raw values `metadata` turns into a [`Layout`](super::metadata::Layout).
//! Apart because reading them is ELF work, done once per binary and fast only when each
//! symbol table is read whole.

use std::{collections::HashMap, path::Path};

use object::read::elf::{FileHeader, SectionHeader};

use super::metadata::LayoutError;

/// The symbols read from one binary: name -> value (the 32-bit integer each holds).
pub type Symbols = HashMap<String, i64>;

/// Reads every `v8dbg_*` symbol of `path` and V8's version.
pub fn read_symbols(path: &Path) -> Result<Symbols, LayoutError> {
    let file_name = path.display().to_string();
    let unreadable = |why: String| LayoutError::Unreadable {
        file: file_name.clone(),
        why,
    };
    let file = std::fs::File::open(path).map_err(|e| unreadable(e.to_string()))?;
    let data = object::ReadCache::new(file);
    let header = object::elf::FileHeader64::<object::Endianness>::parse(&data)
        .map_err(|e| unreadable(e.to_string()))?;
    let endian = header.endian().map_err(|e| unreadable(e.to_string()))?;
    let sections = header
        .sections(endian, &data)
        .map_err(|e| unreadable(e.to_string()))?;
    // Each symbol table and its strings are read whole (one read each): looking names up
    // one by one through the cache would take seconds for node's 100,000 symbols.
    let all: Vec<_> = sections.iter().collect();
    let mut out = Symbols::new();
    // The dynamic symbols first (node and libnode.so export V8's metadata), the full table
    // only if they lack it.
    for kind in [object::elf::SHT_DYNSYM, object::elf::SHT_SYMTAB] {
        if out.keys().any(|k| k.starts_with("v8dbg_")) {
            break;
        }
        let Some(table) = all.iter().find(|t| t.sh_type(endian) == kind) else {
            continue;
        };
        let (Ok(syms), Some(strtab)) = (
            table.data(endian, &data),
            all.get(table.sh_link(endian) as usize),
        ) else {
            continue;
        };
        let Ok(strs) = strtab.data(endian, &data) else {
            continue;
        };
        for sym in syms.chunks_exact(24) {
            let name_at = u32::from_le_bytes(sym[0..4].try_into().expect("4 bytes")) as usize;
            let shndx = u16::from_le_bytes(sym[6..8].try_into().expect("2 bytes")) as usize;
            let value = u64::from_le_bytes(sym[8..16].try_into().expect("8 bytes"));
            let Some(name) = strs
                .get(name_at..)
                .and_then(|n| n.split(|&b| b == 0).next())
            else {
                continue;
            };
            let wanted = name.starts_with(b"v8dbg_")
                || name.starts_with(b"_ZN2v88internal7Version6")
                    && [&b"major_E"[..], b"minor_E", b"build_E"]
                        .iter()
                        .any(|s| name.ends_with(s));
            if !wanted || shndx == 0 || shndx >= all.len() {
                continue;
            }
            let name = String::from_utf8_lossy(name).into_owned();
            if out.contains_key(&name) {
                continue;
            }
            let section = all[shndx];
            let start = section.sh_addr(endian);
            if value < start || value + 4 > start + section.sh_size(endian) {
                continue;
            }
            // Zero-initialised data (.bss) holds 0 (e.g. the map's offset in an object).
            let v = if section.sh_type(endian) == object::elf::SHT_NOBITS {
                0
            } else {
                let off = section.sh_offset(endian) + (value - start);
                use object::ReadRef;
                match data.read_bytes_at(off, 4) {
                    Ok(b) => i32::from_le_bytes(b.try_into().expect("4 bytes")) as i64,
                    Err(_) => continue,
                }
            };
            out.insert(name, v);
        }
    }
    if !out.keys().any(|k| k.starts_with("v8dbg_")) {
        return Err(LayoutError::NotV8(file_name));
    }
    Ok(out)
}

/// The version as `major.minor.build`.
pub fn version_of(syms: &Symbols) -> Option<(u32, u32, u32)> {
    let v = |n: &str| {
        syms.get(&format!("_ZN2v88internal7Version6{n}_E"))
            .and_then(|v| u32::try_from(*v).ok())
    };
    Some((v("major")?, v("minor")?, v("build")?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::v8::metadata::Layout;

    /// The node under test's own symbols (see `v8::tests::node`) give a layout.
    #[test]
    fn the_installed_node_has_a_layout() {
        let Some(path) = crate::registry::v8::tests::node() else {
            return;
        };
        let syms = read_symbols(&path).unwrap();
        let l = Layout::from_symbols(&syms, "node").unwrap();
        assert!(l.version.0 >= 10, "{l:?}");
    }
}
