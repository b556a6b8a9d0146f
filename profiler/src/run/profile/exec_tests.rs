//! A process's exec, on the scripted kernel: the kernel sends its notice at the exec's end,
//! after the exec's own writes, so a reading may read those writes before the notice is
//! taken (issue 33: the kernel matrix's short processes had some of their exec-time writes
//! under `other`). Whichever comes first, every write keeps its thread's role.

use profiler_common::cause;

use super::tests::{PID, exit_then_read, process, profile, thread};
use crate::{output::report::Report, registry::roles::Role};

/// A thread's (role, writes) in a report.
fn role_and_writes(
    r: &Report,
    owner: &crate::kernel::fake::Task,
    t: &crate::kernel::fake::Task,
) -> (Role, u64) {
    let t = thread(process(r, owner), t);
    (t.role, t.lock.write.count)
}

/// A short process: its exec's first writes are flushed and read by a reading, its notice
/// comes while that reading runs, then come the exec's last writes and the process's end.
/// Each interval, and the run's summary, has every one of them under `main` (the notice made
/// the registry forget the main thread's role, and the interval's report then found none:
/// `other`).
#[test]
fn an_execs_writes_read_before_its_notice_are_the_main_threads() {
    let mut p = profile(false);
    let main = p.collector.spawn_process(PID, "shortling");
    p.collector.take(&main, cause::OTHER, 7);
    p.collector
        .during_next_reading(|k| k.notice_exec(&main, "shortling"));
    p.poll(false).unwrap();
    assert_eq!(p.take_execs(), vec![main.process()], "the notice was taken");
    let first = p.interval_report();
    assert_eq!(role_and_writes(&first, &main, &main), (Role::Main, 7));

    p.collector.take(&main, cause::OTHER, 6);
    p.collector.take(&main, cause::MMAP, 500);
    exit_then_read(&mut p, &main);
    let second = p.interval_report();
    assert_eq!(role_and_writes(&second, &main, &main), (Role::Main, 506));
    let summary = p.summary();
    assert_eq!(role_and_writes(&summary, &main, &main), (Role::Main, 513));
}

/// A process still running at the end of a one-shot run, idle since its exec, whose notice
/// came while the reading that read the exec's writes ran: the summary has them under `main`.
#[test]
fn a_running_process_idle_since_its_exec_has_its_exec_writes_under_main() {
    let mut p = profile(false);
    let main = p.collector.spawn_process(PID, "sleeper");
    p.collector.take(&main, cause::OTHER, 13);
    p.collector
        .during_next_reading(|k| k.notice_exec(&main, "sleeper"));
    p.poll(false).unwrap();
    p.poll(true).unwrap();
    let summary = p.summary();
    assert_eq!(role_and_writes(&summary, &main, &main), (Role::Main, 13));
}

/// A process with a worker thread execs (Node's `process.execve`): the kernel ends the worker
/// first, so its writes and its exit come before the exec's notice, in the same reading. Its
/// writes stay its role's, in that interval's report and at its retirement.
#[test]
fn an_old_images_thread_keeps_its_role_through_the_exec() {
    let mut p = profile(false);
    let main = p.collector.spawn_process(PID, "node");
    let worker = p.collector.spawn_thread(&main, "libuv-worker");
    p.collector.take(&main, cause::MMAP, 1);
    p.collector.take(&worker, cause::MUNMAP, 3);
    p.poll(false).unwrap();
    p.collector.take(&worker, cause::MUNMAP, 2);
    p.collector.take(&main, cause::OTHER, 4);
    p.collector.during_next_reading(|k| {
        k.exit(&worker);
        k.notice_exec(&main, "node");
    });
    p.poll(false).unwrap();
    let r = p.interval_report();
    assert_eq!(role_and_writes(&r, &main, &worker), (Role::Libuv, 5));
    assert_eq!(role_and_writes(&r, &main, &main), (Role::Main, 5));
    // Retired at the next reading, with the role it had.
    p.poll(false).unwrap();
    assert_eq!(p.live(), (1, 2), "the worker is retired, main lives on");
    let summary = p.summary();
    assert_eq!(role_and_writes(&summary, &main, &worker), (Role::Libuv, 5));
    assert_eq!(role_and_writes(&summary, &main, &main), (Role::Main, 5));
}
