//! User-space stack unwinding and symbolization for sampled write acquisitions.
//!
//! The eBPF side captures the instruction, stack and frame pointers (and arm64's link
//! register) from the task's `pt_regs` plus a copy of the top of the user stack
//! (`[sp, sp + len)`). Frame pointers are not enough: Debian's glibc (and most
//! distro C/C++ code) is built without them, so the syscall wrapper every stack starts in
//! would lose its caller. We unwind with DWARF CFI from each mapped ELF object's `.eh_frame`
//! (framehop), and fall back to frame pointers only for code without unwind info (V8 JIT
//! code in anonymous executable mappings keeps frame pointer chains: `rbp` on x86_64, `x29`
//! on arm64). ELF headers are read with the
//! `object` crate (section and program headers only, through a `ReadCache`, so the 100 MB
//! `node` binary is not read whole); symbolization is blazesym's, on the files themselves, so
//! stacks of a process that has exited since can still be named.
//!
//! Not handled: `[vdso]` (frames inside it use frame pointers), `.debug_frame`-only objects,
//! architectures other than x86_64 and arm64 (`arch`), and JIT frames whose code does not
//! keep a frame pointer.
//!
//! Here the per-process unwinder and what it shares across processes; what is read of an ELF
//! file is `elf.rs`, the stack walk `walk.rs` (the CPU's part of it `arch.rs`), naming the
//! frames `symbolize.rs`.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;

use blazesym::symbolize::Symbolizer;
use framehop::{Module, Unwinder};

use crate::registry::perfmap::{JitName, PerfMap};
use crate::registry::procmaps::{Keep, Lookup, Lookups, Mapping, Maps, Proc, readable_path};
use crate::registry::reads::Reads;

mod arch;
mod debugfile;
mod elf;
mod symbolize;
#[cfg(test)]
mod tests;
mod walk;

use elf::ElfUnwindInfo;

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
    /// That file's GNU build id, in hex (when it has one and its unwind tables were read).
    pub build_id: Option<String>,
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

/// Identity of one executable file mapping; a change means re-adding it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct ModuleKey {
    start: u64,
    end: u64,
    offset: u64,
    dev: String,
    inode: u64,
}

impl ModuleKey {
    fn of(m: &Mapping) -> Self {
        ModuleKey {
            start: m.start,
            end: m.end,
            offset: m.offset,
            dev: m.dev.clone(),
            inode: m.inode,
        }
    }
}

/// How a mapping's file is named to framehop and V8's layout reader: its path as mapped.
fn shown(m: &Mapping) -> String {
    m.path
        .as_deref()
        .unwrap_or(Path::new(""))
        .display()
        .to_string()
}

type FileKey = (String, u64);

/// Functions' names by file and offset (None: the file has no symbol there).
type Names = HashMap<(FileKey, u64), Option<String>>;

/// What the unwinders of all processes share: the parsed unwind information of each file
/// (`None`: a file that could not be used, whose frames fall back to frame pointers), the
/// files themselves, opened while a process that maps them lives (so that its frames can be
/// named after it exits, even from a container's root that is gone by then), and the
/// symbolizer with its parsed symbol tables. Ten node processes parse `node` once.
#[derive(Clone)]
pub struct Shared {
    files: Rc<RefCell<HashMap<FileKey, Option<Arc<ElfUnwindInfo>>>>>,
    symbolizer: Rc<Symbolizer>,
    /// Names by file and offset, for every process: blazesym's lookup and its C++ demangling
    /// were a tenth of the agent's CPU with stacks on, naming the same few hundred of node's
    /// functions again in each stack and each process (`symbolize`).
    symbols: Rc<RefCell<Names>>,
    /// Each file's separate debug file (`debugfile`), looked for once per file.
    debug_files: Rc<RefCell<HashMap<FileKey, Option<PathBuf>>>>,
    pub v8: crate::registry::v8::SharedLayouts,
    pub v8_sources: crate::registry::v8::SharedSources,
    pub v8_scripts: crate::registry::v8::ScriptSources,
}

impl Default for Shared {
    fn default() -> Self {
        Shared {
            files: Rc::default(),
            symbols: Rc::default(),
            debug_files: Rc::default(),
            // No auto-reload: it would stat() every file on every call. No line info: names
            // are what we report.
            symbolizer: Rc::new(
                Symbolizer::builder()
                    .enable_auto_reload(false)
                    .enable_code_info(false)
                    .build(),
            ),
            v8: Default::default(),
            v8_sources: Default::default(),
            v8_scripts: Default::default(),
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
    /// A return address outside every executable mapping, even after looking it up (or while
    /// the process's lookups wait: see `procmaps::live`).
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

/// The user registers a sampled stack is unwound from, as the kernel saved them at entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UserRegs {
    pub ip: u64,
    pub sp: u64,
    /// The frame pointer (x86_64 `rbp`, arm64 `x29`).
    pub fp: u64,
    /// arm64's link register `x30` (0 on x86_64).
    pub lr: u64,
}

impl UserRegs {
    /// The registers of a sample's record.
    pub fn of(h: &profiler_common::StackHeader) -> Self {
        UserRegs {
            ip: h.ip,
            sp: h.sp,
            fp: h.bp,
            lr: h.lr,
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

/// Unwinds and symbolizes stacks of one process. Keeps everything that is expensive (parsed
/// CFI per file, framehop's rule cache, blazesym's parsed symbol tables) across calls; reads
/// the mappings whole once, then looks up a frame outside them (code loaded or compiled
/// since) as `procmaps::Lookups` allows. Not `Send` (blazesym's `Symbolizer` is not), so keep
/// it on one thread.
pub struct ProcessUnwinder {
    pid: u32,
    maps: Maps,
    unwinder: arch::Unwinder<Bytes>,
    cache: arch::Cache,
    /// Executable file mappings added to `unwinder`, with their load bias and unwind info.
    modules: HashMap<ModuleKey, Option<(u64, Arc<ElfUnwindInfo>)>>,
    shared: Shared,
    /// Lookups of addresses outside the mappings known, and their budget.
    lookups: Lookups,
    /// V8's perf map, read while samples through JIT code arrive (the process, and for a
    /// container its root, may be gone when stacks are named), and kept.
    perf_map: Option<PerfMap>,
    /// When the perf map was last looked for or read again, and how long until the next look
    /// (see `read_perf_map`).
    perf_map_read: Option<std::time::Instant>,
    perf_map_wait: std::time::Duration,
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
            unwinder: arch::Unwinder::new(),
            cache: arch::Cache::new(),
            modules: HashMap::new(),
            shared,
            lookups: Lookups::one_mapping(),
            perf_map: None,
            perf_map_read: None,
            perf_map_wait: symbolize::PERF_MAP_EVERY,
            v8: None,
            v8_note: None,
        };
        // Code only: a process with ten thousand threads has twenty thousand mappings, nearly
        // all stacks, none of which unwinding or symbolizing looks up.
        this.maps = (this.lookups)
            .read(&mut Proc(pid), Keep::Exec)
            .map_err(|source| UnwindError::Io {
                path: PathBuf::from(format!("/proc/{pid}/maps")),
                source,
            })?;
        this.sync_modules();
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
            match self.shared.v8.get(key.clone(), &path, &shown(&m)) {
                Ok(layout) => {
                    let sources = self.shared.v8_sources.of(&key, &path);
                    self.v8 = Some(
                        crate::registry::v8::V8Process::new(
                            layout,
                            crate::registry::v8::memory::ProcessMemory::new(self.pid),
                        )
                        .sharing_sources(sources)
                        .sharing_scripts(self.shared.v8_scripts.clone()),
                    );
                    self.v8_note = None;
                    return;
                }
                Err(crate::registry::v8::metadata::LayoutError::NotV8(_)) => {}
                Err(e) => self.v8_note = Some(e.to_string()),
            }
        }
    }

    /// Adds and removes framehop modules to match the mappings (files already parsed are
    /// reused).
    fn sync_modules(&mut self) {
        let wanted: HashMap<ModuleKey, Mapping> = (self.maps.iter())
            .filter(|m| m.exec && m.path.is_some())
            .map(|m| (ModuleKey::of(m), m.clone()))
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
                let module = Module::new(shown(m), m.start..m.end, *bias, info.section_info());
                self.unwinder.add_module(module);
            }
            self.modules.insert(k.clone(), added);
        }
    }

    /// Whether a mapping known covers `addr` (code), after looking it up if none did and the
    /// process's budget allows (see `procmaps::live`).
    fn cover(&mut self, addr: u64) -> bool {
        let now = std::time::Instant::now();
        let found =
            (self.lookups).cover(&mut Proc(self.pid), &mut self.maps, addr, Keep::Exec, now);
        if found != Lookup::Known {
            log::debug!(
                "pid {}: {addr:#x} outside the mappings known: {found:?} (lookups so far: {:?})",
                self.pid,
                self.lookups.reads
            );
        }
        match found {
            Lookup::Known => true,
            Lookup::Added => {
                self.sync_modules();
                true
            }
            Lookup::Missing | Lookup::Limited => false,
        }
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
        match self.modules.get(&ModuleKey::of(m)) {
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

    /// The V8 functions it named since the last call (see `V8Process::take_named`).
    pub fn take_v8_named(&mut self) -> Vec<u64> {
        self.v8.as_mut().map(|v| v.take_named()).unwrap_or_default()
    }

    /// What it has read of the process: its maps (whole and queried) and V8's heap.
    pub fn reads(&self) -> Reads {
        let mut r = self.lookups.reads;
        if let Some(v8) = &self.v8 {
            r += v8.memory().reads();
            r.v8_copied += v8.stats.copied;
            r.v8_sources_shared += v8.stats.sources_shared;
            r.v8_named_at_sample += v8.stats.at_sample;
        }
        r
    }

    /// The mapping that holds `addr`, as last read.
    pub fn mapping(&self, addr: u64) -> Option<&Mapping> {
        self.maps.find(addr)
    }

    /// The build id of the file of mapping `m`, in hex, if its unwind tables were read.
    fn build_id(&self, m: &Mapping) -> Option<String> {
        let (_, info) = self.modules.get(&ModuleKey::of(m))?.as_ref()?;
        info.build_id_hex.clone()
    }
}
