//! Roles decided once per thread and kept per process and thread *and* start time: reused
//! ids, start routines read from live threads and placed after their process is gone,
//! an exec's old maps forgotten, a library behind an addon. The rules themselves are tested in
//! `role`, process names in `names`, addon libraries in `addonlibs`.

use super::*;

/// This process as the kernel names it.
pub(crate) fn me() -> ProcId {
    ProcId::of_live(std::process::id()).unwrap()
}

/// Another process that had this pid: same pid, an earlier start time.
pub(crate) fn my_predecessor() -> ProcId {
    let p = me();
    ProcId::new(p.pid, p.start.saturating_sub(1000))
}

pub(crate) fn comm(name: &str) -> [u8; COMM_LEN] {
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

/// A thread of this process, asleep in [`mlp_test_thread_body`] for a while, joined on drop,
/// and the thread pointer the kernel keeps for it (which it reports itself: on arm64 it is
/// not its `pthread_t`).
struct SleepingThread(libc::pthread_t, Box<std::sync::atomic::AtomicU64>);

extern "C" fn mlp_test_thread_body(tp: *mut libc::c_void) -> *mut libc::c_void {
    // SAFETY: the AtomicU64 `start` boxed, alive until the thread is joined.
    let tp = unsafe { &*tp.cast::<std::sync::atomic::AtomicU64>() };
    let mine = crate::kernel::pthread::thread_pointer().expect("a thread pointer");
    tp.store(mine, std::sync::atomic::Ordering::SeqCst);
    std::thread::sleep(std::time::Duration::from_millis(300));
    std::ptr::null_mut()
}

impl SleepingThread {
    fn start() -> SleepingThread {
        let mut t: libc::pthread_t = 0;
        let tp = Box::new(std::sync::atomic::AtomicU64::new(0));
        let arg = std::ptr::from_ref(&*tp).cast_mut().cast();
        // SAFETY: a joinable thread whose argument outlives it (joined on drop).
        let rc =
            unsafe { libc::pthread_create(&mut t, std::ptr::null(), mlp_test_thread_body, arg) };
        assert_eq!(rc, 0);
        while tp.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        SleepingThread(t, tp)
    }

    /// Its thread pointer (`task_struct.thread.fsbase` on x86_64: its struct pthread;
    /// `thread.uw.tp_value` on arm64).
    fn fsbase(&self) -> u64 {
        self.1.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for SleepingThread {
    fn drop(&mut self) {
        // SAFETY: the thread created by `start`, joined once.
        unsafe { libc::pthread_join(self.0, std::ptr::null_mut()) };
    }
}

#[test]
fn start_routine_of_a_live_thread_is_found_and_symbolized_in_its_own_process_only() {
    let mut roles = in_a_target();
    let offset = roles.offset.expect("glibc start_routine offset");
    assert!(offset.unsigned_abs() < 4096, "{offset}");
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
            origin: None,
            ..
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
                origin: None,
                ..
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

/// An exec's notice is read at the next reading, maybe after a short process's end, and
/// always after the exec's own writes (maybe read already): the maps read before the exec are
/// forgotten, the roles decided for its threads are not. Its main thread stays `main` (issue
/// 33: its exec-time writes, read before the notice, were reported as `other`), the old
/// image's threads keep theirs until retired, the new image's theirs.
#[test]
fn an_exec_read_late_forgets_the_old_maps_and_no_threads_role() {
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
    let roles_now =
        |roles: &mut Roles| [old, new, main].map(|t| roles.cached_role(p, t).map(|d| d.role));
    let decided = [Some(Role::V8), Some(Role::V8), Some(Role::Main)];
    // Maps read before the exec are the old image's.
    read_maps(&mut roles, exec_ns - 1);
    roles.forget_image(p, exec_ns);
    assert!(roles.processes[&p].maps.is_none());
    assert_eq!(roles_now(&mut roles), decided);
    // Maps read after it are the new image's, and stay.
    read_maps(&mut roles, exec_ns + 1);
    roles.forget_image(p, exec_ns);
    assert!(roles.processes[&p].maps.is_some());
    assert_eq!(roles_now(&mut roles), decided);
}

/// Its body differs from [`mlp_inspector_thread_body`]'s: a release build folds identical
/// functions into one address, which would then have both names.
#[inline(never)]
extern "C" fn mlp_library_thread_body(arg: *mut libc::c_void) -> *mut libc::c_void {
    arg.wrapping_byte_add(1)
}

/// A start routine whose name says nothing: `other`, unless its file is behind an addon,
/// then `addon` with its origin. A name that says something keeps its role.
#[test]
fn a_thread_started_in_a_library_behind_an_addon_is_the_addons() {
    let me = std::process::id();
    let maps = Maps::read(me).unwrap().retain(Keep::Code);
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
                file: (m.dev.clone(), m.inode),
                mapped: "/app/libspawner.so".into(),
                readable: readable.clone(),
                origin,
            },
            m.file_offset(addr),
        )))
    };
    let symbolizer = StartNames::default();
    let t = ThreadId::new(1, 1);
    let mut behind = pending(Some(origin.clone()));
    let d = resolve(&symbolizer, t, &mut behind);
    assert_eq!(
        d,
        Decided {
            role: Role::Addon,
            origin: Some(origin.clone()),
            start: Some("mmaplock_prof::registry::roles::tests::mlp_library_thread_body".into()),
        }
    );
    assert!(matches!(behind, ThreadRole::Known(ref k) if *k == d));
    assert_eq!(
        resolve(&symbolizer, t, &mut pending(None)).role,
        Role::Other
    );
    // A routine whose name gives a role keeps it, even in a library behind an addon.
    let named = mlp_inspector_thread_body as *const () as u64;
    let m = maps.find(named).unwrap();
    let mut inspector = ThreadRole::Pending(Some((
        Site {
            file: (m.dev.clone(), m.inode),
            mapped: "/app/libspawner.so".into(),
            readable: readable_path(me, m).unwrap(),
            origin: Some(origin),
        },
        m.file_offset(named),
    )));
    assert_eq!(
        resolve(&symbolizer, t, &mut inspector).role,
        Role::Inspector
    );
}

#[inline(never)]
extern "C" fn mlp_inspector_thread_body(arg: *mut libc::c_void) -> *mut libc::c_void {
    arg.wrapping_byte_add(2)
}

/// Start routines are named once per file and offset: a second thread started in the same
/// function of the same file (another process's mapping of it) is named from what was given
/// before, not symbolized again; another offset is named for itself.
#[test]
fn start_routines_are_named_once_per_file_and_offset() {
    let me = std::process::id();
    let maps = Maps::read(me).unwrap().retain(Keep::Code);
    let names = StartNames::default();
    let site = |f: u64| {
        let m = maps.find(f).unwrap();
        (
            (m.dev.clone(), m.inode),
            readable_path(me, m).unwrap(),
            m.file_offset(f),
        )
    };
    let (file, readable, offset) = site(mlp_inspector_thread_body as *const () as u64);
    let first = names.name(&file, &readable, &readable, offset);
    assert!(first.contains("mlp_inspector_thread_body"), "{first}");
    // The same file and offset, as another process maps it (here a path that no longer
    // opens): the name given before.
    let gone = std::path::Path::new("/nonexistent/binary");
    assert_eq!(names.name(&file, gone, gone, offset), first);
    let (file, readable, offset) = site(mlp_library_thread_body as *const () as u64);
    let other = names.name(&file, &readable, &readable, offset);
    assert!(other.contains("mlp_library_thread_body"), "{other}");
}
