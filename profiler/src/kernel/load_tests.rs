use super::*;
use crate::kernel::{
    collector::Floor,
    programs::{CONTENTION_ITER, FLUSH_ITER},
};

#[test]
fn filter_packs_pids_and_names_select() {
    let by_pid = CollectorConfig {
        pids: vec![7, 9],
        max_threads: 1,
        ..Default::default()
    };
    let f = filter_for(&by_pid).unwrap();
    assert_eq!((f.n_pids, f.use_selection), (2, 0));
    assert_eq!(&f.pids[..3], &[7, 9, 0]);
    // A name selects processes, which the kernel's selection then holds, per process.
    let f = filter_for(&CollectorConfig {
        comms: vec!["node".into()],
        ..by_pid
    })
    .unwrap();
    assert_eq!(f.use_selection, 1);
}

#[test]
fn filter_rejects_what_the_kernel_cannot_hold() {
    let long = CollectorConfig {
        comms: vec!["a-very-long-command-name".into()],
        ..Default::default()
    };
    assert!(matches!(
        filter_for(&long),
        Err(CollectorError::CommTooLong(_))
    ));
    let many = CollectorConfig {
        pids: (1..=(MAX_FILTER_PIDS as u32 + 1)).collect(),
        ..Default::default()
    };
    assert!(matches!(
        filter_for(&many),
        Err(CollectorError::TooManyPids)
    ));
}

/// The stand-in BTF gives aya the kernel's ids for the functions it looks up.
#[test]
fn stand_in_btf_has_the_functions_under_the_given_ids() {
    use aya_obj::btf::BtfKind;
    let id = |btf: &Btf, name: &str| btf.id_by_type_name_kind(name, BtfKind::Func).ok();
    for n in [1, 2, 7, 91_234] {
        let btf = btf_with_funcs(&[("bpf_iter_task", n)]);
        assert_eq!(id(&btf, "bpf_iter_task"), Some(n));
    }
    // In any order; an absent one (id 0) is left out.
    let btf = btf_with_funcs(&[("b", 76_016), ("a", 60_365), ("c", 0)]);
    assert_eq!(id(&btf, "a"), Some(60_365));
    assert_eq!(id(&btf, "b"), Some(76_016));
    assert_eq!(id(&btf, "c"), None);
}

/// Contention mode attaches the contention tracepoints (an end before its begin) and the
/// lifecycle its threads need, never the mmap_lock tracepoints; full mode the reverse.
#[test]
fn each_mode_attaches_its_own_programs() {
    let kernel = crate::kernel::btf::KernelInfo {
        tracepoints: crate::kernel::btf::TracepointLayout::WithMemcgPath,
        layout: Default::default(),
        iter_task_btf_id: 1,
        contention_tracepoints: true,
        preemptible_tracepoints: false,
    };
    let cont = CollectorConfig {
        mode: Mode::Contention,
        selection: true,
        ..Default::default()
    };
    assert_eq!(
        lock_programs(&kernel, Floor::Off, Mode::Contention),
        [
            ("contention_end", "contention_end"),
            ("contention_begin", "contention_begin")
        ]
    );
    let life = lifecycle_programs(&cont, false);
    assert!(life.contains(&("sched_process_exit", "contention_exit")));
    assert!(life.contains(&("sched_process_free", "contention_free")));
    assert!(life.contains(&("sched_process_fork", "sched_process_fork")));
    assert_eq!(iterator(&cont), Some(CONTENTION_ITER));
    let full = CollectorConfig::default();
    let progs = lock_programs(&kernel, Floor::Off, Mode::Full);
    assert_eq!(
        progs,
        [
            ("mmap_lock_released", "mmap_lock_released"),
            (
                "mmap_lock_acquire_returned",
                "mmap_lock_acquire_returned_memcg"
            ),
            ("mmap_lock_start_locking", "mmap_lock_start_locking_memcg"),
        ]
    );
    assert_eq!(
        lifecycle_programs(&full, false),
        [
            ("sched_process_exit", "sched_process_exit"),
            ("sched_process_exec", "sched_process_exec")
        ]
    );
    assert_eq!(iterator(&full), Some(FLUSH_ITER));
    // The floors are the mmap_lock tracepoints' in either mode, with nothing around them.
    let floor = CollectorConfig {
        floor: Floor::Clock,
        mode: Mode::Contention,
        ..Default::default()
    };
    assert!(lifecycle_programs(&floor, true).is_empty());
    assert_eq!(iterator(&floor), None);
    assert_eq!(
        lock_programs(&kernel, Floor::Clock, Mode::Contention)[0],
        ("mmap_lock_released", "clock_released")
    );
    // Contention mode's preallocated threads: as many as --max-threads, within bounds.
    for (max_threads, room) in [(0, 1024), (16_384, 16_384), (4_194_304, 262_144)] {
        let c = CollectorConfig {
            max_threads,
            ..cont.clone()
        };
        assert_eq!(waiters_capacity(&c), room);
    }
    assert_eq!(waiters_capacity(&full), 1);
}

/// Where tracepoint programs can be preempted, each program that may be skipped is followed
/// by its second copy (which must come after it); never for a floor.
#[test]
fn second_copies_follow_their_programs_where_programs_can_be_preempted() {
    let kernel = crate::kernel::btf::KernelInfo {
        tracepoints: crate::kernel::btf::TracepointLayout::Current,
        layout: Default::default(),
        iter_task_btf_id: 1,
        contention_tracepoints: true,
        preemptible_tracepoints: true,
    };
    assert_eq!(
        lock_programs(&kernel, Floor::Off, Mode::Full),
        [
            ("mmap_lock_released", "mmap_lock_released"),
            ("mmap_lock_released", "mmap_lock_released_second"),
            ("mmap_lock_acquire_returned", "mmap_lock_acquire_returned"),
            (
                "mmap_lock_acquire_returned",
                "mmap_lock_acquire_returned_second"
            ),
            ("mmap_lock_start_locking", "mmap_lock_start_locking"),
            ("mmap_lock_start_locking", "mmap_lock_start_locking_second"),
        ]
    );
    let memcg = crate::kernel::btf::KernelInfo {
        tracepoints: crate::kernel::btf::TracepointLayout::WithMemcgPath,
        ..kernel
    };
    assert!(lock_programs(&memcg, Floor::Off, Mode::Full).contains(&(
        "mmap_lock_start_locking",
        "mmap_lock_start_locking_memcg_second"
    )));
    assert_eq!(lock_programs(&kernel, Floor::Clock, Mode::Full).len(), 3);
    let full = CollectorConfig::default();
    assert_eq!(
        &lifecycle_programs(&full, true)[..2],
        [
            ("sched_process_exit", "sched_process_exit"),
            ("sched_process_exit", "sched_process_exit_second")
        ]
    );
    let cont = CollectorConfig {
        mode: Mode::Contention,
        ..Default::default()
    };
    assert_eq!(
        lifecycle_programs(&cont, true)[..4],
        [
            ("sched_process_exit", "contention_exit"),
            ("sched_process_exit", "contention_exit_second"),
            ("sched_process_free", "contention_free"),
            ("sched_process_free", "contention_free_second"),
        ]
    );
    assert_eq!(
        lock_programs(&kernel, Floor::Off, Mode::Contention),
        [
            ("contention_end", "contention_end"),
            ("contention_end", "contention_end_second"),
            ("contention_begin", "contention_begin"),
            ("contention_begin", "contention_begin_second"),
        ]
    );
    for (_, p) in lock_programs(&kernel, Floor::Off, Mode::Full) {
        assert_eq!(
            p.ends_with(crate::kernel::skipped::SECOND),
            p.contains("second")
        );
    }
}

/// A SIGTERM that arrives while the programs load waits for them (the verifier would give up
/// on the thread) and is seen as pending; the mask is the thread's own again afterwards.
#[test]
fn a_signal_during_loading_waits_and_is_seen() {
    // SAFETY: SIGTERM ignored for the test's moment (a blocked signal stays pending even
    // so, and is dropped when unblocked), then the old disposition back; the signal goes to
    // this thread only.
    unsafe {
        let old = libc::signal(libc::SIGTERM, libc::SIG_IGN);
        {
            let held = SignalsHeld::new();
            assert!(!held.pending());
            libc::pthread_kill(libc::pthread_self(), libc::SIGTERM);
            assert!(held.pending(), "a held SIGTERM is pending");
        }
        let mut mask: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut mask);
        assert_eq!(
            libc::sigismember(&mask, libc::SIGTERM),
            0,
            "unblocked again"
        );
        libc::signal(libc::SIGTERM, old);
    }
}
