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
use std::collections::{HashMap, HashSet};
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
}

impl ElfUnwindInfo {
    fn load(path: &Path) -> Result<Self, UnwindError> {
        // A target's file: no link followed, a regular file, bounded (registry::untrusted).
        let file = untrusted::open(path, &untrusted::Policy::ELF)
            .map_err(|e| UnwindError::Io {
                path: path.to_owned(),
                source: std::io::Error::other(e),
            })?
            .file;
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
        Ok(Self {
            text_svma: section(b".text").map(svma),
            got_svma: section(b".got").map(svma),
            eh_frame_svma: svma(eh),
            eh_frame: bytes(eh)?,
            eh_frame_hdr,
            loads,
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
/// (`None`: a file that could not be used, whose frames fall back to frame pointers) and the
/// symbolizer with its parsed symbol tables. Ten node processes parse `node` once.
#[derive(Clone)]
pub struct Shared {
    files: Rc<RefCell<HashMap<FileKey, Option<Arc<ElfUnwindInfo>>>>>,
    symbolizer: Rc<Symbolizer>,
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
        }
    }
}

/// Unwinds and symbolizes stacks of one process. Keeps everything that is expensive (parsed
/// CFI per file, framehop's rule cache, blazesym's parsed symbol tables) across calls; call
/// [`Self::refresh`] when the mappings may have changed (e.g. after a `dlopen` of a `.node`
/// addon). Not `Send` (blazesym's `Symbolizer` is not), so keep it on one thread.
pub struct ProcessUnwinder {
    pid: u32,
    maps: Maps,
    unwinder: UnwinderX86_64<Bytes>,
    cache: CacheX86_64,
    modules: HashSet<ModuleKey>,
    shared: Shared,
    /// V8's perf map, read while samples through JIT code arrive (the process, and for a
    /// container its root, may be gone when stacks are named), and kept.
    perf_map: Option<PerfMap>,
    /// When the perf map was last looked for or read again.
    perf_map_read: Option<std::time::Instant>,
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
            modules: HashSet::new(),
            shared,
            perf_map: None,
            perf_map_read: None,
        };
        this.refresh()?;
        Ok(this)
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
        for gone in self.modules.iter().filter(|k| !wanted.contains_key(k)) {
            self.unwinder.remove_module(gone.start);
        }
        self.modules.retain(|k| wanted.contains_key(k));
        for (k, m) in &wanted {
            if self.modules.contains(k) {
                continue;
            }
            self.modules.insert(k.clone());
            let Some(info) = self.file_info(m) else {
                continue;
            };
            let Some(bias) = info.bias(m) else {
                log::debug!(
                    "{}",
                    UnwindError::NoSegment(m.path.clone().unwrap_or_default())
                );
                continue;
            };
            let name = m
                .path
                .as_deref()
                .unwrap_or(Path::new(""))
                .display()
                .to_string();
            let module = Module::new(name, m.start..m.end, bias, info.section_info());
            self.unwinder.add_module(module);
        }
        self.maps = maps;
        Ok(())
    }

    /// Parsed unwind info of the file behind `m`, loading it once per
    /// (dev, inode). Opens via `/proc/PID/map_files` (works across mount
    /// namespaces and for deleted files; needs root), then `/proc/PID/root`.
    fn file_info(&mut self, m: &Mapping) -> Option<Arc<ElfUnwindInfo>> {
        let fkey = (m.dev.clone(), m.inode);
        if let Some(cached) = self.shared.files.borrow().get(&fkey) {
            return cached.clone();
        }
        let path = m.path.as_deref()?;
        let map_file = PathBuf::from(format!(
            "/proc/{}/map_files/{:x}-{:x}",
            self.pid, m.start, m.end
        ));
        let mut root = PathBuf::from(format!("/proc/{}/root", self.pid));
        root.push(path.strip_prefix("/").unwrap_or(path));
        let loaded = ElfUnwindInfo::load(&map_file).or_else(|_| ElfUnwindInfo::load(&root));
        let info = match loaded {
            Ok(info) => Some(Arc::new(info)),
            Err(e) => {
                log::debug!("{e}");
                None
            }
        };
        self.shared.files.borrow_mut().insert(fkey, info.clone());
        info
    }

    /// Return addresses, innermost first (first = `ip`, the rest are raw
    /// return addresses). Each frame is unwound with `.eh_frame`; where the code has no
    /// unwind entry (V8's builtins inside node's own `.text`, whose FDEs are missing) or no
    /// module (JIT code in anonymous memory), with the frame pointer chain, which V8 keeps in
    /// both. Stops at `max_frames`, when a read leaves `stack`, when a frame pointer does not
    /// move up the stack, or when a return address is not in an executable mapping (garbage).
    /// Memory is read only from `stack`, which holds the bytes at `[sp, sp + stack.len())`.
    pub fn unwind(
        &mut self,
        ip: u64,
        sp: u64,
        bp: u64,
        stack: &[u8],
        max_frames: usize,
    ) -> Vec<u64> {
        let mut read_stack = |addr: u64| -> Result<u64, ()> {
            let off = usize::try_from(addr.checked_sub(sp).ok_or(())?).map_err(|_| ())?;
            let bytes = stack.get(off..off.checked_add(8).ok_or(())?).ok_or(())?;
            Ok(u64::from_le_bytes(bytes.try_into().map_err(|_| ())?))
        };
        let mut regs = UnwindRegsX86_64::new(ip, sp, bp);
        let mut frames = vec![ip];
        let mut address = FrameAddress::from_instruction_pointer(ip);
        while frames.len() < max_frames {
            let next = match self.unwinder.unwind_frame(
                address,
                &mut regs,
                &mut self.cache,
                &mut read_stack,
            ) {
                Ok(Some(ra)) => ra,
                Ok(None) => break,
                Err(_) => match frame_pointer_step(&mut regs, &mut read_stack) {
                    Some(ra) => ra,
                    None => break,
                },
            };
            if !self.maps.find(next).is_some_and(|m| m.exec) {
                break;
            }
            frames.push(next);
            let Some(a) = FrameAddress::from_return_address(next) else {
                break;
            };
            address = a;
        }
        frames
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
        let mut frames: Vec<Frame> = addrs
            .iter()
            .zip(lookup)
            .enumerate()
            .map(|(i, (&addr, &at))| {
                let m = self.maps.find(at);
                let dso = m.and_then(|m| m.path.clone());
                // The file as mapped (a container's, a replaced one), found while it lives.
                if let Some(m) = m
                    && let Some(file) = readable_path(self.pid, m)
                {
                    by_file
                        .entry(file)
                        .or_default()
                        .push((i, m.file_offset(at)));
                }
                Frame {
                    addr,
                    symbol: None,
                    dso,
                    jit: None,
                }
            })
            .collect();
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
