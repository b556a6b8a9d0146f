//! User-space stack unwinding and symbolization for sampled write acquisitions.
//!
//! The eBPF side captures `ip`/`sp`/`bp` from the task's `pt_regs` plus a copy of the top of
//! the user stack (`[sp, sp + len)`). Frame pointers are not enough: Debian's glibc (and most
//! distro C/C++ code) is built without them, so the syscall wrapper every stack starts in
//! would lose its caller. We unwind with DWARF CFI from each mapped ELF object's `.eh_frame`
//! (framehop), and fall back to frame pointers only for code without unwind info (V8 JIT
//! code in anonymous executable mappings keeps `rbp` chains). ELF headers are read with the
//! `object` crate (section and program headers only, through a `ReadCache`, so the 100 MB
//! `node` binary is not read whole); symbolization is blazesym's, on the files themselves, so
//! stacks of a process that has exited since can still be named.
//!
//! Not handled: `[vdso]` (frames inside it use frame pointers), `.debug_frame`-only objects,
//! architectures other than x86_64, and JIT frames whose code does not keep `rbp` as a frame
//! pointer.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;

use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{Input, Symbolized, Symbolizer};
use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder};
use object::read::elf::{FileHeader, ProgramHeader, SectionHeader};

use crate::registry::perfmap::{JitName, PerfMap};
use crate::registry::procmaps::{Mapping, Maps, readable_path};
use crate::registry::untrusted;

/// Shared, immutable section bytes handed to framehop (cheap to clone into
/// several modules when one file has several executable mappings).
type Bytes = Arc<[u8]>;

/// One symbolized frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// The address as returned by [`ProcessUnwinder::unwind`] (not adjusted).
    pub addr: u64,
    /// Demangled function name, if any source knew it.
    pub symbol: Option<String>,
    /// File backing the mapping; `None` for anonymous (JIT) or unknown memory.
    pub dso: Option<PathBuf>,
    /// For JIT code (no file), V8's name from the process's perf map, if it writes one.
    pub jit: Option<JitName>,
    /// For a V8 frame, its function as read from the process's heap (see `v8`).
    pub v8: Option<crate::registry::v8::Resolved>,
}

#[derive(Debug, thiserror::Error)]
pub enum UnwindError {
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("parsing ELF {path}: {source}")]
    Elf {
        path: PathBuf,
        #[source]
        source: object::Error,
    },
    #[error("{0}: no .eh_frame")]
    NoUnwindInfo(PathBuf),
    #[error("{0}: no PT_LOAD segment covers the mapping")]
    NoSegment(PathBuf),
}

/// A `PT_LOAD` program header, used to turn a mapping into a load bias.
#[derive(Debug)]
struct LoadSegment {
    offset: u64,
    vaddr: u64,
    filesz: u64,
    exec: bool,
}

/// What we keep of one ELF file: the CFI sections and their SVMAs (addresses
/// as stated in the file), plus the load segments.
#[derive(Debug)]
struct ElfUnwindInfo {
    text_svma: Option<Range<u64>>,
    got_svma: Option<Range<u64>>,
    eh_frame_svma: Range<u64>,
    eh_frame: Bytes,
    eh_frame_hdr: Option<(Range<u64>, Bytes)>,
    loads: Vec<LoadSegment>,
    /// Large stretches of executable code with no FDE (SVMAs): in node, V8's embedded
    /// builtins, whose frames are V8 frames (see `v8`).
    gaps: Vec<Range<u64>>,
}

impl ElfUnwindInfo {
    /// `path` is our own descriptor (`/proc/self/fd/N`) on the target's file, which
    /// [`readable_path`] opened safely and checked (registry::untrusted).
    fn load(path: &Path) -> Result<Self, UnwindError> {
        let file = File::open(path).map_err(|source| UnwindError::Io {
            path: path.to_owned(),
            source,
        })?;
        let data = object::ReadCache::new(file);
        let elf_err = |source| UnwindError::Elf {
            path: path.to_owned(),
            source,
        };
        let header =
            object::elf::FileHeader64::<object::Endianness>::parse(&data).map_err(elf_err)?;
        let endian = header.endian().map_err(elf_err)?;
        let sections = header.sections(endian, &data).map_err(elf_err)?;
        let section = |name: &[u8]| sections.section_by_name(endian, name).map(|(_, s)| s);
        let svma = |s: &object::elf::SectionHeader64<object::Endianness>| {
            let start = s.sh_addr(endian);
            start..start + s.sh_size(endian)
        };
        let bytes = |s: &object::elf::SectionHeader64<object::Endianness>| {
            if s.sh_size(endian) > untrusted::MAX_UNWIND_SECTION {
                return Err(UnwindError::NoUnwindInfo(path.to_owned()));
            }
            s.data(endian, &data).map(Bytes::from).map_err(elf_err)
        };
        let eh = section(b".eh_frame").ok_or_else(|| UnwindError::NoUnwindInfo(path.to_owned()))?;
        let eh_frame_hdr = match section(b".eh_frame_hdr") {
            Some(s) => Some((svma(s), bytes(s)?)),
            None => None,
        };
        let loads = header
            .program_headers(endian, &data)
            .map_err(elf_err)?
            .iter()
            .filter(|p| p.p_type(endian) == object::elf::PT_LOAD)
            .map(|p| LoadSegment {
                offset: p.p_offset(endian),
                vaddr: p.p_vaddr(endian),
                filesz: p.p_filesz(endian),
                exec: p.p_flags(endian).0 & object::elf::PF_X.0 != 0,
            })
            .collect();
        let eh_frame = bytes(eh)?;
        let loads: Vec<LoadSegment> = loads;
        let text_svma = section(b".text").map(svma);
        let got_svma = section(b".got").map(svma);
        let gaps = fde_gaps(
            &eh_frame,
            svma(eh).start,
            eh_frame_hdr.as_ref(),
            text_svma.as_ref(),
            got_svma.as_ref(),
            &loads,
        );
        Ok(Self {
            text_svma,
            got_svma,
            eh_frame_svma: svma(eh),
            eh_frame,
            eh_frame_hdr,
            loads,
            gaps,
        })
    }

    /// Load bias (AVMA of SVMA 0) of `map`: find the `PT_LOAD` whose pages
    /// cover the mapping's file offset; `vaddr - offset` is constant inside it.
    fn bias(&self, map: &Mapping) -> Option<u64> {
        let covers = |l: &&LoadSegment| {
            (l.offset & !0xfff) <= map.offset && map.offset < l.offset + l.filesz
        };
        let seg = (self.loads.iter().filter(covers).find(|l| l.exec))
            .or_else(|| self.loads.iter().find(covers))?;
        Some(
            map.start
                .wrapping_sub(map.offset.wrapping_add(seg.vaddr.wrapping_sub(seg.offset))),
        )
    }

    /// framehop wants ELF modules described with `base_svma = 0` and
    /// `base_avma = load bias`; all section addresses stay SVMAs.
    fn section_info(&self) -> ExplicitModuleSectionInfo<Bytes> {
        let (eh_frame_hdr_svma, eh_frame_hdr) = self.eh_frame_hdr.clone().unzip();
        ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma: self.text_svma.clone(),
            got_svma: self.got_svma.clone(),
            eh_frame_svma: Some(self.eh_frame_svma.clone()),
            eh_frame: Some(self.eh_frame.clone()),
            eh_frame_hdr_svma,
            eh_frame_hdr,
            ..Default::default()
        }
    }
}

/// Stretches of at least `MIN_GAP` bytes of the executable segments that no FDE covers. The
/// FDEs' starts come from `.eh_frame_hdr`'s sorted table when it has the usual encoding (the
/// FDE before a wide space between two starts is then the only one parsed), else from
/// walking `.eh_frame`.
fn fde_gaps(
    eh_frame: &[u8],
    eh_frame_svma: u64,
    hdr: Option<&(Range<u64>, Bytes)>,
    text: Option<&Range<u64>>,
    got: Option<&Range<u64>>,
    loads: &[LoadSegment],
) -> Vec<Range<u64>> {
    use gimli::UnwindSection;
    const MIN_GAP: u64 = 64 * 1024;
    let eh = gimli::EhFrame::new(eh_frame, gimli::LittleEndian);
    let mut bases = gimli::BaseAddresses::default().set_eh_frame(eh_frame_svma);
    if let Some(t) = text {
        bases = bases.set_text(t.start);
    }
    if let Some(g) = got {
        bases = bases.set_got(g.start);
    }
    let fde_range = |offset: usize| {
        eh.fde_from_offset(
            &bases,
            gimli::EhFrameOffset(offset),
            gimli::EhFrame::cie_from_offset,
        )
        .ok()
        .map(|fde| (fde.initial_address(), fde.initial_address() + fde.len()))
    };
    let mut covered: Vec<(u64, u64)> = Vec::new();
    // version 1, pointer encodings, then (start, FDE) pairs as 32-bit offsets from the
    // header (DW_EH_PE_datarel | DW_EH_PE_sdata4 = 0x3b, the count as udata4 = 0x03).
    match hdr {
        Some((svma, b)) if b.len() >= 12 && b[0] == 1 && b[2] == 0x03 && b[3] == 0x3b => {
            let count = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes")) as usize;
            let at = |i: usize| -> Option<(u64, u64)> {
                let e = b.get(12 + 8 * i..12 + 8 * i + 8)?;
                let start = i32::from_le_bytes(e[0..4].try_into().ok()?) as i64;
                let fde = i32::from_le_bytes(e[4..8].try_into().ok()?) as i64;
                Some((
                    svma.start.checked_add_signed(start)?,
                    svma.start.checked_add_signed(fde)?,
                ))
            };
            let entries: Vec<(u64, u64)> = (0..count).map_while(at).collect();
            for (i, &(start, fde)) in entries.iter().enumerate() {
                let next = entries.get(i + 1).map_or(u64::MAX, |e| e.0);
                // A function no longer than the space to the next: its end is its start.
                let end = if next - start >= MIN_GAP {
                    fde.checked_sub(eh_frame_svma)
                        .and_then(|o| fde_range(o as usize))
                        .map_or(start, |r| r.1)
                } else {
                    next.min(start + MIN_GAP)
                };
                covered.push((start, end));
            }
        }
        _ => {
            let mut entries = eh.entries(&bases);
            while let Ok(Some(entry)) = entries.next() {
                if let gimli::CieOrFde::Fde(partial) = entry
                    && let Ok(fde) = partial.parse(gimli::EhFrame::cie_from_offset)
                {
                    covered.push((fde.initial_address(), fde.initial_address() + fde.len()));
                }
            }
            covered.sort_unstable();
        }
    }
    let mut gaps = Vec::new();
    for seg in loads.iter().filter(|l| l.exec) {
        let mut at = seg.vaddr;
        let end = seg.vaddr + seg.filesz;
        for &(s, e) in covered.iter().filter(|(s, e)| *e > seg.vaddr && *s < end) {
            if s > at && s - at >= MIN_GAP {
                gaps.push(at..s);
            }
            at = at.max(e);
        }
        if end > at && end - at >= MIN_GAP {
            gaps.push(at..end);
        }
    }
    gaps
}

/// Identity of one executable file mapping; a change means re-adding it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct ModuleKey {
    start: u64,
    end: u64,
    offset: u64,
    dev: String,
    inode: u64,
}

type FileKey = (String, u64);

/// What the unwinders of all processes share: the parsed unwind information of each file
/// (`None`: a file that could not be used, whose frames fall back to frame pointers), the
/// files themselves, opened while a process that maps them lives (so that its frames can be
/// named after it exits, even from a container's root that is gone by then), and the
/// symbolizer with its parsed symbol tables. Ten node processes parse `node` once.
#[derive(Clone)]
pub struct Shared {
    files: Rc<RefCell<HashMap<FileKey, Option<Arc<ElfUnwindInfo>>>>>,
    symbolizer: Rc<Symbolizer>,
    pub v8: crate::registry::v8::SharedLayouts,
}

impl Default for Shared {
    fn default() -> Self {
        Shared {
            files: Rc::default(),
            // No auto-reload: it would stat() every file on every call. No line info: names
            // are what we report.
            symbolizer: Rc::new(
                Symbolizer::builder()
                    .enable_auto_reload(false)
                    .enable_code_info(false)
                    .build(),
            ),
            v8: Default::default(),
        }
    }
}

/// Why an unwound stack stops where it does (docs/report-format.md, `stack_ends`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StackEnd {
    /// The thread's first frame (`_start`, `clone3`, a start routine whose caller has no
    /// return address).
    Root,
    /// Code with no unwind entry whose frame pointer chain does not go on.
    NoUnwindInfo,
    /// The next frame lies beyond the copy of the stack the kernel made (16 KiB from sp).
    UnreadableMemory,
    /// The deepest stack kept.
    DepthLimit,
    /// A return address outside every executable mapping, even after reading them again.
    UnknownMapping,
    /// The process could not be read (gone before its first sample was looked at).
    NoProcess,
}

impl StackEnd {
    pub fn as_str(self) -> &'static str {
        match self {
            StackEnd::Root => "root",
            StackEnd::NoUnwindInfo => "no_unwind_info",
            StackEnd::UnreadableMemory => "unreadable_memory",
            StackEnd::DepthLimit => "depth_limit",
            StackEnd::UnknownMapping => "unknown_mapping",
            StackEnd::NoProcess => "no_process",
        }
    }
}

/// One unwound frame: its code address (the sampled ip, then return addresses) and the frame
/// pointer while that code ran (V8 frames keep their slots below it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnwoundFrame {
    pub addr: u64,
    pub fp: u64,
}

/// An unwound stack, innermost first, and why it ends there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unwound {
    pub frames: Vec<UnwoundFrame>,
    pub end: StackEnd,
}

impl Unwound {
    #[cfg(test)]
    pub fn addrs(&self) -> Vec<u64> {
        self.frames.iter().map(|f| f.addr).collect()
    }
}

/// What kind of code a frame runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CodeKind {
    /// Anonymous executable memory: V8's generated code.
    Jit,
    /// Code of a file with no unwind entry in a long stretch without any (V8's embedded
    /// builtins, bytecode handlers and trampolines included).
    Builtin,
    /// Code of a file, with unwind entries.
    Native,
    /// Not in any executable mapping known.
    Unknown,
}

/// At most one re-reading of a process's mappings in this time (each takes its mmap_lock).
const REFRESH_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// Unwinds and symbolizes stacks of one process. Keeps everything that is expensive (parsed
/// CFI per file, framehop's rule cache, blazesym's parsed symbol tables) across calls; reads
/// the mappings again when a frame is outside them (code loaded or compiled since), at most
/// every [`REFRESH_EVERY`]. Not `Send` (blazesym's `Symbolizer` is not), so keep it on one
/// thread.
pub struct ProcessUnwinder {
    pid: u32,
    maps: Maps,
    unwinder: UnwinderX86_64<Bytes>,
    cache: CacheX86_64,
    /// Executable file mappings added to `unwinder`, with their load bias and unwind info.
    modules: HashMap<ModuleKey, Option<(u64, Arc<ElfUnwindInfo>)>>,
    shared: Shared,
    /// When the mappings were last read because a frame was outside them (None: never).
    maps_read: Option<std::time::Instant>,
    /// V8's perf map, read while samples through JIT code arrive (the process, and for a
    /// container its root, may be gone when stacks are named), and kept.
    perf_map: Option<PerfMap>,
    /// When the perf map was last looked for or read again.
    perf_map_read: Option<std::time::Instant>,
    /// The process's V8 heap, when a binary it maps has a usable V8 layout.
    pub v8: Option<crate::registry::v8::V8Process>,
    /// Why V8 frames cannot be named from the heap (an unknown layout), if so.
    pub v8_note: Option<String>,
}

impl ProcessUnwinder {
    /// Reads `/proc/PID/maps` and loads `.eh_frame` of every executable ELF mapping not
    /// loaded yet. Per-file failures do not fail this (they are logged at debug level).
    pub fn new(pid: u32, shared: Shared) -> Result<Self, UnwindError> {
        let mut this = Self {
            pid,
            maps: Maps::default(),
            unwinder: UnwinderX86_64::new(),
            cache: CacheX86_64::new(),
            modules: HashMap::new(),
            shared,
            maps_read: None,
            perf_map: None,
            perf_map_read: None,
            v8: None,
            v8_note: None,
        };
        this.refresh()?;
        this.attach_v8();
        Ok(this)
    }

    /// Finds the binary that holds V8 (node, or Debian's libnode.so) among the mappings and
    /// reads its layout (once per binary, shared).
    fn attach_v8(&mut self) {
        let mut seen = Vec::new();
        let candidates: Vec<Mapping> = self
            .maps
            .iter()
            .filter(|m| {
                let name = m.path.as_deref().and_then(Path::file_name);
                let name = name.map(|n| n.to_string_lossy()).unwrap_or_default();
                name.starts_with("node") || name.starts_with("libnode")
            })
            .cloned()
            .collect();
        for m in candidates {
            let key = (m.dev.clone(), m.inode);
            if seen.contains(&key) {
                continue;
            }
            seen.push(key.clone());
            let Some(path) = self.open_file(&m) else {
                continue;
            };
            let shown = m
                .path
                .as_deref()
                .unwrap_or(Path::new(""))
                .display()
                .to_string();
            match self.shared.v8.get(key, &path, &shown) {
                Ok(layout) => {
                    self.v8 = Some(crate::registry::v8::V8Process::new(
                        layout,
                        crate::registry::v8::heap::ProcessMemory { pid: self.pid },
                    ));
                    self.v8_note = None;
                    return;
                }
                Err(crate::registry::v8::metadata::LayoutError::NotV8(_)) => {}
                Err(e) => self.v8_note = Some(e.to_string()),
            }
        }
    }

    /// Re-reads the maps; adds/removes framehop modules for changed mappings
    /// (files already parsed are reused) and refreshes blazesym's VMA cache.
    pub fn refresh(&mut self) -> Result<(), UnwindError> {
        // Code only: a process with ten thousand threads has twenty thousand mappings, nearly
        // all stacks, none of which unwinding or symbolizing looks up.
        let maps = Maps::read_exec(self.pid).map_err(|source| UnwindError::Io {
            path: PathBuf::from(format!("/proc/{}/maps", self.pid)),
            source,
        })?;
        let key = |m: &Mapping| ModuleKey {
            start: m.start,
            end: m.end,
            offset: m.offset,
            dev: m.dev.clone(),
            inode: m.inode,
        };
        let wanted: HashMap<ModuleKey, &Mapping> = maps
            .iter()
            .filter(|m| m.exec && m.path.is_some())
            .map(|m| (key(m), m))
            .collect();
        for gone in self.modules.keys().filter(|k| !wanted.contains_key(k)) {
            self.unwinder.remove_module(gone.start);
        }
        self.modules.retain(|k, _| wanted.contains_key(k));
        for (k, m) in &wanted {
            if self.modules.contains_key(k) {
                continue;
            }
            let added = self.file_info(m).and_then(|info| match info.bias(m) {
                Some(bias) => Some((bias, info)),
                None => {
                    log::debug!(
                        "{}",
                        UnwindError::NoSegment(m.path.clone().unwrap_or_default())
                    );
                    None
                }
            });
            if let Some((bias, info)) = &added {
                let name = m
                    .path
                    .as_deref()
                    .unwrap_or(Path::new(""))
                    .display()
                    .to_string();
                let module = Module::new(name, m.start..m.end, *bias, info.section_info());
                self.unwinder.add_module(module);
            }
            self.modules.insert(k.clone(), added);
        }
        self.maps = maps;
        Ok(())
    }

    /// Reads the mappings again, for a frame outside them, unless that was done less than
    /// [`REFRESH_EVERY`] ago, or the process is gone; true if they were read.
    fn refresh_if_due(&mut self) -> bool {
        if self.maps_read.is_some_and(|t| t.elapsed() < REFRESH_EVERY) {
            return false;
        }
        self.maps_read = Some(std::time::Instant::now());
        self.refresh().is_ok()
    }

    /// The file behind `m`, opened safely (no link followed, a regular file, the mapping's
    /// inode) once per file and kept open for the run: `/proc/self/fd/N` names it after the
    /// process is gone, even from a container's root that is gone too (see [`readable_path`]).
    fn open_file(&self, m: &Mapping) -> Option<PathBuf> {
        readable_path(self.pid, m)
    }

    /// Parsed unwind info of the file behind `m`, loading it once per (dev, inode).
    fn file_info(&mut self, m: &Mapping) -> Option<Arc<ElfUnwindInfo>> {
        let fkey = (m.dev.clone(), m.inode);
        if let Some(cached) = self.shared.files.borrow().get(&fkey) {
            return cached.clone();
        }
        let opened = self.open_file(m);
        let info = match opened.map(|p| ElfUnwindInfo::load(&p)) {
            Some(Ok(info)) => Some(Arc::new(info)),
            Some(Err(e)) => {
                log::debug!("{e}");
                None
            }
            None => None,
        };
        self.shared.files.borrow_mut().insert(fkey, info.clone());
        info
    }

    /// Where this process can read the file behind `m`: the copy opened while it lived.
    pub fn file_path(&self, m: &Mapping) -> Option<PathBuf> {
        self.open_file(m)
    }

    /// What kind of code is at `addr` (as the mappings were last read).
    pub fn code_kind(&self, addr: u64) -> CodeKind {
        let Some(m) = self.maps.find(addr).filter(|m| m.exec) else {
            return CodeKind::Unknown;
        };
        if m.path.is_none() {
            return CodeKind::Jit;
        }
        let key = ModuleKey {
            start: m.start,
            end: m.end,
            offset: m.offset,
            dev: m.dev.clone(),
            inode: m.inode,
        };
        match self.modules.get(&key) {
            Some(Some((bias, info))) => {
                let svma = addr.wrapping_sub(*bias);
                if info.gaps.iter().any(|g| g.contains(&svma)) {
                    CodeKind::Builtin
                } else {
                    CodeKind::Native
                }
            }
            _ => CodeKind::Native,
        }
    }

    /// Unwinds a copied stack, innermost first (first = `ip`, the rest are raw return
    /// addresses), each frame with its frame pointer. Each frame is unwound with `.eh_frame`;
    /// where the code has no unwind entry (V8's builtins inside node's own `.text`) or no
    /// module (JIT code in anonymous memory), with the frame pointer chain, which V8 keeps in
    /// every frame it makes (JavaScript, builtin, stub, exit and entry frames alike). A return
    /// address outside the known mappings makes them be read again (code loaded or compiled
    /// since), at most every [`REFRESH_EVERY`]. Memory is read only from `stack`, which holds
    /// the bytes at `[sp, sp + stack.len())`; [`Unwound::end`] says why the stack ends.
    pub fn unwind(
        &mut self,
        ip: u64,
        sp: u64,
        bp: u64,
        stack: &[u8],
        max_frames: usize,
    ) -> Unwound {
        let stack_end = sp.saturating_add(stack.len() as u64);
        let read_stack = |addr: u64| -> Result<u64, ()> {
            let off = usize::try_from(addr.checked_sub(sp).ok_or(())?).map_err(|_| ())?;
            let bytes = stack.get(off..off.checked_add(8).ok_or(())?).ok_or(())?;
            Ok(u64::from_le_bytes(bytes.try_into().map_err(|_| ())?))
        };
        // A read beyond the copy: the stack goes on where we cannot see it.
        let beyond = |addr: u64| addr >= stack_end;
        if self.code_kind(ip) == CodeKind::Unknown {
            self.refresh_if_due();
        }
        let mut regs = UnwindRegsX86_64::new(ip, sp, bp);
        let mut frames = vec![UnwoundFrame { addr: ip, fp: bp }];
        let mut address = FrameAddress::from_instruction_pointer(ip);
        let end = loop {
            if frames.len() >= max_frames {
                break StackEnd::DepthLimit;
            }
            let mut read = read_stack;
            let next =
                match self
                    .unwinder
                    .unwind_frame(address, &mut regs, &mut self.cache, &mut read)
                {
                    Ok(Some(ra)) => ra,
                    Ok(None) => {
                        let last = frames.last().expect("one frame").addr;
                        break match self.code_kind(last) {
                            CodeKind::Native => StackEnd::Root,
                            _ => StackEnd::NoUnwindInfo,
                        };
                    }
                    Err(e) => match frame_pointer_step(&mut regs, &mut read) {
                        Some(ra) => ra,
                        None => {
                            break match e {
                                framehop::Error::CouldNotReadStack(a) if beyond(a) => {
                                    StackEnd::UnreadableMemory
                                }
                                _ if beyond(regs.bp()) => StackEnd::UnreadableMemory,
                                _ => StackEnd::NoUnwindInfo,
                            };
                        }
                    },
                };
            if self.code_kind(next) == CodeKind::Unknown
                && !(self.refresh_if_due() && self.code_kind(next) != CodeKind::Unknown)
            {
                break StackEnd::UnknownMapping;
            }
            frames.push(UnwoundFrame {
                addr: next,
                fp: regs.bp(),
            });
            let Some(a) = FrameAddress::from_return_address(next) else {
                break StackEnd::NoUnwindInfo;
            };
            address = a;
        };
        Unwound { frames, end }
    }

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
        // Group by file and symbolize file offsets: works without the process.
        let mut by_file: HashMap<PathBuf, Vec<(usize, u64)>> = HashMap::new();
        let mut frames: Vec<Frame> = Vec::with_capacity(addrs.len());
        for (i, (&addr, &at)) in addrs.iter().zip(lookup).enumerate() {
            let m = self.maps.find(at).cloned();
            let dso = m.as_ref().and_then(|m| m.path.clone());
            // The file as mapped (a container's, a replaced one), opened while it lived.
            if let Some(m) = &m
                && let Some(file) = self.file_path(m)
            {
                by_file
                    .entry(file)
                    .or_default()
                    .push((i, m.file_offset(at)));
            }
            frames.push(Frame {
                addr,
                symbol: None,
                dso,
                jit: None,
                v8: None,
            });
        }
        // JIT code: named by V8's perf map (read again when an address is not in it yet).
        for f in frames.iter_mut().filter(|f| f.dso.is_none()) {
            f.jit = self.jit_name(f.addr);
        }
        for (path, items) in by_file {
            let src = Source::Elf(Elf::new(&path));
            let offsets: Vec<u64> = items.iter().map(|&(_, o)| o).collect();
            let name = |s: &Symbolized| s.as_sym().map(|s| s.name.to_string());
            // One unreadable section fails a whole batch in blazesym: retry one by one then.
            let names: Vec<Option<String>> = match self
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
            for ((i, _), n) in items.into_iter().zip(names) {
                frames[i].symbol = n;
            }
        }
        frames
    }

    /// The mapping that holds `addr`, as last read.
    pub fn mapping(&self, addr: u64) -> Option<&Mapping> {
        self.maps.find(addr)
    }

    /// Looks for the perf map, or reads what was appended to it, at most every 250 ms: called
    /// when a sample's stack goes through JIT code, while the process (probably) lives.
    pub fn read_perf_map(&mut self) {
        let now = std::time::Instant::now();
        if self
            .perf_map_read
            .is_some_and(|t| now.duration_since(t) < std::time::Duration::from_millis(250))
        {
            return;
        }
        self.perf_map_read = Some(now);
        match self.perf_map.as_mut() {
            Some(m) => m.refresh(),
            None => self.perf_map = PerfMap::open(self.pid),
        }
    }

    /// Whether a perf map was found for this process.
    pub fn has_perf_map(&self) -> bool {
        self.perf_map.is_some()
    }

    /// V8's name of the JIT code at `addr`, from the perf map (read once more if it does not
    /// have it yet).
    fn jit_name(&mut self, addr: u64) -> Option<JitName> {
        if let Some(n) = self.perf_map.as_ref().and_then(|m| m.lookup(addr)) {
            return Some(n);
        }
        self.perf_map_read = None;
        self.read_perf_map();
        self.perf_map.as_ref()?.lookup(addr)
    }
}

/// One step up a frame pointer chain: `[bp]` is the caller's `bp`, `[bp + 8]` the return
/// address, and the caller's `sp` is `bp + 16`. None when `bp` is not inside the current
/// frame's stack, the caller's `bp` does not lie above it (garbage, or the end of the chain),
/// or a read leaves the copied stack.
pub(crate) fn frame_pointer_step(
    regs: &mut UnwindRegsX86_64,
    read_stack: &mut impl FnMut(u64) -> Result<u64, ()>,
) -> Option<u64> {
    let bp = regs.bp();
    if bp < regs.sp() || !bp.is_multiple_of(8) {
        return None;
    }
    let caller_bp = read_stack(bp).ok()?;
    let ra = read_stack(bp.checked_add(8)?).ok()?;
    if ra == 0 || (caller_bp != 0 && caller_bp <= bp) {
        return None;
    }
    regs.set_sp(bp + 16);
    regs.set_bp(caller_bp);
    Some(ra)
}

#[cfg(test)]
#[path = "unwind_tests.rs"]
mod tests;
