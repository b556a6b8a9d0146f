//! Naming unwound frames: blazesym on the files as mapped (by file offset, so a process that
//! has exited can still be named), V8's perf map for JIT code.

use std::collections::HashMap;
use std::path::PathBuf;

use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{Input, Symbolized};

use super::{FileKey, Frame, ModuleKey, ProcessUnwinder, debugfile};
use crate::registry::perfmap::{JitName, PerfMap};

/// Most names cached (emptied rather than grown past it).
const MAX_SYMBOLS: usize = 1 << 18;

/// Least time between two reads of a process's perf map (or looks for one).
pub(super) const PERF_MAP_EVERY: std::time::Duration = std::time::Duration::from_millis(250);
/// Longest time between two looks for a perf map not found.
const PERF_MAP_LONGEST: std::time::Duration = std::time::Duration::from_secs(4);

/// Whether `name` is one of the ELF mapping symbols of Arm and AArch64 (`$x`, `$d`, `$a`,
/// `$t`, perhaps with a `.N` suffix): they mark where code or data starts, inside functions
/// too, and name no function.
fn is_mapping_symbol(name: &str) -> bool {
    let Some(rest) = name.strip_prefix('$') else {
        return false;
    };
    let (kind, suffix) = rest.split_at(rest.len().min(1));
    matches!(kind, "x" | "d" | "a" | "t") && (suffix.is_empty() || suffix.starts_with('.'))
}

/// The name of the function `sym` (found for an address of `src`) stands for. blazesym takes
/// the symbol nearest below an address, and an aarch64 binary's mapping symbols (`$d` before
/// a jump table within a function, sizeless) come nearer than the function's own: it is then
/// the symbol below the mapping symbol, if its size spans the address (else none: a frame
/// shown by its address rather than by a wrong name).
fn function_of(
    symbolizer: &blazesym::symbolize::Symbolizer,
    src: &Source<'_>,
    sym: &blazesym::symbolize::Sym<'_>,
) -> Option<String> {
    if !is_mapping_symbol(&sym.name) {
        return Some(sym.name.to_string());
    }
    let addr = sym.addr + sym.offset as u64;
    let mut below = sym.addr;
    // A few mapping symbols may follow one another (`$d` then `$x` within one function).
    for _ in 0..8 {
        let found = symbolizer
            .symbolize_single(src, Input::VirtOffset(below.checked_sub(1)?))
            .ok()?;
        let s = found.as_sym()?;
        if !is_mapping_symbol(&s.name) {
            let spans = s.size.is_some_and(|n| addr < s.addr + n as u64);
            return spans.then(|| s.name.to_string());
        }
        below = s.addr;
    }
    None
}

impl ProcessUnwinder {
    /// Symbolize an unwound stack: return addresses (all but the first) are
    /// looked up at `addr - 1`, i.e. inside the call instruction, so a call
    /// as the last instruction of a function is attributed to its caller
    /// rather than to the next function. `Frame::addr` stays unadjusted.
    pub fn symbolize_stack(&mut self, stack: &[u64]) -> Vec<Frame> {
        let lookup: Vec<u64> = (stack.iter().enumerate())
            .map(|(i, &a)| if i == 0 { a } else { a.saturating_sub(1) })
            .collect();
        self.symbolize_lookup(stack, &lookup)
    }

    fn symbolize_lookup(&mut self, addrs: &[u64], lookup: &[u64]) -> Vec<Frame> {
        // Group by file and symbolize file offsets: works without the process. What was
        // named before, in any process, is named from the cache (by file and offset).
        // Per file: its key, and each frame's index, file offset and virtual address (known
        // when its module was placed: what a separate debug file is looked up by).
        type Item = (usize, u64, Option<u64>);
        let mut by_file: HashMap<PathBuf, (FileKey, Vec<Item>)> = HashMap::new();
        // Each file's build id, for its debug file.
        let mut build_ids: HashMap<FileKey, Vec<u8>> = HashMap::new();
        let mut frames: Vec<Frame> = Vec::with_capacity(addrs.len());
        for (i, (&addr, &at)) in addrs.iter().zip(lookup).enumerate() {
            // Borrowed: a frame's mapping cloned was an allocation or three per frame.
            let m = self.maps.find(at);
            let dso = m.and_then(|m| m.path.clone());
            let mut symbol = None;
            if let Some(m) = m {
                let key = (m.dev.clone(), m.inode);
                let offset = m.file_offset(at);
                let cached = (self.shared.symbols.borrow())
                    .get(&(key.clone(), offset))
                    .cloned();
                match cached {
                    Some(name) => symbol = name,
                    // The file as mapped (a container's, a replaced one), opened while it
                    // lived.
                    None => {
                        let placed = self.modules.get(&ModuleKey::of(m)).cloned().flatten();
                        let vaddr = placed.as_ref().map(|(bias, _)| at.wrapping_sub(*bias));
                        if let Some(id) = placed.and_then(|(_, info)| info.build_id.clone()) {
                            build_ids.insert(key.clone(), id);
                        }
                        if let Some(file) = self.file_path(m) {
                            (by_file.entry(file).or_insert_with(|| (key, Vec::new())).1)
                                .push((i, offset, vaddr));
                        }
                    }
                }
            }
            let build_id = m.and_then(|m| self.build_id(m));
            frames.push(Frame {
                addr,
                symbol,
                dso,
                build_id,
                jit: None,
                v8: None,
            });
        }
        // JIT code: named by V8's perf map (read again when an address is not in it yet).
        for f in frames.iter_mut().filter(|f| f.dso.is_none()) {
            f.jit = self.jit_name(f.addr);
        }
        for (path, (key, items)) in by_file {
            let src = Source::Elf(Elf::new(&path));
            let offsets: Vec<u64> = items.iter().map(|&(_, o, _)| o).collect();
            let symbolizer = &self.shared.symbolizer;
            let name = |s: &Symbolized| s.as_sym().and_then(|s| function_of(symbolizer, &src, s));
            // One unreadable section fails a whole batch in blazesym: retry one by one then.
            let mut names: Vec<Option<String>> = match self
                .shared
                .symbolizer
                .symbolize(&src, Input::FileOffset(&offsets))
            {
                Ok(syms) => syms.iter().map(name).collect(),
                Err(_) => offsets
                    .iter()
                    .map(|&o| {
                        self.shared
                            .symbolizer
                            .symbolize_single(&src, Input::FileOffset(o))
                            .ok()
                            .as_ref()
                            .and_then(name)
                    })
                    .collect(),
            };
            // What the file's own symbols do not name (a stripped library's internal
            // functions), its separate debug file may.
            if names.iter().any(Option::is_none)
                && let Some(debug) = build_ids.get(&key).and_then(|id| self.debug_file(&key, id))
            {
                self.name_from_debug_file(&debug, &items, &mut names);
            }
            let mut cache = self.shared.symbols.borrow_mut();
            if cache.len() >= MAX_SYMBOLS {
                cache.clear();
            }
            for ((i, offset, _), n) in items.into_iter().zip(names) {
                cache.insert((key.clone(), offset), n.clone());
                frames[i].symbol = n;
            }
        }
        frames
    }

    /// The separate debug file of the file `key` whose build id is `id`, looked for once.
    fn debug_file(&self, key: &FileKey, id: &[u8]) -> Option<PathBuf> {
        let mut files = self.shared.debug_files.borrow_mut();
        files
            .entry(key.clone())
            .or_insert_with(|| debugfile::by_build_id(id, &debugfile::DEBUG_DIRS))
            .clone()
    }

    /// Names from the debug file `debug`, by virtual address, the frames of `items` that
    /// `names` has none for.
    fn name_from_debug_file(
        &self,
        debug: &std::path::Path,
        items: &[(usize, u64, Option<u64>)],
        names: &mut [Option<String>],
    ) {
        let wanted: Vec<(usize, u64)> = (items.iter().zip(names.iter()).enumerate())
            .filter_map(|(j, ((_, _, vaddr), n))| Some((j, (*vaddr).filter(|_| n.is_none())?)))
            .collect();
        if wanted.is_empty() {
            return;
        }
        let mut elf = Elf::new(debug);
        // Its ELF symbols only (`.symtab`): no DWARF is read.
        elf.debug_syms = false;
        let src = Source::Elf(elf);
        let addrs: Vec<u64> = wanted.iter().map(|&(_, a)| a).collect();
        let Ok(found) = self
            .shared
            .symbolizer
            .symbolize(&src, Input::VirtOffset(&addrs))
        else {
            return;
        };
        let symbolizer = &self.shared.symbolizer;
        for ((j, _), s) in wanted.into_iter().zip(found) {
            names[j] = s.as_sym().and_then(|s| function_of(symbolizer, &src, s));
        }
    }

    /// Reads what was appended to the perf map at most every [`PERF_MAP_EVERY`], or looks for
    /// one: called when a sample's stack goes through JIT code, while the process (probably)
    /// lives. A process found with none is looked at again after twice as long each time, up
    /// to [`PERF_MAP_LONGEST`]: node writes its map from its start when asked to
    /// (`--perf-basic-prof`), so one missing at the first JIT frame is missing for good,
    /// unless the process turns it on itself (`v8.setFlagsFromString`), which is then seen
    /// within that much. Each look opens and checks a file of the target's (2.7% of the
    /// agent's CPU with stacks on, looking every 250 ms).
    pub fn read_perf_map(&mut self) {
        let now = std::time::Instant::now();
        if self
            .perf_map_read
            .is_some_and(|t| now.duration_since(t) < self.perf_map_wait)
        {
            return;
        }
        self.perf_map_read = Some(now);
        match self.perf_map.as_mut() {
            Some(m) => m.refresh(),
            None => {
                self.perf_map = PerfMap::open(self.pid);
                self.perf_map_wait = match self.perf_map {
                    Some(_) => PERF_MAP_EVERY,
                    None => (self.perf_map_wait * 2).min(PERF_MAP_LONGEST),
                };
            }
        }
    }

    /// Whether a perf map was found for this process.
    pub fn has_perf_map(&self) -> bool {
        self.perf_map.is_some()
    }

    /// V8's name of the JIT code at `addr`, from the perf map (read once more if it does not
    /// have it yet). A process with no perf map (node's default) is not looked for one at
    /// each JIT frame (see `read_perf_map`).
    fn jit_name(&mut self, addr: u64) -> Option<JitName> {
        if let Some(n) = self.perf_map.as_ref().and_then(|m| m.lookup(addr)) {
            return Some(n);
        }
        if self.perf_map.is_some() {
            self.perf_map_read = None;
        }
        self.read_perf_map();
        self.perf_map.as_ref()?.lookup(addr)
    }
}

#[cfg(test)]
mod mapping_symbols {
    use super::is_mapping_symbol;

    #[test]
    fn arm_mapping_symbols_are_told_from_names() {
        for m in ["$x", "$d", "$a", "$t", "$x.12", "$d.0"] {
            assert!(is_mapping_symbol(m), "{m}");
        }
        for n in ["$", "$xyz", "$d_fn", "x", "main", "$$d", "_$d", ""] {
            assert!(!is_mapping_symbol(n), "{n}");
        }
    }
}
