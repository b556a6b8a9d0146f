//! Who took the lock: process names and thread roles.
//!
//! A thread's role comes, in this order, from ids (the main thread's tid is its pid; a thread
//! of another process is `foreign`), from the name a runtime gave it (newer Node.js:
//! `WorkerThread` or the Worker's name, `libuv-worker`, `V8Worker`, inspector threads), and
//! otherwise from its start routine. Node 20 names no thread, but glibc keeps each thread's
//! start routine in its `struct pthread`, which the thread's fs base points to: the eBPF side
//! records the fs base, we read the routine's address from the process's memory and
//! symbolize it (blazesym). This works for threads that existed before we attached, and is
//! done once per thread, as soon as it is first seen.

use std::{
    collections::{HashMap, hash_map::Entry},
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use blazesym::symbolize::{
    Input, Symbolized, Symbolizer,
    source::{Elf, Source},
};
use profiler_common::COMM_LEN;
use serde::Serialize;

use crate::procmaps::Maps;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Main,
    Worker,
    Libuv,
    V8,
    Inspector,
    Addon,
    Other,
    Foreign,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Main => "main",
            Role::Worker => "worker",
            Role::Libuv => "libuv",
            Role::V8 => "v8",
            Role::Inspector => "inspector",
            Role::Addon => "addon",
            Role::Other => "other",
            Role::Foreign => "foreign",
        }
    }
}

/// A kernel comm (NUL-padded bytes) as text.
pub fn comm_str(comm: &[u8; COMM_LEN]) -> String {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(COMM_LEN);
    String::from_utf8_lossy(&comm[..end]).into_owned()
}

/// Role from ids and names alone; None when the start routine must decide.
fn role_from_ids_and_name(owner: u32, tid: u32, tgid: u32, comm: &str) -> Option<Role> {
    if tgid != owner {
        return Some(Role::Foreign);
    }
    if tid == owner {
        return Some(Role::Main);
    }
    role_from_name(comm)
}

/// Roles that runtimes announce in thread names (truncated to 15 bytes by the kernel).
fn role_from_name(comm: &str) -> Option<Role> {
    let lower = comm.to_ascii_lowercase();
    if lower.starts_with("libuv-worker") {
        Some(Role::Libuv)
    } else if lower.starts_with("v8worker") || lower.starts_with("v8 defaultworke") {
        Some(Role::V8)
    } else if lower.starts_with("workerthread") {
        Some(Role::Worker)
    } else if lower.contains("inspector") {
        Some(Role::Inspector)
    } else {
        None
    }
}

/// Role of a thread whose start routine is `symbol` in the file `module`.
fn role_from_start_routine(symbol: &str, module: Option<&Path>) -> Role {
    let in_addon = module
        .and_then(|m| m.file_name())
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.ends_with(".node"));
    if in_addon {
        Role::Addon
    } else if symbol.contains("worker::Worker::StartThread") {
        Role::Worker
    } else if symbol == "worker" || symbol.starts_with("uv__") && symbol.contains("worker") {
        // libuv's threadpool loop is a static function called `worker`.
        Role::Libuv
    } else if symbol.contains("PlatformWorkerThread") || symbol.contains("DelayedTaskScheduler") {
        Role::V8
    } else if symbol.to_ascii_lowercase().contains("inspector") {
        Role::Inspector
    } else {
        Role::Other
    }
}

/// Reads `len` bytes of process `pid` at `addr`; short or None where unmapped.
fn read_memory(pid: u32, addr: u64, len: usize) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: len,
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: len,
    };
    // SAFETY: the local iovec covers `buf`, which outlives the call; the kernel checks the
    // remote range and fails (EFAULT) or stops short instead of faulting.
    let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
    if n <= 0 {
        return None;
    }
    buf.truncate(n as usize);
    Some(buf)
}

extern "C" fn calibration_thread(arg: *mut libc::c_void) -> *mut libc::c_void {
    // On x86_64 glibc, pthread_self() is the thread's `struct pthread`, where the fs base points.
    // SAFETY: no preconditions.
    let me = unsafe { libc::pthread_self() } as u64;
    let want = [calibration_thread as *const () as u64, arg as u64];
    let Some(mem) = read_memory(std::process::id(), me, 4096) else {
        return std::ptr::null_mut();
    };
    let words: Vec<u64> = mem
        .chunks_exact(8)
        .map(|c| u64::from_ne_bytes(c.try_into().expect("8 bytes")))
        .collect();
    match words.windows(2).position(|w| w == want) {
        // +1 so that offset 0 is distinguishable from "not found".
        Some(i) => (i * 8 + 1) as *mut libc::c_void,
        None => std::ptr::null_mut(),
    }
}

/// Offset of `start_routine` in this glibc's `struct pthread`, found by starting a thread
/// with a known routine and argument and looking for that pair (it varies between glibc
/// versions, so it is never hard-coded).
pub fn start_routine_offset() -> Option<u64> {
    let mut t: libc::pthread_t = 0;
    let arg = 0x6d6c_7066_u64 as *mut libc::c_void; // any recognisable value
    // SAFETY: a joinable thread running a function that only reads memory through
    // process_vm_readv; joined right away.
    unsafe {
        if libc::pthread_create(&mut t, std::ptr::null(), calibration_thread, arg) != 0 {
            return None;
        }
        let mut ret: *mut libc::c_void = std::ptr::null_mut();
        if libc::pthread_join(t, &mut ret) != 0 || ret.is_null() {
            return None;
        }
        Some(ret as u64 - 1)
    }
}

/// The C library mapped into a process, as (device, inode) of its file.
fn libc_identity(pid: u32, maps: &Maps) -> Option<(u64, u64)> {
    let path = maps.iter().find_map(|m| {
        let p = m.path.as_ref()?;
        let name = p.file_name()?.to_str()?;
        (name.starts_with("libc.so") || name.starts_with("libc-")).then_some(p)
    })?;
    // Through /proc/PID/root, so that a process in another mount namespace is compared right.
    let m = fs::metadata(format!("/proc/{pid}/root{}", path.display())).ok()?;
    Some((m.dev(), m.ino()))
}

/// Thread roles, decided once per thread.
pub struct Roles {
    known: HashMap<(u32, u32), Role>,
    /// None: calibration failed (not glibc, or not x86_64); roles then come from names only.
    offset: Option<u64>,
    our_libc: Option<(u64, u64)>,
    /// Per process: its mappings, and whether it uses our C library (so that the calibrated
    /// offset applies to it).
    processes: HashMap<u32, (Maps, bool)>,
    /// Threads whose start routine was read but not yet symbolized.
    pending: HashMap<(u32, u32), StartSite>,
    symbolizer: Symbolizer,
}

impl Default for Roles {
    fn default() -> Self {
        let offset = if cfg!(target_arch = "x86_64") {
            start_routine_offset()
        } else {
            None
        };
        log::debug!("glibc struct pthread start_routine offset: {offset:?}");
        Roles {
            known: HashMap::new(),
            offset,
            our_libc: Maps::read(std::process::id())
                .ok()
                .and_then(|m| libc_identity(std::process::id(), &m)),
            processes: HashMap::new(),
            pending: HashMap::new(),
            symbolizer: Symbolizer::new(),
        }
    }
}

/// Where a thread started: the file and offset of its start routine (None: anonymous memory).
type StartSite = Option<(PathBuf, u64)>;

impl Roles {
    /// Notes a thread as soon as it is seen: what needs it alive (its start routine's address
    /// and mapping) is read now; symbolizing, which may take a while the first time for a big
    /// binary, waits until [`role`](Self::role) is asked.
    pub fn observe(&mut self, owner: u32, tid: u32, tgid: u32, comm: &[u8; COMM_LEN], fsbase: u64) {
        if self.known.contains_key(&(owner, tid)) || self.pending.contains_key(&(owner, tid)) {
            return;
        }
        match role_from_ids_and_name(owner, tid, tgid, &comm_str(comm)) {
            Some(r) => {
                self.known.insert((owner, tid), r);
            }
            None => match self.start_site(tgid, fsbase) {
                Some(site) => {
                    self.pending.insert((owner, tid), site);
                }
                None => {
                    self.known.insert((owner, tid), Role::Other);
                }
            },
        }
    }

    /// Role of thread `tid` (of process `tgid`, named `comm`, fs base `fsbase`) on the lock of
    /// process `owner`. Best called after [`observe`](Self::observe), while the thread lived.
    pub fn role(
        &mut self,
        owner: u32,
        tid: u32,
        tgid: u32,
        comm: &[u8; COMM_LEN],
        fsbase: u64,
    ) -> Role {
        self.observe(owner, tid, tgid, comm, fsbase);
        if let Some(r) = self.known.get(&(owner, tid)) {
            return *r;
        }
        let site = self.pending.remove(&(owner, tid)).flatten();
        self.classify(owner, tid, site)
    }

    /// Names a thread's start routine, decides its role and remembers it.
    fn classify(&mut self, owner: u32, tid: u32, site: StartSite) -> Role {
        let r = match site {
            None => role_from_start_routine("[anonymous]", None),
            Some((path, offset)) => {
                let name = self.symbolize(&path, offset);
                log::debug!("thread {tid} started in {name} ({})", path.display());
                role_from_start_routine(&name, Some(&path))
            }
        };
        self.known.insert((owner, tid), r);
        r
    }

    /// Symbolizes every pending start routine. Done before a report is built, so that the
    /// symbolizer's long-lived caches are not allocated among the report's short-lived data
    /// (which then returns to the system whole).
    pub fn resolve_pending(&mut self) {
        let pending: Vec<((u32, u32), StartSite)> = self.pending.drain().collect();
        for ((owner, tid), site) in pending {
            self.classify(owner, tid, site);
        }
    }

    /// Reads a thread's start routine and finds its mapping (needs the process alive).
    fn start_site(&mut self, pid: u32, fsbase: u64) -> Option<StartSite> {
        let offset = self.offset?;
        if fsbase == 0 {
            return None;
        }
        let addr = read_memory(pid, fsbase + offset, 8)
            .and_then(|w| Some(u64::from_ne_bytes(w.get(..8)?.try_into().ok()?)))
            .filter(|&a| a != 0);
        log::debug!(
            "pid {pid}: start routine at {:#x}: {addr:x?}",
            fsbase + offset
        );
        let addr = addr?;
        let our_libc = self.our_libc;
        let (maps, same) = match self.processes.entry(pid) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(v) => {
                let maps = Maps::read(pid).ok()?;
                let same = our_libc.is_some() && libc_identity(pid, &maps) == our_libc;
                v.insert((maps, same))
            }
        };
        if !*same {
            log::debug!("pid {pid}: another C library than ours, start routines not read");
            return None;
        }
        if maps.find(addr).is_none() {
            // A library loaded since we read the map (an addon's dlopen).
            *maps = Maps::read(pid).ok()?;
        }
        let m = maps.find(addr)?;
        Some(m.path.clone().map(|p| (p, m.file_offset(addr))))
    }

    /// The function at `offset` in the ELF file `path` (the file, not the process: this works
    /// after the process is gone).
    fn symbolize(&mut self, path: &Path, offset: u64) -> String {
        let src = Source::Elf(Elf::new(path));
        match self
            .symbolizer
            .symbolize_single(&src, Input::FileOffset(offset))
        {
            Ok(Symbolized::Sym(sym)) => sym.name.to_string(),
            other => {
                log::debug!("{}+{offset:#x}: {other:?}", path.display());
                format!("{}+{offset:#x}", path.display())
            }
        }
    }

    /// The start routine of a live thread of `pid`: its name and file.
    #[cfg(test)]
    pub fn start_routine(&mut self, pid: u32, fsbase: u64) -> Option<(String, Option<PathBuf>)> {
        match self.start_site(pid, fsbase)? {
            Some((path, offset)) => Some((self.symbolize(&path, offset), Some(path))),
            None => Some(("[anonymous]".into(), None)),
        }
    }
}

/// Process names, read once from /proc while the process lives.
#[derive(Default)]
pub struct ProcessNames {
    names: HashMap<u32, String>,
}

impl ProcessNames {
    /// The process's command name; `fallback` (a name seen in the kernel data) once it is gone.
    pub fn get(&mut self, pid: u32, fallback: Option<&str>) -> String {
        if let Some(n) = self.names.get(&pid) {
            return n.clone();
        }
        let name = match fs::read_to_string(format!("/proc/{pid}/comm")) {
            Ok(s) => s.trim_end().to_string(),
            Err(_) => return fallback.unwrap_or("?").to_string(),
        };
        self.names.insert(pid, name.clone());
        name
    }

    /// The name, if already known.
    pub fn cached(&self, pid: u32) -> Option<&str> {
        self.names.get(&pid).map(String::as_str)
    }

    /// Remember a live process's name now (before it can exit).
    pub fn prime(&mut self, pid: u32) {
        let _ = self.get(pid, None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_from_ids() {
        assert_eq!(
            role_from_ids_and_name(100, 100, 100, "node"),
            Some(Role::Main)
        );
        assert_eq!(role_from_ids_and_name(100, 101, 100, "node"), None);
        assert_eq!(
            role_from_ids_and_name(100, 200, 200, "node"),
            Some(Role::Foreign)
        );
        assert_eq!(
            role_from_ids_and_name(100, 200, 200, "WorkerThread"),
            Some(Role::Foreign)
        );
    }

    #[test]
    fn roles_from_runtime_thread_names() {
        let r = |c| role_from_ids_and_name(1, 2, 1, c);
        assert_eq!(r("WorkerThread"), Some(Role::Worker));
        assert_eq!(r("libuv-worker"), Some(Role::Libuv));
        assert_eq!(r("V8Worker"), Some(Role::V8));
        assert_eq!(r("V8 DefaultWorke"), Some(Role::V8));
        assert_eq!(r("node inspector"), Some(Role::Inspector));
        assert_eq!(Role::Libuv.as_str(), "libuv");
    }

    #[test]
    fn roles_from_node_20_start_routines() {
        let node = Some(Path::new("/usr/bin/node"));
        let r = role_from_start_routine;
        assert_eq!(
            r(
                "node::worker::Worker::StartThread(v8::FunctionCallbackInfo<v8::Value> const&)::{lambda(void*)#1}::_FUN(void*)",
                node
            ),
            Role::Worker
        );
        assert_eq!(r("worker", node), Role::Libuv);
        assert_eq!(
            r(
                "node::(anonymous namespace)::PlatformWorkerThread(void*)",
                node
            ),
            Role::V8
        );
        assert_eq!(
            r(
                "node::inspector::(anonymous namespace)::StartIoThreadMain(void*)",
                node
            ),
            Role::Inspector
        );
        assert_eq!(
            r("spin", Some(Path::new("/x/build/Release/churn.node"))),
            Role::Addon
        );
        assert_eq!(r("start_thread_of_something", node), Role::Other);
    }

    #[test]
    fn comm_bytes_to_text() {
        let mut c = [0u8; COMM_LEN];
        c[..4].copy_from_slice(b"node");
        assert_eq!(comm_str(&c), "node");
        assert_eq!(comm_str(&[b'x'; COMM_LEN]), "x".repeat(COMM_LEN));
    }

    #[test]
    fn own_process_name_from_proc() {
        let mut names = ProcessNames::default();
        let me = std::process::id();
        let expected = fs::read_to_string("/proc/self/comm").unwrap();
        assert_eq!(names.get(me, None), expected.trim_end());
        assert_eq!(names.get(u32::MAX - 1, Some("gone")), "gone");
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn start_routine_of_a_live_thread_is_found_and_symbolized() {
        extern "C" fn mlp_test_thread_body(_: *mut libc::c_void) -> *mut libc::c_void {
            std::thread::sleep(std::time::Duration::from_millis(300));
            std::ptr::null_mut()
        }
        let mut roles = Roles::default();
        let offset = roles.offset.expect("glibc start_routine offset");
        assert!(offset > 0 && offset < 4096);
        // A second thread of this process, with a start routine we know.
        let mut t: libc::pthread_t = 0;
        // SAFETY: joinable thread, joined below.
        assert_eq!(
            unsafe {
                libc::pthread_create(
                    &mut t,
                    std::ptr::null(),
                    mlp_test_thread_body,
                    std::ptr::null_mut(),
                )
            },
            0
        );
        // Its fs base is its struct pthread (pthread_t on x86_64 glibc).
        let (name, module) = roles
            .start_routine(std::process::id(), t as u64)
            .expect("start routine");
        // SAFETY: joining the thread created above.
        unsafe { libc::pthread_join(t, std::ptr::null_mut()) };
        assert!(name.contains("mlp_test_thread_body"), "{name}");
        assert_eq!(module.as_deref(), std::env::current_exe().ok().as_deref());
    }
}
