use super::*;
use crate::aggregation::tests::{P10, T11, W, kernel_entry};
use profiler_common::StatsKey;

const S: u64 = 1_000_000_000;

fn comm(name: &str) -> [u8; COMM_LEN] {
    let mut c = [0; COMM_LEN];
    c[..name.len()].copy_from_slice(name.as_bytes());
    c
}

/// Thread `tid` of process 10 (started at 10 s), born at `start_s`, named `name`: seen with
/// `cpu_s` of CPU at `at_s`.
fn seen(tid: u32, start_s: u64, name: &str, role: Role, cpu_s: u64, at_s: u64) -> BystanderSeen {
    BystanderSeen {
        thread: ThreadId::new(tid, start_s * 100),
        start_ns: start_s * S,
        owner: P10,
        tgid: 10,
        comm: comm(name),
        role,
        cpu_ns: cpu_s * S,
        queued_ns: None,
        at_ns: at_s * S,
        exited: false,
    }
}

/// A process of one profiled thread (11) and two that take no lock: the main thread, idle,
/// and a libuv thread that runs the whole time. Its window counts all three: their lives
/// and their CPU, each with its role.
#[test]
fn a_processs_threads_that_take_no_lock_are_counted_in_its_time() {
    let mut tot = Totals::starting_at(100 * S);
    let main = seen(10, 10, "node", Role::Main, 40, 101);
    let pool = seen(12, 50, "libuv-worker", Role::Libuv, 30, 101);
    tot.note_bystander(&main);
    tot.note_bystander(&pool);
    tot.note_cpu(T11, 5 * S, None, 101 * S);
    let mut first = Window::default();
    for d in tot.update(&[(W, kernel_entry(&[(5, 5)]))]) {
        first.add(&d);
    }
    tot.tick(102 * S, Some(&mut first));
    first.settle(false);
    let threads = &first.processes[&P10];
    assert_eq!(threads.len(), 3, "{threads:?}");
    // The bystanders' first reports are their base: no CPU of theirs before the run.
    let pool_agg = &threads[&pool.thread];
    assert_eq!(pool_agg.time.alive_ns, 2 * S, "the run's start to now");
    assert_eq!(pool_agg.time.cpu_ns, Some(0));
    assert_eq!(pool_agg.role.as_ref().map(|d| d.role), Some(Role::Libuv));
    assert!(pool_agg.is_idle());
    // One more second: the pool thread ran all of it, the main thread none of it.
    tot.note_bystander(&seen(12, 50, "libuv-worker", Role::Libuv, 31, 103));
    tot.note_bystander(&seen(10, 10, "node", Role::Main, 40, 103));
    let mut second = Window::default();
    tot.tick(103 * S, Some(&mut second));
    second.settle(false);
    // (Process 10 took no lock in the second window: settled only with `all`.)
    assert!(second.processes.is_empty());
    let mut all = Window::default();
    tot.tick(103 * S, Some(&mut all));
    all.settle(true);
    assert_eq!(all.processes[&P10].len(), 3, "every thread, idle");
    // The run's window: every thread, with its time since the run began.
    let run = tot.window();
    let r = &run.processes[&P10];
    assert_eq!(r.len(), 3);
    assert_eq!(r[&pool.thread].time.cpu_ns, Some(S));
    assert_eq!(r[&main.thread].time.alive_ns, 3 * S);
    assert_eq!(
        r[&main.thread].role.as_ref().map(|d| d.role),
        Some(Role::Main)
    );
    assert_eq!(tot.bystanders(), 2);
}

/// A bystander that takes the lock becomes a profiled thread with the life and CPU counted so
/// far: nothing counted twice.
#[test]
fn a_bystander_that_takes_the_lock_keeps_its_life() {
    let mut tot = Totals::starting_at(100 * S);
    let b = seen(13, 90, "node", Role::Other, 7, 101);
    tot.note_bystander(&b);
    tot.tick(102 * S, None);
    tot.note_bystander(&seen(13, 90, "node", Role::Other, 8, 103));
    let key = StatsKey {
        tid: 13,
        tid_start: 90 * S,
        ..W
    };
    tot.update(&[(key, kernel_entry(&[(5, 5)]))]);
    assert_eq!(tot.bystanders(), 0, "profiled now");
    tot.note_cpu(b.thread, 9 * S, None, 104 * S);
    tot.tick(104 * S, None);
    let run = tot.window();
    let t = &run.processes[&P10][&b.thread];
    assert_eq!(t.time.alive_ns, 4 * S, "one life, from the run's start");
    assert_eq!(
        t.time.cpu_ns,
        Some(2 * S),
        "from its first report, as a bystander"
    );
    assert!(!t.is_idle());
}

/// A bystander's exit ends its life; the exit's second copy is not a new thread; a process
/// gone ends the bystanders whose exits were not told.
#[test]
fn a_bystanders_exit_retires_it_once() {
    let mut tot = Totals::starting_at(100 * S);
    let short = seen(14, 101, "node", Role::Other, 0, 101);
    tot.note_bystander(&short);
    let exit = BystanderSeen {
        exited: true,
        cpu_ns: S / 2,
        queued_ns: None,
        at_ns: 102 * S,
        ..short
    };
    tot.note_bystander(&exit);
    tot.tick(103 * S, None);
    assert_eq!(tot.bystanders(), 0, "retired");
    tot.note_bystander(&exit);
    assert_eq!(tot.bystanders(), 0, "the second copy of its exit");
    let lost = seen(15, 100, "node", Role::Other, 1, 101);
    tot.note_bystander(&lost);
    tot.end_bystanders_of(P10, 104 * S);
    tot.tick(105 * S, None);
    let run = tot.window();
    let threads = &run.processes[&P10];
    assert_eq!(threads[&short.thread].time.alive_ns, S, "101 s to its exit");
    assert_eq!(threads[&short.thread].time.cpu_ns, Some(S / 2));
    assert_eq!(
        threads[&lost.thread].time.alive_ns,
        4 * S,
        "to its process's end"
    );
    assert_eq!(tot.bystanders(), 0);
    // The agent keeps no history: a retired bystander leaves nothing behind.
    let mut agent = Totals::starting_at(100 * S);
    agent.keep_retired = false;
    agent.note_bystander(&exit);
    agent.tick(103 * S, None);
    assert!(agent.window().processes.is_empty());
}
