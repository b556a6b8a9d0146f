//! The lifecycle of threads and processes in a profile, on a scripted kernel
//! (`kernel::fake`): synthetic readings go through the real profile, aggregation, registry
//! and report, and every test checks exact counts in the reports, and what the kernel's maps
//! and the registry still hold.

use profiler_common::{cause, exit_record};

use super::Profile;
use crate::{
    kernel::{
        Kernel,
        fake::{FakeKernel, Task, WAIT_NS},
    },
    output::report::{ProcessReport, Report, ThreadReport},
    registry::{reads::Reads, roles::Role},
};

/// Made-up pids (above any real `pid_max`).
pub(super) const PID: u32 = 5_000_001;
const OTHER_PID: u32 = 5_000_002;

pub(super) fn profile(blockers: bool) -> Profile<FakeKernel> {
    Profile::new(FakeKernel::new(blockers), true)
}

/// The one process of the report that is `t`'s (pid and start time).
pub(super) fn process<'r>(r: &'r Report, t: &Task) -> &'r ProcessReport {
    let p = t.process();
    let found: Vec<&ProcessReport> = r
        .processes
        .iter()
        .filter(|x| x.pid == p.pid && x.start_ticks == p.start)
        .collect();
    assert_eq!(found.len(), 1, "process {p:?} once in {:?}", r.processes);
    found[0]
}

/// The one thread `t` of a process's report.
pub(super) fn thread<'r>(p: &'r ProcessReport, t: &Task) -> &'r ThreadReport {
    let found: Vec<&ThreadReport> = p.threads.iter().filter(|x| x.tid == t.tid).collect();
    assert_eq!(found.len(), 1, "thread {} once in {:?}", t.tid, p.threads);
    found[0]
}

/// How many times the profile deleted `t`'s entries (each kind once per retirement).
fn deletions(p: &Profile<FakeKernel>, t: &Task) -> usize {
    let mine = |k: &&profiler_common::StatsKey| k.tid == t.tid && k.tid_start == t.start_ns;
    p.collector.removed.iter().filter(mine).count()
}

/// Process `t`'s writes in a report.
fn writes(r: &Report, t: &Task) -> u64 {
    process(r, t).lock.write.count
}

/// A process `node` and a `libuv-worker` thread of it, each having taken the lock so many
/// times for these kinds (main's, then the worker's).
fn node_and_worker(k: &mut FakeKernel, takes: [(u32, u64); 2]) -> (Task, Task) {
    let main = k.spawn_process(PID, "node");
    let worker = k.spawn_thread(&main, "libuv-worker");
    for (t, (kind, n)) in [&main, &worker].into_iter().zip(takes) {
        k.take(t, kind, n);
    }
    (main, worker)
}

/// A process `comm` that took `mmaps` mmaps, read.
fn process_with_mmaps(p: &mut Profile<FakeKernel>, comm: &str, mmaps: u64) -> Task {
    let main = p.collector.spawn_process(PID, comm);
    p.collector.take(&main, cause::MMAP, mmaps);
    p.poll(false).unwrap();
    main
}

/// `t` exits, then a reading.
pub(super) fn exit_then_read(p: &mut Profile<FakeKernel>, t: &Task) {
    p.collector.exit(t);
    p.poll(false).unwrap();
}

/// After a reading: each task's entries deleted so many times in all, and what the profile
/// still holds (threads, entries).
fn assert_left(p: &Profile<FakeKernel>, deleted: &[(&Task, usize)], live: (usize, usize)) {
    for (t, n) in deleted {
        assert_eq!(deletions(p, t), *n, "thread {}'s entries deleted", t.tid);
    }
    assert_eq!(p.live(), live, "(threads, entries) left");
}

/// A process `node` whose main thread took one mmap and whose `libuv-worker` threads took
/// `writes[i]` writes of `kind` each, read once.
fn node_with_workers<const N: usize>(
    p: &mut Profile<FakeKernel>,
    kind: u32,
    writes: [u64; N],
) -> (Task, [Task; N]) {
    let k = &mut p.collector;
    let main = k.spawn_process(PID, "node");
    k.take(&main, cause::MMAP, 1);
    let workers = writes.map(|n| {
        let w = k.spawn_thread(&main, "libuv-worker");
        k.take(&w, kind, n);
        w
    });
    p.poll(false).unwrap();
    (main, workers)
}

#[test]
fn a_thread_that_exits_between_two_readings_keeps_all_its_acquisitions_and_is_retired_once() {
    let mut p = profile(false);
    let (main, [worker]) = node_with_workers(&mut p, cause::MUNMAP, [3]);
    p.collector.take(&worker, cause::READ, 4);
    p.poll(false).unwrap();
    assert_eq!(p.live(), (2, 3));
    let first = p.interval_report();
    assert_eq!(thread(process(&first, &main), &worker).lock.write.count, 3);

    // Between two readings: five more writes, then the worker exits.
    p.collector.take(&worker, cause::MUNMAP, 5);
    exit_then_read(&mut p, &worker);
    // Its two entries, deleted once each; the main thread's entry is left.
    assert_left(&p, &[(&worker, 2)], (1, 1));
    assert_eq!(p.collector.entries(), 1);
    let second = p.interval_report();
    let w = thread(process(&second, &main), &worker);
    assert_eq!(
        (w.lock.write.count, w.lock.read.count),
        (5, 0),
        "only what is new"
    );
    assert_eq!(
        w.role,
        Role::Libuv,
        "the role it had, decided at its retirement"
    );

    // Later readings do not retire it again, nor count it again.
    p.poll(false).unwrap();
    p.poll(true).unwrap();
    assert_eq!(deletions(&p, &worker), 2);
    let summary = p.summary();
    let proc = process(&summary, &main);
    let w = thread(proc, &worker);
    assert_eq!((w.lock.write.count, w.lock.read.count), (8, 4));
    assert_eq!(w.lock.write.wait_ns.sum, 8 * WAIT_NS);
    assert_eq!(w.role, Role::Libuv);
    assert_eq!(thread(proc, &main).role, Role::Main);
    assert_eq!((proc.lock.write.count, proc.lock.read.count), (9, 4));
}

#[test]
fn an_exit_noticed_before_the_threads_last_acquisitions_waits_for_them() {
    let mut p = profile(false);
    let (main, [worker, quitter]) = node_with_workers(&mut p, cause::MPROTECT, [3, 1]);

    // The worker's notice comes while it still runs (exit_mm is still to take the lock),
    // and another's exit is noticed before its pending acquisitions could be flushed.
    p.collector.notice(&worker, exit_record::FREED);
    p.collector.notice(&quitter, exit_record::EXITING);
    p.poll(false).unwrap();
    // One not done with the lock yet, the other not freed yet.
    assert_left(&p, &[(&worker, 0), (&quitter, 0)], (3, 3));

    // Their last acquisitions arrive after the notices; then they are gone.
    let k = &mut p.collector;
    k.take(&worker, cause::MUNMAP, 2);
    k.notice(&worker, exit_record::FREED);
    k.vanish(&worker);
    k.take(&quitter, cause::MPROTECT, 4);
    k.exit(&quitter);
    p.poll(false).unwrap();
    // The worker's mprotect and munmap entries.
    assert_left(&p, &[(&worker, 2), (&quitter, 1)], (1, 1));
    let summary = p.summary();
    let proc = process(&summary, &main);
    assert_eq!(thread(proc, &worker).lock.write.count, 5);
    assert_eq!(thread(proc, &quitter).lock.write.count, 5);
    assert_eq!(proc.lock.write.count, 11);
}

#[test]
fn a_thread_born_and_gone_between_two_readings_is_counted_and_retired() {
    let mut p = profile(false);
    let main = p.collector.spawn_process(PID, "node");
    p.collector.take(&main, cause::BRK, 1);
    p.poll(false).unwrap();
    // Its exit notice is taken before the reading that first sees its entries.
    let brief = p.collector.spawn_thread(&main, "WorkerThread");
    p.collector.take(&brief, cause::MMAP, 4);
    exit_then_read(&mut p, &brief);
    assert_left(&p, &[(&brief, 1)], (1, 1));
    let interval = p.interval_report();
    assert_eq!(
        thread(process(&interval, &main), &brief).lock.write.count,
        4
    );
    let summary = p.summary();
    let b = thread(process(&summary, &main), &brief);
    assert_eq!((b.lock.write.count, b.role), (4, Role::Worker));
}

#[test]
fn a_process_whose_threads_all_exited_is_retired_once_reaped_and_kept_in_the_report() {
    let mut p = profile(false);
    let k = &mut p.collector;
    let (main, worker) = node_and_worker(k, [(cause::MMAP, 6), (cause::MUNMAP, 2)]);
    p.poll(false).unwrap();

    // Every thread exits; the main thread stays a zombie until its parent reaps it.
    let k = &mut p.collector;
    k.take(&main, cause::EXIT, 1);
    k.exit(&worker);
    k.notice(&main, exit_record::FREED);
    k.zombie(&main);
    p.poll(false).unwrap();
    assert_eq!(p.live(), (0, 0));
    assert_eq!(p.collector.entries(), 0);
    assert!(
        p.collector.deselected.is_empty(),
        "not reaped: still a process"
    );

    p.collector.vanish(&main);
    p.poll(false).unwrap();
    let pid = main.process();
    assert_eq!(p.collector.deselected, vec![(pid.pid, pid.start)]);
    p.poll(false).unwrap();
    assert_eq!(p.collector.deselected.len(), 1, "evicted once");
    assert_eq!((deletions(&p, &main), deletions(&p, &worker)), (2, 1));

    let summary = p.summary();
    let proc = process(&summary, &main);
    assert_eq!(proc.comm, "node", "named after its main thread");
    assert_eq!(proc.lock.write.count, 9);
    assert_eq!(
        proc.lock.causes.iter().map(|c| c.write.count).sum::<u64>(),
        9
    );
    assert_eq!(thread(proc, &main).role, Role::Main);
    assert_eq!(thread(proc, &worker).role, Role::Libuv);
}

#[test]
fn a_reused_pid_is_another_process_whose_counts_never_mix() {
    let mut p = profile(false);
    let (old, old_worker) =
        node_and_worker(&mut p.collector, [(cause::MMAP, 3), (cause::MUNMAP, 1)]);
    p.poll(false).unwrap();

    // It exits and is reaped, and its pid (and main thread's tid) goes to a new process,
    // all before the next reading.
    let k = &mut p.collector;
    k.take(&old, cause::EXIT, 1);
    k.exit(&old_worker);
    k.exit(&old);
    let new = k.spawn_process(PID, "python3");
    k.take(&new, cause::MMAP, 7);
    assert_ne!(old.process(), new.process());
    p.poll(false).unwrap();
    let gone = old.process();
    assert_eq!(p.collector.deselected, vec![(gone.pid, gone.start)]);
    assert_eq!(p.live(), (1, 1), "the new process lives on");
    assert!(
        p.collector
            .removed
            .iter()
            .all(|k| k.owner_start == old.proc_start_ns),
        "nothing of the new process deleted"
    );

    p.collector.take(&new, cause::MMAP, 2);
    p.poll(false).unwrap();
    let summary = p.summary();
    let (o, n) = (process(&summary, &old), process(&summary, &new));
    assert_eq!((o.lock.write.count, n.lock.write.count), (5, 9));
    assert_eq!(thread(o, &old).lock.write.count, 4);
    assert_eq!(thread(n, &new).lock.write.count, 9);
    assert_eq!((o.comm.as_str(), n.comm.as_str()), ("node", "python3"));
    assert_eq!(
        n.threads.len(),
        1,
        "the old worker is not the new process's"
    );
}

#[test]
fn lost_exit_notices_are_made_up_for_by_proc_which_tells_a_reused_pid_apart() {
    let mut p = profile(false);
    let old = process_with_mmaps(&mut p, "node", 3);
    // Gone without a notice (the ring was full), its pid reused at once.
    let k = &mut p.collector;
    k.vanish(&old);
    k.counters.exits_lost += 1;
    let new = k.spawn_process(PID, "node");
    k.take(&new, cause::MMAP, 2);
    p.poll(false).unwrap();
    assert_left(&p, &[(&old, 1), (&new, 0)], (1, 1));
    let summary = p.summary();
    assert_eq!(writes(&summary, &old), 3);
    assert_eq!(writes(&summary, &new), 2);
}

#[test]
fn an_evicted_process_leaves_the_registry_but_not_the_report() {
    let mut p = profile(false);
    let (main, worker) =
        node_and_worker(&mut p.collector, [(cause::MMAP, 1), (cause::MPROTECT, 2)]);
    p.registry.names.learn(main.process(), "api-server");
    p.registry
        .cgroups
        .learn(main.process(), "/system.slice/api.service");
    p.registry.exes.learn(main.process(), "/usr/bin/node", 0);
    p.poll(false).unwrap();
    assert_eq!(p.registry.roles.cached_processes(), 1);
    assert_eq!(p.registry.roles.cached_threads(), 2);
    let _ = p.interval_report();
    // What the profiler read of it for its roles (its maps, a start routine).
    let read = Reads {
        maps: 1,
        map_queries: 2,
        memory: 1,
        memory_ranges: 1,
        v8_copied: 0,
        v8_sources_shared: 0,
        v8_named_at_sample: 0,
    };
    p.registry.roles.note_reads(main.process(), read);

    p.collector.take(&worker, cause::MPROTECT, 3);
    p.collector.exit(&worker);
    p.collector.exit(&main);
    p.poll(false).unwrap();
    // Evicted: nothing of it is cached any more.
    assert_eq!(p.registry.roles.cached_threads(), 0);
    assert_eq!(p.registry.roles.cached_processes(), 0);
    assert_eq!(p.registry.names.len(), 0);
    assert_eq!(p.registry.cgroups.get(main.process()), None);
    assert_eq!(p.registry.exes.len(), 0);

    // Its last interval and the summary still have it whole, named.
    for (r, summary) in [(p.interval_report(), false), (p.summary(), true)] {
        let proc = process(&r, &main);
        assert_eq!(proc.read_by_profiler.is_some(), summary);
        assert_eq!(proc.comm, "api-server");
        assert_eq!(proc.cgroup.as_deref(), Some("/system.slice/api.service"));
        assert_eq!(proc.exe.as_deref(), Some("/usr/bin/node"));
        assert_eq!(thread(proc, &worker).role, Role::Libuv);
    }
    let summary = p.summary();
    let proc = process(&summary, &main);
    // What was read of it, kept for the summary (intervals do not count reads).
    assert_eq!(proc.read_by_profiler, Some(read));
    assert_eq!(
        (
            proc.lock.write.count,
            thread(proc, &worker).lock.write.count
        ),
        (6, 5)
    );
}

#[test]
fn the_agent_keeps_no_history_of_what_it_evicted() {
    let mut p = profile(false);
    p.forget_history();
    let gone = p.collector.spawn_process(PID, "node");
    let stays = p.collector.spawn_process(OTHER_PID, "node");
    p.registry.names.learn(gone.process(), "api-server");
    p.collector.take(&gone, cause::MMAP, 4);
    p.collector.take(&stays, cause::MMAP, 1);
    p.poll(false).unwrap();
    exit_then_read(&mut p, &gone);
    // The interval it left in reports it (the agent's metrics keep its counts from there)...
    let interval = p.interval_report();
    let proc = process(&interval, &gone);
    assert_eq!(
        (proc.comm.as_str(), proc.lock.write.count),
        ("api-server", 4)
    );
    // ...and nothing of it stays in memory.
    let summary = p.summary();
    assert_eq!(summary.processes.len(), 1);
    assert_eq!(writes(&summary, &stays), 1);
    assert_eq!(p.registry.names.len(), 0);
}

#[test]
fn a_foreign_takers_entries_go_with_the_lock_it_took() {
    let mut p = profile(false);
    let target = p.collector.spawn_process(PID, "node");
    let monitor = p.collector.spawn_process(OTHER_PID, "node_exporter");
    // The monitor reads the target's /proc files: it takes the target's lock.
    p.collector.take(&target, cause::MMAP, 1);
    p.collector.take_on(&monitor, &target, cause::READ, 6);
    p.collector.take(&monitor, cause::MMAP, 2);
    p.poll(false).unwrap();
    assert_eq!(p.live(), (3, 3), "the monitor on two locks");

    exit_then_read(&mut p, &target);
    // The monitor's entry on the gone lock only: its entry on its own lock lives.
    assert_left(&p, &[(&monitor, 1)], (1, 1));
    let summary = p.summary();
    let t = process(&summary, &target);
    let m = thread(t, &monitor);
    assert_eq!((m.lock.read.count, m.role), (6, Role::Foreign));
    assert_eq!(writes(&summary, &monitor), 2);
}

#[test]
fn blockers_entries_go_with_their_waiter() {
    let mut p = profile(true);
    let (main, waiter) = node_and_worker(&mut p.collector, [(cause::MUNMAP, 2), (cause::MMAP, 2)]);
    p.collector.charge(&main, &waiter, &main, 2, 500);
    p.poll(false).unwrap();
    p.collector.charge(&main, &waiter, &main, 1, 100);
    exit_then_read(&mut p, &waiter);
    assert_eq!(p.collector.blocked_entries(), 0);
    assert_eq!(p.collector.removed_blocked.len(), 1);
    let summary = p.summary();
    let proc = process(&summary, &main);
    assert_eq!(proc.blocked_wait_ns, Some(600), "its waits stay charged");
    let blockers = proc.blockers.as_deref().unwrap_or_default();
    assert_eq!(blockers.iter().map(|b| b.waits).sum::<u64>(), 3);
}

#[test]
fn an_exec_relabels_the_process_and_keeps_its_counts_whole() {
    let mut p = profile(false);
    let main = process_with_mmaps(&mut p, "runc:[2:INIT]", 2);
    p.collector.notice(&main, exit_record::EXEC);
    p.collector.take(&main, cause::MMAP, 3);
    p.poll(false).unwrap();
    assert_eq!(p.take_execs(), vec![main.process()]);
    assert!(p.take_execs().is_empty());
    assert_eq!(p.collector.removed.len(), 0, "the same process goes on");
    let summary = p.summary();
    assert_eq!(writes(&summary, &main), 5);
}

/// A short container's process: runc's init execs it, it runs and exits, all before the
/// reading that brings the exec's notice. Named after the image the kernel says it exec'd
/// (/proc has nothing left to read), not after runc's init: the image test's mmap-churn
/// went uncounted under its own name so, 4 runs in 6 (issue 27).
#[test]
fn a_process_gone_before_its_exec_was_read_is_named_after_what_it_execd() {
    let mut p = profile(false);
    let main = process_with_mmaps(&mut p, "runc:[2:INIT]", 2);
    p.registry.exes.learn(main.process(), "/usr/bin/runc", 0);
    p.collector.notice_exec(&main, "mmap-churn");
    p.collector.take(&main, cause::MMAP, 3);
    p.collector.exit(&main);
    p.poll(false).unwrap();
    let summary = p.summary();
    assert_eq!(process(&summary, &main).comm, "mmap-churn");
    // Its executable before the exec is not said to be its image's: none was read of that.
    assert_eq!(process(&summary, &main).exe, None);
    assert_eq!(writes(&summary, &main), 5);
}

/// A thread's time alive in the run so far, ns.
fn alive_ns(p: &Profile<FakeKernel>, t: &Task) -> u64 {
    p.total_window().processes[&t.process()][&t.thread()]
        .time
        .alive_ns
}

#[test]
fn an_exec_or_a_fork_notice_ends_no_threads_life() {
    let mut p = profile(false);
    let main = process_with_mmaps(&mut p, "node", 1);
    // The process execs (its main thread goes on), and forks a child noticed before its
    // first acquisitions are read.
    p.collector.notice(&main, exit_record::EXEC);
    let child = p.collector.spawn_process(OTHER_PID, "node");
    p.collector.notice(&child, exit_record::FORK);
    p.collector.take(&child, cause::MMAP, 1);
    p.collector.take(&main, cause::MMAP, 1);
    p.poll(false).unwrap();
    p.collector.take(&child, cause::MMAP, 1);
    p.collector.spawn_process(OTHER_PID + 1, "later");
    p.poll(false).unwrap();
    let now = p.collector.now_ns();
    assert_eq!(alive_ns(&p, &main), now - main.start_ns);
    assert_eq!(alive_ns(&p, &child), now - child.start_ns);
    // And a real exit does end it.
    p.collector.exit(&child);
    let exited_at = p.collector.now_ns();
    p.collector.spawn_process(OTHER_PID + 2, "later");
    p.poll(false).unwrap();
    assert_eq!(alive_ns(&p, &child), exited_at - child.start_ns);
}

#[tokio::test(flavor = "current_thread")]
async fn the_end_of_a_run_retires_the_freed_and_counts_the_exits_still_pending() {
    let mut p = profile(false);
    let (main, [slow, stuck]) = node_with_workers(&mut p, cause::MUNMAP, [2, 3]);
    // One freed but still in its exit_mmap when the run ends; one gone from /proc without
    // ever being freed (its last acquisitions never reach the map).
    let k = &mut p.collector;
    k.take(&slow, cause::MUNMAP, 1);
    k.notice(&slow, exit_record::FREED);
    k.notice(&stuck, exit_record::EXITING);
    k.vanish(&stuck);
    p.finish().await.unwrap();
    assert_eq!(deletions(&p, &slow), 1, "retired as it stands");
    assert_eq!(deletions(&p, &stuck), 0, "never freed");
    let summary = p.summary();
    assert_eq!(summary.lost.exit_pending, 1);
    let proc = process(&summary, &main);
    assert_eq!(thread(proc, &slow).lock.write.count, 3);
    assert_eq!(thread(proc, &stuck).lock.write.count, 3);
}

/// The time share is over every thread of the process: those that took its lock, and the
/// bystanders the kernel side reports (their CPU at each pass, their exit), each with the
/// role its ids and name tell. Its totals are theirs, and so are its roles'.
#[test]
fn the_time_share_counts_the_threads_that_never_took_the_lock() {
    let mut p = profile(false);
    let (main, worker) = node_and_worker(&mut p.collector, [(cause::MMAP, 3), (cause::MMAP, 2)]);
    let pool = p.collector.spawn_thread(&main, "libuv-worker");
    let plain = p.collector.spawn_thread(&main, "node");
    let short = p.collector.spawn_thread(&main, "node");
    let s = 1_000_000_000;
    p.collector.report_cpu(&main, s / 10, false);
    p.collector.report_cpu(&worker, s / 10, false);
    for (t, cpu) in [(&pool, 2 * s), (&plain, s / 2), (&short, s)] {
        p.collector.report_cpu(t, cpu, true);
    }
    p.poll(false).unwrap();
    // The short one exits having run 1.5 s; the others run on, unreported since.
    p.collector.bystander_exit(&short, 3 * s / 2);
    p.poll(false).unwrap();
    let r = p.summary();
    let proc_ = process(&r, &main);
    // The bystanders are in no thread row (they took no lock): in the shares only.
    assert_eq!(proc_.threads.len(), 2);
    let share = proc_.time_share.as_ref().expect("a time share");
    assert_eq!(share.threads, Some(5), "{share:?}");
    assert_eq!(share.cpu_ns, Some(s / 10 * 2 + 2 * s + s / 2 + 3 * s / 2));
    let role = |r: Role| {
        proc_
            .time_share_by_role
            .iter()
            .flatten()
            .find(|x| x.role == r)
            .map(|x| (x.share.threads, x.share.cpu_ns))
    };
    assert_eq!(role(Role::Libuv), Some((Some(2), Some(s / 10 + 2 * s))));
    assert_eq!(role(Role::Other), Some((Some(2), Some(2 * s))));
    assert_eq!(role(Role::Main), Some((Some(1), Some(s / 10))));
    // Its life ends at its exit, the others' at the run's last reading.
    let alive = share.alive_ns;
    let lives: u64 = [&main, &worker, &pool, &plain]
        .iter()
        .map(|t| p.collector.now_ns() - t.start_ns)
        .sum::<u64>()
        + s;
    assert_eq!(alive, lives);
}
