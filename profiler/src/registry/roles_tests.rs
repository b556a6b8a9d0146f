//! Roles and names: the rules, and caches keyed by process and thread *and* start time.

use std::{fs, path::Path};

use super::*;
use crate::registry::names::ProcessNames;

/// This process as the kernel names it.
pub(crate) fn me() -> ProcId {
    ProcId::of_live(std::process::id()).unwrap()
}

/// Another process that had this pid: same pid, an earlier start time.
pub(crate) fn my_predecessor() -> ProcId {
    let p = me();
    ProcId::new(p.pid, p.start.saturating_sub(1000))
}

fn comm(name: &str) -> [u8; COMM_LEN] {
    let mut c = [0u8; COMM_LEN];
    c[..name.len()].copy_from_slice(name.as_bytes());
    c
}

/// A thread as the kernel saw it on `owner`'s lock: of process `tgid`, named `name`, with no
/// fs base (its start routine cannot be read).
fn seen(owner: ProcId, thread: ThreadId, tgid: u32, name: &str) -> SeenThread {
    SeenThread {
        owner,
        thread,
        tgid,
        comm: comm(name),
        fsbase: 0,
    }
}

/// One of `owner`'s own threads, unnamed, its `struct pthread` at `fsbase`.
fn own(owner: ProcId, thread: ThreadId, fsbase: u64) -> SeenThread {
    SeenThread {
        fsbase,
        ..seen(owner, thread, owner.pid, "")
    }
}

/// Roles as a target sees them: this test process is not the profiler there.
fn in_a_target() -> Roles {
    Roles {
        profiler: 0,
        ..Roles::default()
    }
}

#[test]
fn roles_from_ids() {
    // (owner, tid, tgid, comm, the profiler's pid): role.
    for (ids, role) in [
        ((100, 100, 100, "node", 0), Some(Role::Main)),
        ((100, 101, 100, "node", 0), None),
        ((100, 200, 200, "node", 0), Some(Role::Foreign)),
        ((100, 200, 200, "WorkerThread", 0), Some(Role::Foreign)),
        // The profiler's own threads, whoever's lock they take (their own included).
        ((100, 200, 200, "mmaplock-prof", 200), Some(Role::Profiler)),
        ((200, 200, 200, "mmaplock-prof", 200), Some(Role::Profiler)),
    ] {
        let (owner, tid, tgid, comm, profiler) = ids;
        assert_eq!(
            role_from_ids_and_name(owner, tid, tgid, comm, profiler),
            role,
            "{ids:?}"
        );
    }
}

#[test]
fn roles_from_runtime_thread_names() {
    let r = |c| role_from_ids_and_name(1, 2, 1, c, 0);
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
    assert_eq!(comm_str(&comm("node")), "node");
    assert_eq!(comm_str(&[b'x'; COMM_LEN]), "x".repeat(COMM_LEN));
}

#[test]
fn own_process_name_from_proc() {
    let mut names = ProcessNames::default();
    let expected = fs::read_to_string("/proc/self/comm").unwrap();
    assert_eq!(names.get(me(), None), expected.trim_end());
    assert_eq!(names.cached(me()), Some(expected.trim_end()));
    assert_eq!(
        names.get(ProcId::new(u32::MAX - 1, 0), Some("gone")),
        "gone"
    );
    assert_eq!(names.len(), 1);
}

#[test]
fn a_reused_pid_does_not_name_the_process_before_it() {
    let mut names = ProcessNames::default();
    // The process that had our pid before us is gone: its name is what the kernel said.
    names.prime(my_predecessor());
    assert_eq!(names.cached(my_predecessor()), None);
    assert_eq!(names.get(my_predecessor(), Some("old")), "old");
    assert_eq!(names.get(my_predecessor(), None), "?");
    assert_eq!(names.len(), 0);
    // We are named from /proc, and forgotten on exit.
    names.prime(me());
    assert!(names.cached(me()).is_some());
    assert_eq!(names.len(), 1);
    names.forget(my_predecessor());
    assert_eq!(names.len(), 1);
    names.forget(me());
    assert_eq!(names.len(), 0);
    assert_eq!(names.cached(me()), None);
}

#[test]
fn a_reused_pid_or_tid_gets_a_fresh_role_and_forgetting_empties_the_caches() {
    let mut roles = Roles::default();
    let (old, new) = (ProcId::new(100, 1_000), ProcId::new(100, 9_000));
    let (old_t, new_t) = (ThreadId::new(101, 2_000), ThreadId::new(101, 9_500));
    let role = |roles: &mut Roles, p, t, c| roles.decide(&seen(p, t, 100, c)).role;
    assert_eq!(role(&mut roles, old, old_t, "WorkerThread"), Role::Worker);
    // Decided once: a later name does not change it.
    assert_eq!(role(&mut roles, old, old_t, "libuv-worker"), Role::Worker);
    // Pid 100 reused, tid 101 too: a new process, a new thread, a new role.
    assert_eq!(role(&mut roles, new, new_t, "libuv-worker"), Role::Libuv);
    // Tid 101 reused inside the old process.
    let reused_t = ThreadId::new(101, 5_000);
    assert_eq!(role(&mut roles, old, reused_t, "V8Worker"), Role::V8);
    // A foreign thread on the new process's lock.
    let foreign = ThreadId::new(300, 1);
    assert_eq!(
        roles.decide(&seen(new, foreign, 300, "ps")).role,
        Role::Foreign
    );
    assert_eq!(roles.cached_threads(), 4);
    assert_eq!(roles.cached_processes(), 2);

    roles.forget_thread(old, old_t);
    assert_eq!(roles.cached_threads(), 3);
    // Forgetting under the wrong process or start time forgets nothing.
    roles.forget_thread(new, reused_t);
    roles.forget_thread(old, new_t);
    roles.forget_process(ProcId::new(100, 5));
    assert_eq!(roles.cached_threads(), 3);
    roles.forget_process(old);
    assert_eq!((roles.cached_threads(), roles.cached_processes()), (2, 1));
    roles.forget_thread(new, new_t);
    roles.forget_thread(new, foreign);
    assert_eq!((roles.cached_threads(), roles.cached_processes()), (0, 0));
}

/// A thread of this process, asleep in [`mlp_test_thread_body`] for a while, joined on drop.
#[cfg(target_arch = "x86_64")]
struct SleepingThread(libc::pthread_t);

#[cfg(target_arch = "x86_64")]
extern "C" fn mlp_test_thread_body(_: *mut libc::c_void) -> *mut libc::c_void {
    std::thread::sleep(std::time::Duration::from_millis(300));
    std::ptr::null_mut()
}

#[cfg(target_arch = "x86_64")]
impl SleepingThread {
    fn start() -> SleepingThread {
        let mut t: libc::pthread_t = 0;
        // SAFETY: a joinable thread with no argument, joined on drop.
        let rc = unsafe {
            libc::pthread_create(
                &mut t,
                std::ptr::null(),
                mlp_test_thread_body,
                std::ptr::null_mut(),
            )
        };
        assert_eq!(rc, 0);
        SleepingThread(t)
    }

    /// Its fs base: its struct pthread (pthread_t on x86_64 glibc).
    fn fsbase(&self) -> u64 {
        self.0
    }
}

#[cfg(target_arch = "x86_64")]
impl Drop for SleepingThread {
    fn drop(&mut self) {
        // SAFETY: the thread created by `start`, joined once.
        unsafe { libc::pthread_join(self.0, std::ptr::null_mut()) };
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn start_routine_of_a_live_thread_is_found_and_symbolized_in_its_own_process_only() {
    let mut roles = in_a_target();
    let offset = roles.offset.expect("glibc start_routine offset");
    assert!(offset > 0 && offset < 4096);
    // A second thread of this process, with a start routine we know.
    let t = SleepingThread::start();
    let found = roles.start_routine(me(), t.fsbase());
    // Under the pid of a process that is gone, nothing is read: our memory is not its.
    let stale = roles.start_routine(my_predecessor(), t.fsbase());
    // Through the cache: observed now, symbolized when asked.
    let thread = ThreadId::new(u32::MAX, 1);
    roles.observe(&own(me(), thread, t.fsbase()), 0);
    roles.observe(&own(my_predecessor(), thread, t.fsbase()), 0);
    drop(t);

    let (name, module) = found.expect("start routine");
    assert!(name.contains("mlp_test_thread_body"), "{name}");
    assert_eq!(module.as_deref(), std::env::current_exe().ok().as_deref());
    assert_eq!(stale, None);
    // Maps are kept per process: ours are, the predecessor's were never taken from our pid.
    assert!(roles.processes[&me()].maps.is_some());
    assert!(roles.processes[&my_predecessor()].maps.is_none());
    assert!(matches!(
        roles.processes[&me()].threads[&thread],
        ThreadRole::Pending(Some(_))
    ));
    roles.resolve_pending();
    assert!(matches!(
        roles.processes[&me()].threads[&thread],
        ThreadRole::Known(Decided {
            role: Role::Other,
            origin: None
        })
    ));
    assert_eq!(roles.decide(&own(me(), thread, 0)).role, Role::Other);
    roles.forget_process(me());
    roles.forget_process(my_predecessor());
    assert_eq!((roles.cached_threads(), roles.cached_processes()), (0, 0));
}

/// A thread announced with the start routine it read itself is placed from the mappings and
/// sites found while its process lived, even once the process is gone; without that reading,
/// or in a mapping not placed while it lived, it is not (the pid's memory is no longer its).
#[cfg(target_arch = "x86_64")]
#[test]
fn a_start_routine_read_by_its_thread_is_placed_after_its_process_is_gone() {
    let mut roles = in_a_target();
    let t = SleepingThread::start();
    let fsbase = t.fsbase();
    // While the process lives: its maps, and the site of the mapping the routine is in.
    roles.observe(&own(me(), ThreadId::new(u32::MAX, 1), fsbase), 0);
    drop(t);
    // The same process, gone: what was learnt of it is kept under its id (pid and start).
    let gone = my_predecessor();
    let entry = roles.processes.remove(&me()).expect("observed");
    assert_eq!(entry.sites.len(), 1);
    roles.processes.insert(gone, entry);
    let routine = mlp_test_thread_body as *const () as u64;
    let read_by_itself = ThreadId::new(u32::MAX - 1, 1);
    let not_read = ThreadId::new(u32::MAX - 2, 1);
    let elsewhere = ThreadId::new(u32::MAX - 3, 1);
    // An address in no mapping placed while it lived (our stack).
    let local = 0u64;
    let stack = std::ptr::from_ref(&local) as u64;
    for (thread, start_routine) in [(read_by_itself, routine), (not_read, 0), (elsewhere, stack)] {
        roles.observe(&own(gone, thread, fsbase), start_routine);
    }
    let threads = &roles.processes[&gone].threads;
    assert!(matches!(
        threads[&read_by_itself],
        ThreadRole::Pending(Some(_))
    ));
    for t in [not_read, elsewhere] {
        assert!(matches!(
            threads[&t],
            ThreadRole::Known(Decided {
                role: Role::Other,
                origin: None
            })
        ));
    }
    // And it is symbolized as the routine it is.
    let ThreadRole::Pending(Some((site, offset))) = &threads[&read_by_itself] else {
        unreachable!()
    };
    let name = symbolize(&roles.symbolizer, site, *offset);
    assert!(name.contains("mlp_test_thread_body"), "{name}");
}

/// An exec's notice is read at the next reading, maybe after a short process's end: the
/// threads its new image started keep their roles though they are gone; the old image's
/// threads, and the maps read before the exec, are forgotten.
#[test]
fn an_exec_read_late_keeps_the_new_images_threads_and_drops_the_old_ones() {
    let mut roles = in_a_target();
    let p = ProcId::new(4_000_000, 100);
    let ns_per_tick = 1_000_000_000 / ids::clock_ticks();
    let exec_ns = 200 * ns_per_tick + 1;
    let old = ThreadId::new(4_000_001, 150);
    let new = ThreadId::new(4_000_002, 203);
    let main = ThreadId::new(p.pid, p.start);
    for t in [old, new, main] {
        roles.observe(&seen(p, t, p.pid, "V8Worker"), 0);
    }
    // Maps read at `ns`.
    let read_maps = |roles: &mut Roles, ns| {
        let e = roles.processes.get_mut(&p).unwrap();
        (e.maps_read_ns, e.maps) = (ns, Some((Maps::default(), true)));
    };
    // Maps read before the exec are the old image's.
    read_maps(&mut roles, exec_ns - 1);
    // Nothing of the process is alive any more.
    roles.forget_image(p, exec_ns, |_| false);
    let e = &roles.processes[&p];
    assert!(e.maps.is_none());
    let mut kept: Vec<_> = e.threads.keys().copied().collect();
    kept.sort();
    assert_eq!(kept, vec![new]);
    // Maps read after it are the new image's, and stay.
    read_maps(&mut roles, exec_ns + 1);
    roles.forget_image(p, exec_ns, |_| false);
    assert!(roles.processes[&p].maps.is_some());
    assert!(roles.processes[&p].threads.contains_key(&new));
}

mod addon_libraries {
    use super::*;
    use crate::registry::addonlibs::{Linked, behind_addons, linked_objects, read_dynamic};

    fn lib(path: &str, soname: Option<&str>, needed: &[&str]) -> Linked {
        Linked {
            path: path.into(),
            soname: soname.map(Into::into),
            needed: Some(needed.iter().map(|n| n.to_string()).collect()),
        }
    }

    const SHARP: &str = "/app/node_modules/@img/sharp-linux-x64/lib/sharp-linux-x64.node";
    const VIPS: &str = "/app/node_modules/@img/sharp-libvips-linux-x64/lib/libvips-cpp.so.8.17.1";

    /// A process as sharp's makes it: node (which needs libstdc++ and the C library), sharp's
    /// addon, the libvips it needs (by soname, a file of another name), and what libvips needs.
    fn sharp_process() -> Vec<Linked> {
        vec![
            lib(
                "/usr/bin/node",
                None,
                &["libstdc++.so.6", "libm.so.6", "libc.so.6"],
            ),
            lib(
                "/usr/lib/x86_64-linux-gnu/libstdc++.so.6.0.33",
                Some("libstdc++.so.6"),
                &["libm.so.6", "libc.so.6", "libgcc_s.so.1"],
            ),
            lib(
                "/usr/lib/x86_64-linux-gnu/libm.so.6",
                Some("libm.so.6"),
                &["libc.so.6"],
            ),
            // No soname: found by its file name.
            lib(
                "/usr/lib/x86_64-linux-gnu/libgcc_s.so.1",
                None,
                &["libc.so.6"],
            ),
            lib(
                "/usr/lib/x86_64-linux-gnu/libc.so.6",
                Some("libc.so.6"),
                &["ld-linux-x86-64.so.2"],
            ),
            lib(
                "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
                Some("ld-linux-x86-64.so.2"),
                &[],
            ),
            lib(
                SHARP,
                None,
                &[
                    "libvips-cpp.so.42",
                    "libstdc++.so.6",
                    "libgcc_s.so.1",
                    "libc.so.6",
                ],
            ),
            lib(
                VIPS,
                Some("libvips-cpp.so.42"),
                &["libglib-2.0.so.0", "libstdc++.so.6", "libc.so.6"],
            ),
            // Needed by path (linked without -l).
            lib(
                "/usr/lib/x86_64-linux-gnu/libglib-2.0.so.0.7400.0",
                Some("libglib-2.0.so.0"),
                &["/opt/extra/libextra.so", "libc.so.6"],
            ),
            lib("/opt/extra/libextra.so", None, &["libc.so.6"]),
            // Another addon, needing glib too: it is the first addon's (in map order).
            lib("/app/build/Release/other.node", None, &["libglib-2.0.so.0"]),
        ]
    }

    #[test]
    fn a_library_only_an_addon_needs_is_the_addons_and_what_node_needs_never_is() {
        let objects = sharp_process();
        let behind = behind_addons(&objects, Path::new("/usr/bin/node"));
        let addon_of = |p: &str| behind.get(Path::new(p)).map(|a| a.to_str().unwrap());
        assert_eq!(addon_of(VIPS), Some(SHARP));
        assert_eq!(
            addon_of("/usr/lib/x86_64-linux-gnu/libglib-2.0.so.0.7400.0"),
            Some(SHARP)
        );
        assert_eq!(addon_of("/opt/extra/libextra.so"), Some(SHARP));
        // What node needs itself, directly or not, is never an addon's, though the addons
        // need it too.
        for own in [
            "/usr/bin/node",
            "/usr/lib/x86_64-linux-gnu/libstdc++.so.6.0.33",
            "/usr/lib/x86_64-linux-gnu/libm.so.6",
            "/usr/lib/x86_64-linux-gnu/libgcc_s.so.1",
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
            "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
        ] {
            assert_eq!(addon_of(own), None, "{own}");
        }
        // An addon is not a library behind itself or another addon.
        assert_eq!(addon_of(SHARP), None);
        assert_eq!(addon_of("/app/build/Release/other.node"), None);
        assert_eq!(behind.len(), 3, "{behind:?}");
    }

    #[test]
    fn nothing_is_claimed_when_what_node_needs_cannot_be_told() {
        let mut objects = sharp_process();
        // The executable is not among the mapped files (or not known).
        assert!(behind_addons(&objects, Path::new("/usr/local/bin/node")).is_empty());
        // A file node needs could not be read: what it needs in turn is unknown, so the C
        // library (needed by the addon too) could look like the addon's own.
        objects[1].needed = None;
        assert!(behind_addons(&objects, Path::new("/usr/bin/node")).is_empty());
        // A file only the addon needs could not be read: only what lies behind it is hidden.
        let mut objects = sharp_process();
        objects[8].needed = None;
        let behind = behind_addons(&objects, Path::new("/usr/bin/node"));
        assert!(behind.contains_key(Path::new(VIPS)));
        assert!(!behind.contains_key(Path::new("/opt/extra/libextra.so")));
    }

    /// The dynamic sections of real files: this test binary needs the C library, whose
    /// soname is its file name; in a process with no addon, nothing is behind one.
    #[test]
    fn dynamic_sections_are_read_from_the_files_as_mapped() {
        let exe = std::env::current_exe().unwrap();
        let (soname, needed) =
            read_dynamic(fs::File::open(&exe).unwrap()).expect("our dynamic section");
        assert_eq!(soname, None);
        assert!(needed.iter().any(|n| n == "libc.so.6"), "{needed:?}");
        let maps = Maps::read_code(std::process::id()).unwrap();
        let objects = linked_objects(std::process::id(), &maps);
        let libc = objects
            .iter()
            .find(|o| o.path.file_name().is_some_and(|n| n == "libc.so.6"))
            .expect("the C library is mapped");
        assert_eq!(libc.soname.as_deref(), Some("libc.so.6"));
        assert!(objects.iter().all(|o| o.needed.is_some()), "{objects:?}");
        assert!(behind_addons(&objects, &exe).is_empty());
        // Not an ELF file.
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.so");
        fs::write(&junk, b"not an ELF file").unwrap();
        assert_eq!(read_dynamic(fs::File::open(&junk).unwrap()), None);
    }

    #[inline(never)]
    extern "C" fn mlp_library_thread_body(_: *mut libc::c_void) -> *mut libc::c_void {
        std::ptr::null_mut()
    }

    /// A start routine whose name says nothing: `other`, unless its file is behind an addon,
    /// then `addon` with its origin. A name that says something keeps its role.
    #[test]
    fn a_thread_started_in_a_library_behind_an_addon_is_the_addons() {
        let me = std::process::id();
        let maps = Maps::read_code(me).unwrap();
        let addr = mlp_library_thread_body as *const () as u64;
        let m = maps.find(addr).unwrap();
        let readable = readable_path(me, m).unwrap();
        let origin = Arc::new(AddonOrigin {
            addon: "/app/spawner.node".into(),
            library: Some("/app/libspawner.so".into()),
        });
        let pending = |origin: Option<Arc<AddonOrigin>>| {
            ThreadRole::Pending(Some((
                Site {
                    mapped: "/app/libspawner.so".into(),
                    readable: readable.clone(),
                    origin,
                },
                m.file_offset(addr),
            )))
        };
        let symbolizer = Symbolizer::new();
        let t = ThreadId::new(1, 1);
        let mut behind = pending(Some(origin.clone()));
        let d = resolve(&symbolizer, t, &mut behind);
        assert_eq!(
            d,
            Decided {
                role: Role::Addon,
                origin: Some(origin.clone())
            }
        );
        assert!(matches!(behind, ThreadRole::Known(ref k) if *k == d));
        assert_eq!(
            resolve(&symbolizer, t, &mut pending(None)),
            Role::Other.into()
        );
        // A routine whose name gives a role keeps it, even in a library behind an addon.
        let named = mlp_inspector_thread_body as *const () as u64;
        let m = maps.find(named).unwrap();
        let mut inspector = ThreadRole::Pending(Some((
            Site {
                mapped: "/app/libspawner.so".into(),
                readable: readable_path(me, m).unwrap(),
                origin: Some(origin),
            },
            m.file_offset(named),
        )));
        assert_eq!(
            resolve(&symbolizer, t, &mut inspector),
            Role::Inspector.into()
        );
    }

    #[inline(never)]
    extern "C" fn mlp_inspector_thread_body(_: *mut libc::c_void) -> *mut libc::c_void {
        std::ptr::null_mut()
    }
}
