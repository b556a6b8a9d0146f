//! Who took the lock: each thread's role, per process, decided once (the rules are in
//! `role`, process names in `names`).
//!
//! Node 20 names no thread, but glibc keeps each thread's start routine in its `struct
//! pthread`, which the thread's fs base points to: a thread reads its own as the eBPF side
//! announces it (at its first lock), or we read it from the process's memory, then find its
//! mapping and symbolize it (blazesym). This works for threads that existed before we
//! attached, and is done once per thread, as soon as it is first seen. A start routine in a
//! library that only an addon needs (libvips's threads behind sharp) makes the thread the
//! addon's (`addonlibs`), with the library named.

use std::{
    collections::{HashMap, hash_map::Entry},
    path::PathBuf,
    sync::Arc,
};

use profiler_common::COMM_LEN;

pub use crate::registry::role::{Decided, Role, comm_str, role_by_ids_and_name};
use crate::{
    registry::addonlibs::{self, AddonOrigin},
    registry::procmaps::{Keep, Lookups, Maps, Proc, readable_path},
    registry::reads::Reads,
    registry::role::{role_from_ids_and_name, role_from_start_routine},
    registry::start_names::{FileId, StartNames},
    registry::threadstart::{
        KnownLibcs, LibcIdentity, libc_identity, libc_identity_known, read_memory,
        start_routine_offset,
    },
    vocab::ids::{self, ProcId, ThreadId},
};

/// What the kernel saw of a thread taking a lock: enough to decide its role there. Taken
/// from a reading or a new thread's announcement, while the thread lived.
#[derive(Clone, Copy, Debug)]
pub struct SeenThread {
    /// The process whose lock it took.
    pub owner: ProcId,
    pub thread: ThreadId,
    /// Its own process (another than `owner` for a foreign thread).
    pub tgid: u32,
    pub comm: [u8; COMM_LEN],
    /// Where its glibc `struct pthread` is, which holds its start routine.
    pub fsbase: u64,
}

/// Where a thread started: the start routine's file, as mapped (its name: an addon's ends in
/// `.node`) and where we read it (`procmaps::readable_path`), and its offset in it (None:
/// anonymous memory).
type StartSite = Option<(Site, u64)>;

#[derive(Clone, Debug)]
struct Site {
    /// The file (device, inode), which its start routines' names are kept by.
    file: FileId,
    mapped: PathBuf,
    readable: PathBuf,
    /// The addon, when the file is one or a library behind one: decided while the process
    /// lives (its files are read), used if the routine's name says nothing else.
    origin: Option<Arc<AddonOrigin>>,
}

/// What is known of one thread on one lock.
enum ThreadRole {
    Known(Decided),
    /// Start routine read while the thread lived, not yet symbolized.
    Pending(StartSite),
}

/// One process (a lock's owner) as far as roles go.
#[derive(Default)]
struct ProcessEntry {
    /// Its mappings, and whether it uses our C library (so that the calibrated offset applies
    /// to it); read when a start routine of one of its threads is first needed.
    maps: Option<(Maps, bool)>,
    /// Its mapped libraries, each with the addon it is behind (None: not behind one),
    /// decided the first time a thread starts in a library it does not know.
    behind: addonlibs::Behind,
    /// The site of each mapping a start routine was found in (by the mapping's start), found
    /// while the process lived: a thread announced as its process ends, with the routine it
    /// read itself, is placed from here once the process is gone.
    sites: HashMap<u64, Site>,
    /// When its maps were first read (boot-clock ns): before an exec, they were the old
    /// image's.
    maps_read_ns: u64,
    /// Its lookups of start routines outside the maps read (each may take its mmap_lock),
    /// its maps' reads counted with them.
    lookups: Lookups,
    /// Its start routines read from its memory (`memory`, `memory_ranges`).
    memory: Reads,
    /// The threads seen taking its lock: its own, and foreign ones.
    threads: HashMap<ThreadId, ThreadRole>,
}

/// Thread roles, decided once per thread, per lock owner. A process (pid and start time)
/// and a thread (tid and start time) are forgotten when they exit; a reused pid or tid is a
/// new process or thread, with its own maps and role.
pub struct Roles {
    /// Where `start_routine` is from a thread's fs base (`kernel::pthread`). None:
    /// calibration failed (not glibc, or neither x86_64 nor arm64); roles then come from
    /// names only.
    offset: Option<i32>,
    /// Our C library, by build id: a process using the same build (a container's copy
    /// included) keeps `start_routine` at the calibrated offset.
    our_libc: Option<LibcIdentity>,
    /// The C libraries of the processes seen, read once each.
    libcs: KnownLibcs,
    processes: HashMap<ProcId, ProcessEntry>,
    symbolizer: StartNames,
    /// The profiler's own pid: its threads are `profiler` (settable for tests, which use
    /// their own process as a target).
    pub(super) profiler: u32,
}

impl ProcessEntry {
    fn reads(&self) -> Reads {
        let mut r = self.lookups.reads;
        r += self.memory;
        r
    }
}

impl Default for Roles {
    fn default() -> Self {
        let offset = start_routine_offset();
        log::debug!("glibc struct pthread start_routine offset: {offset:?}");
        Roles {
            offset,
            our_libc: Maps::read(std::process::id())
                .ok()
                .and_then(|m| libc_identity(std::process::id(), &m)),
            libcs: KnownLibcs::new(),
            processes: HashMap::new(),
            symbolizer: StartNames::default(),
            profiler: std::process::id(),
        }
    }
}

impl Roles {
    /// Notes a thread as soon as it is seen: what needs it alive (its start routine's address
    /// and mapping) is read now; symbolizing, which may take a while the first time for a big
    /// binary, waits until [`decide`](Self::decide) is asked. `start_routine`: the one the
    /// thread read itself as the kernel announced it (0: not read, we read it).
    pub fn observe(&mut self, seen: &SeenThread, start_routine: u64) {
        let SeenThread {
            owner,
            thread,
            tgid,
            comm,
            fsbase,
        } = *seen;
        if self
            .processes
            .get(&owner)
            .is_some_and(|e| e.threads.contains_key(&thread))
        {
            return;
        }
        let known = match role_from_ids_and_name(
            owner.pid,
            thread.tid,
            tgid,
            &comm_str(&comm),
            self.profiler,
        ) {
            Some(r) => ThreadRole::Known(r.into()),
            // Here tgid == owner.pid: the thread is the owner's own.
            None => match self.start_site(owner, fsbase, start_routine) {
                Some(site) => ThreadRole::Pending(site),
                None => ThreadRole::Known(Role::Other.into()),
            },
        };
        self.processes
            .entry(owner)
            .or_default()
            .threads
            .insert(thread, known);
    }

    /// The role of a thread on its owner's lock, with an addon thread's origin. Best called
    /// after [`observe`](Self::observe), while the thread lived.
    pub fn decide(&mut self, seen: &SeenThread) -> Decided {
        self.observe(seen, 0);
        self.cached_role(seen.owner, seen.thread)
            .expect("observed just above")
    }

    /// The role of a thread already observed, without noting anything new: a report asks
    /// this, so that it can never bring back a thread or process that was forgotten.
    pub fn cached_role(&mut self, owner: ProcId, thread: ThreadId) -> Option<Decided> {
        let Roles {
            processes,
            symbolizer,
            ..
        } = self;
        let known = processes.get_mut(&owner)?.threads.get_mut(&thread)?;
        Some(resolve(symbolizer, thread, known))
    }

    /// Symbolizes every pending start routine. Done before a report is built, so that the
    /// symbolizer's long-lived caches are not allocated among the report's short-lived data
    /// (which then returns to the system whole).
    pub fn resolve_pending(&mut self) {
        for e in self.processes.values_mut() {
            for (&thread, known) in &mut e.threads {
                resolve(&self.symbolizer, thread, known);
            }
        }
    }

    /// Forgets a thread that exited, on the lock of `owner` (ask its [`decide`](Self::decide)
    /// first). A thread seen on several locks is forgotten once per owner.
    pub fn forget_thread(&mut self, owner: ProcId, thread: ThreadId) {
        if let Entry::Occupied(mut e) = self.processes.entry(owner) {
            e.get_mut().threads.remove(&thread);
            // What was read of it stays until the process is forgotten: the run's summary
            // counts it.
            let left = e.get();
            if left.threads.is_empty() && left.maps.is_none() && left.reads().is_empty() {
                e.remove();
            }
        }
    }

    /// A process exec'd at `exec_ns` (boot clock): its maps, the libraries behind its addons
    /// and the sites found in them, if read before that, were the old image's and go. The
    /// roles decided for its threads stay: an exec changes no thread's role (its main thread
    /// is `main` by its ids before and after; an old image's thread keeps the role it had
    /// there until it is retired), and the window being read may hold their writes already,
    /// which its report attributes by asking [`cached_role`](Self::cached_role). The notice
    /// comes after the exec's own writes, often after a reading that read them.
    pub fn forget_image(&mut self, p: ProcId, exec_ns: u64) {
        if let Some(e) = self.processes.get_mut(&p)
            && e.maps_read_ns < exec_ns
        {
            e.maps = None;
            e.behind.clear();
            e.sites.clear();
        }
    }

    /// Forgets a process that exited: its maps, its C library, and the threads still noted
    /// on its lock. What was read of it is returned, for the run's summary.
    pub fn forget_process(&mut self, p: ProcId) -> Reads {
        self.processes
            .remove(&p)
            .map_or_else(Reads::default, |e| e.reads())
    }

    /// What has been read of `p` for its threads' roles (since it was last forgotten).
    pub fn reads(&self, p: ProcId) -> Reads {
        self.processes
            .get(&p)
            .map_or_else(Reads::default, ProcessEntry::reads)
    }

    /// Counts reads of `p` as if they had been made (tests of what the run keeps of them).
    #[cfg(test)]
    pub fn note_reads(&mut self, p: ProcId, read: Reads) {
        self.processes.entry(p).or_default().memory += read;
    }

    /// Threads with a role (or a pending start routine) in memory.
    #[cfg(test)]
    pub fn cached_threads(&self) -> usize {
        self.processes.values().map(|e| e.threads.len()).sum()
    }

    /// Processes with threads or maps in memory.
    #[cfg(test)]
    pub fn cached_processes(&self) -> usize {
        self.processes.len()
    }

    /// Reads a thread's start routine (unless the thread read it, `known`) and finds its
    /// mapping, in the memory of `owner` (the thread's own process). None when the process is
    /// gone, or its pid is another's now, unless the thread's own reading falls in a mapping
    /// placed while the process lived.
    fn start_site(&mut self, owner: ProcId, fsbase: u64, known: u64) -> Option<StartSite> {
        let offset = self.offset?;
        if fsbase == 0 {
            return None;
        }
        let pid = owner.pid;
        let addr = if known != 0 {
            Some(known)
        } else {
            let word = read_memory(pid, fsbase.wrapping_add_signed(offset.into()), 8);
            // Counted with the process's other reads, in its entry: made for a read that
            // succeeded only (one that failed may be of a process gone, which nothing would
            // forget).
            let entry = match word {
                Some(_) => Some(self.processes.entry(owner).or_default()),
                None => self.processes.get_mut(&owner),
            };
            if let Some(e) = entry {
                e.memory.memory += 1;
                e.memory.memory_ranges += 1;
            }
            word.and_then(|w| Some(u64::from_ne_bytes(w.get(..8)?.try_into().ok()?)))
                .filter(|&a| a != 0)
        };
        log::debug!(
            "pid {pid}: start routine at {:#x}: {addr:x?}{}",
            fsbase.wrapping_add_signed(offset.into()),
            if known != 0 {
                " (read by the thread)"
            } else {
                ""
            }
        );
        let addr = addr?;
        let our_libc = &self.our_libc;
        let entry = self.processes.entry(owner).or_default();
        // Placed while the process lived (the maps and the C library were its own then).
        if known != 0
            && let Some((maps, true)) = &entry.maps
            && let Some(m) = maps.find(addr)
            && let Some(site) = entry.sites.get(&m.start)
        {
            return Some(Some((site.clone(), m.file_offset(addr))));
        }
        let (maps, same) = match &mut entry.maps {
            Some(m) => m,
            None => {
                let read_ns = ids::boot_ns();
                let maps = entry.lookups.read(&mut Proc(pid), Keep::Code).ok()?;
                let same = our_libc.is_some()
                    && libc_identity_known(pid, &maps, &mut self.libcs) == *our_libc;
                entry.maps_read_ns = read_ns;
                entry.maps.insert((maps, same))
            }
        };
        if !*same {
            log::debug!("pid {pid}: another C library than ours, start routines not read");
            return None;
        }
        // A library loaded since we read the map (an addon's dlopen): its mapping, looked up
        // as the process's budget allows.
        let now = std::time::Instant::now();
        (entry.lookups).cover(&mut Proc(pid), maps, addr, Keep::Code, now);
        // The file as mapped (a container's, a replaced one), found now while it lives.
        let site = maps.find(addr).map(|m| {
            let mapped = m.path.clone()?;
            let readable = readable_path(pid, m)?;
            let origin = addonlibs::origin(pid, maps, &mut entry.behind, &mapped);
            Some((
                m.start,
                Site {
                    file: (m.dev.clone(), m.inode),
                    mapped,
                    readable,
                    origin,
                },
                m.file_offset(addr),
            ))
        });
        // The kernel saw `owner` before the reads above; alive now, it is the process they
        // read, not a newer one under the same pid.
        if !ids::is_alive(owner) {
            log::debug!("process {owner:?} is gone: its pid's memory is not its own");
            entry.maps = None;
            entry.behind.clear();
            entry.sites.clear();
            return None;
        }
        site.map(|s| {
            s.map(|(start, site, offset)| {
                entry.sites.insert(start, site.clone());
                (site, offset)
            })
        })
    }

    /// The start routine of a live thread of `p`: its name and file.
    #[cfg(test)]
    pub fn start_routine(&mut self, p: ProcId, fsbase: u64) -> Option<(String, Option<PathBuf>)> {
        match self.start_site(p, fsbase, 0)? {
            Some((site, offset)) => Some((
                symbolize(&self.symbolizer, &site, offset),
                Some(site.mapped),
            )),
            None => Some(("[anonymous]".into(), None)),
        }
    }
}

/// Decides a thread's role from its start routine if that is pending, and remembers it.
fn resolve(symbolizer: &StartNames, thread: ThreadId, known: &mut ThreadRole) -> Decided {
    let d = match known {
        ThreadRole::Known(d) => return d.clone(),
        ThreadRole::Pending(None) => role_from_start_routine("[anonymous]", None).into(),
        ThreadRole::Pending(Some((site, offset))) => {
            let (name, path) = (symbolize(symbolizer, site, *offset), &site.mapped);
            log::debug!(
                "thread {} started in {name} ({})",
                thread.tid,
                path.display()
            );
            let start = Some(Arc::from(name.as_str()));
            match role_from_start_routine(&name, Some(path)) {
                // Started in the addon itself.
                Role::Addon => Decided {
                    role: Role::Addon,
                    origin: site.origin.clone(),
                    start,
                },
                // Nothing in the name: in a library behind an addon, the thread is the addon's.
                Role::Other if site.origin.is_some() => Decided {
                    role: Role::Addon,
                    origin: site.origin.clone(),
                    start,
                },
                role => Decided {
                    role,
                    origin: None,
                    start,
                },
            }
        }
    };
    *known = ThreadRole::Known(d.clone());
    d
}

/// The function at `offset` in the start routine's ELF file (the file, not the process: this
/// works after the process is gone).
fn symbolize(symbolizer: &StartNames, site: &Site, offset: u64) -> String {
    symbolizer.name(&site.file, &site.readable, &site.mapped, offset)
}

#[cfg(test)]
#[path = "roles_tests.rs"]
pub(crate) mod tests;
