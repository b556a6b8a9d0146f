//! Roles and names: the rules, and caches keyed by process and thread *and* start time.

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

fn comm(name: &str) -> [u8; COMM_LEN] {
    let mut c = [0u8; COMM_LEN];
    c[..name.len()].copy_from_slice(name.as_bytes());
    c
}

#[test]
fn roles_from_ids() {
    assert_eq!(
        role_from_ids_and_name(100, 100, 100, "node", 0),
        Some(Role::Main)
    );
    assert_eq!(role_from_ids_and_name(100, 101, 100, "node", 0), None);
    assert_eq!(
        role_from_ids_and_name(100, 200, 200, "node", 0),
        Some(Role::Foreign)
    );
    assert_eq!(
        role_from_ids_and_name(100, 200, 200, "WorkerThread", 0),
        Some(Role::Foreign)
    );
    // The profiler's own threads, whoever's lock they take (their own included).
    assert_eq!(
        role_from_ids_and_name(100, 200, 200, "mmaplock-prof", 200),
        Some(Role::Profiler)
    );
    assert_eq!(
        role_from_ids_and_name(200, 200, 200, "mmaplock-prof", 200),
        Some(Role::Profiler)
    );
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
    let role = |roles: &mut Roles, p, t, c| roles.role(p, t, 100, &comm(c), 0);
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
    assert_eq!(roles.role(new, foreign, 300, &comm("ps"), 0), Role::Foreign);
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

#[cfg(target_arch = "x86_64")]
#[test]
fn start_routine_of_a_live_thread_is_found_and_symbolized_in_its_own_process_only() {
    extern "C" fn mlp_test_thread_body(_: *mut libc::c_void) -> *mut libc::c_void {
        std::thread::sleep(std::time::Duration::from_millis(300));
        std::ptr::null_mut()
    }
    // This test process stands for a target: not the profiler.
    let mut roles = Roles {
        profiler: 0,
        ..Roles::default()
    };
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
    let fsbase = t as u64;
    let found = roles.start_routine(me(), fsbase);
    // Under the pid of a process that is gone, nothing is read: our memory is not its.
    let stale = roles.start_routine(my_predecessor(), fsbase);
    // Through the cache: observed now, symbolized when asked.
    let thread = ThreadId::new(u32::MAX, 1);
    roles.observe(me(), thread, me().pid, &comm(""), fsbase);
    roles.observe(my_predecessor(), thread, me().pid, &comm(""), fsbase);
    // SAFETY: joining the thread created above.
    unsafe { libc::pthread_join(t, std::ptr::null_mut()) };

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
        ThreadRole::Known(Role::Other)
    ));
    assert_eq!(
        roles.role(me(), thread, me().pid, &comm(""), 0),
        Role::Other
    );
    roles.forget_process(me());
    roles.forget_process(my_predecessor());
    assert_eq!((roles.cached_threads(), roles.cached_processes()), (0, 0));
}
