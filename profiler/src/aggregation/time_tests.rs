use super::*;
use crate::aggregation::ThreadAgg;
use crate::aggregation::tests::{P10, T11, W, kernel_entry};
use crate::vocab::{hist::SideStats, ids::ProcId};
use profiler_common::{COMM_LEN, StatsKey};

const S: u64 = 1_000_000_000;

#[test]
fn alive_is_the_life_clipped_to_the_window() {
    let mut l = Life::new(10 * S, None);
    assert_eq!(l.alive_within(0, 15 * S), 5 * S, "started in the window");
    assert_eq!(l.alive_within(12 * S, 15 * S), 3 * S, "started before it");
    assert_eq!(l.alive_within(0, 5 * S), 0, "not born yet");
    l.exit_ns = Some(13 * S);
    assert_eq!(l.alive_within(12 * S, 15 * S), S, "exited in it");
    assert_eq!(l.alive_within(14 * S, 15 * S), 0, "gone before it");
}

#[test]
fn reports_keep_the_first_and_the_latest_whatever_their_order() {
    let t = ThreadId::new(7, 100);
    let mut c = CpuTimes::default();
    c.note(t, 2_000, None, 20);
    c.note(t, 4_000, None, 30);
    // An older report arriving late: it is the first, not the last.
    c.note(t, 1_000, None, 10);
    let s = *c.get(t).unwrap();
    assert_eq!((s.first_ns, s.last_ns), (1_000, 4_000));
    assert_eq!(c.take(t), Some(s));
    assert_eq!(c.len(), 0);
}

/// A thread's CPU in a window is its CPU at the window's end less at its start.
#[test]
fn cpu_counts_from_the_windows_start_or_the_first_report() {
    // A window ending at `at` in a run that began at 5 s, the thread's CPU first and
    // last reported as `first_ns` and `last_ns`.
    let tick = |life: &mut Life, first_ns, last_ns, at| {
        let seen = CpuSeen {
            first_ns,
            first_at: 0,
            last_ns,
            last_at: 0,
            ..CpuSeen::default()
        };
        life.cpu_tick(Some(&seen), at, 5 * S)
    };
    // Born during the run (epoch 5 s) and in the first window: all it ran is the run's.
    let mut young = Life::new(10 * S, None);
    assert_eq!(young.cpu_tick(None, 5 * S, 5 * S), None, "no report yet");
    assert_eq!(young.cpu_total(), None);
    assert_eq!(tick(&mut young, 300, 300, 5 * S), Some(300));
    // The next window: from the CPU at the previous tick.
    assert_eq!(tick(&mut young, 300, 500, 11 * S), Some(200));
    assert_eq!(young.cpu_total(), Some(500));
    // An idle window (no new report): nothing ran.
    assert_eq!(tick(&mut young, 300, 500, 12 * S), Some(0));
    // Predates the run: counted from its first report.
    let mut old = Life::new(S, None);
    assert_eq!(tick(&mut old, 9_000, 9_400, 5 * S), Some(400));
    assert_eq!(tick(&mut old, 9_000, 9_700, 6 * S), Some(300));
    assert_eq!(old.cpu_total(), Some(700));
    // Born during the run but before the window it is first reported in: the window
    // counts it from that report, the run from its start.
    let mut late = Life::new(7 * S, None);
    assert_eq!(tick(&mut late, 800, 900, 8 * S), Some(100));
    assert_eq!(late.cpu_total(), Some(900));
    assert_eq!(
        old.in_run(5 * S, 7 * S),
        ThreadTime {
            alive_ns: 2 * S,
            cpu_ns: Some(700),
            queued_ns: None,
        }
    );
}

#[test]
fn merging_times_adds_what_is_known() {
    let mut a = ThreadTime {
        alive_ns: 5,
        cpu_ns: None,
        queued_ns: None,
    };
    a.merge(&ThreadTime {
        alive_ns: 7,
        cpu_ns: Some(3),
        queued_ns: None,
    });
    assert_eq!((a.alive_ns, a.cpu_ns), (12, Some(3)));
    a.merge(&ThreadTime {
        alive_ns: 1,
        cpu_ns: Some(2),
        queued_ns: None,
    });
    assert_eq!(a.cpu_ns, Some(5));
}

/// As a poll does it: the kernel's CPU reports (the iterator's, and exit notices'), the
/// entries read, then the tick.
#[test]
fn threads_time_is_counted_from_their_start_or_the_runs_to_their_exit() {
    const S: u64 = 1_000_000_000;
    let mut tot = Totals::starting_at(100 * S);
    // Thread 11 started before the run (20 s), thread 12 during it (101 s).
    let young = StatsKey {
        tid: 12,
        tid_start: 101 * S,
        ..W
    };
    let t12 = ThreadId::new(12, 10100);
    // 11 has run 50 s before the run, 12 0.2 s since it started; reported before their
    // first entries are read.
    tot.note_cpu(T11, 50 * S, None, 102 * S);
    tot.note_cpu(t12, S / 5, None, 102 * S);
    tot.update(&[
        (W, kernel_entry(&[(5, 5)])),
        (young, kernel_entry(&[(7, 7)])),
    ]);
    let mut interval = Window::default();
    tot.tick(102 * S, Some(&mut interval));
    interval.settle(true);
    let iv = &interval.processes[&P10];
    assert_eq!(iv[&T11].time.alive_ns, 2 * S, "the run's start to now");
    assert_eq!(
        iv[&T11].time.cpu_ns,
        Some(0),
        "counted from its first report"
    );
    assert_eq!(iv[&t12].time.alive_ns, S);
    assert_eq!(iv[&t12].time.cpu_ns, Some(S / 5), "counted from its start");
    // 11 runs 1 s more without taking the lock (idle threads are alive in an interval
    // too); 12 is reported at 0.5 s, then exits at 103.5 s having run 1 s: its exit
    // notice carries what it ran after its last report.
    tot.note_cpu(T11, 51 * S, None, 104 * S);
    tot.note_cpu(t12, S / 2, None, 103 * S);
    tot.note_cpu(t12, S, None, 103 * S + S / 2);
    tot.note_exit(t12, 103 * S + S / 2);
    let mut next = Window::default();
    tot.tick(104 * S, Some(&mut next));
    next.settle(true);
    let nx = &next.processes[&P10];
    assert!(nx[&T11].is_idle());
    assert_eq!(
        nx[&T11].time,
        ThreadTime {
            alive_ns: 2 * S,
            cpu_ns: Some(S),
            queued_ns: None,
        }
    );
    assert_eq!(
        nx[&t12].time,
        ThreadTime {
            alive_ns: 3 * S / 2,
            cpu_ns: Some(S - S / 5),
            queued_ns: None,
        }
    );
    // The run: 11 alive 4 s, 1 s of CPU; 12 alive 2.5 s, 1 s of CPU.
    tot.retire(P10, t12, None);
    let w = tot.window();
    assert_eq!(
        w.processes[&P10][&T11].time,
        ThreadTime {
            alive_ns: 4 * S,
            cpu_ns: Some(S),
            queued_ns: None,
        }
    );
    assert_eq!(
        w.processes[&P10][&t12].time,
        ThreadTime {
            alive_ns: 5 * S / 2,
            cpu_ns: Some(S),
            queued_ns: None,
        }
    );
    // A gone thread's reports are forgotten with it, and one arriving late (an iterator
    // pass that saw it exiting) at the next tick.
    assert!(tot.cpu.get(t12).is_none());
    tot.note_cpu(t12, S + 1, None, 104 * S);
    // An exit (and CPU) noticed before the thread's first entry is read is not lost.
    let t13 = ThreadId::new(13, 10100);
    tot.note_cpu(t13, 7, None, 103 * S);
    tot.note_exit(t13, 103 * S);
    let late = StatsKey {
        tid: 13,
        tid_start: 101 * S,
        ..W
    };
    tot.update(&[(late, kernel_entry(&[(1, 1)]))]);
    tot.tick(105 * S, None);
    assert_eq!((tot.cpu.len(), tot.early_cpu.len()), (2, 0));
    let w = tot.window();
    assert_eq!(
        w.processes[&P10][&t13].time,
        ThreadTime {
            alive_ns: 2 * S,
            cpu_ns: Some(7),
            queued_ns: None,
        }
    );
}

#[test]
fn idle_time_joins_a_process_that_took_a_lock_and_is_dropped_for_one_that_did_not() {
    let p20 = ProcId::new(20, 1);
    let [a, b, c] = ThreadId::made_up([11, 12, 21]);
    let who = (10, [0u8; COMM_LEN], 0);
    let second = ThreadTime {
        alive_ns: S,
        cpu_ns: Some(S / 10),
        queued_ns: None,
    };
    let mut w = Window::default();
    // First tick: nothing took a lock yet; every thread's second is kept apart.
    for (p, t) in [(P10, a), (P10, b), (p20, c)] {
        w.add_time(p, t, who, &second);
    }
    assert!(w.processes.is_empty());
    // Then thread a takes the lock, and a second tick.
    let active = ThreadAgg {
        read: SideStats {
            count: 1,
            ..SideStats::default()
        },
        ..ThreadAgg::new(10, [0; COMM_LEN], 0)
    };
    w.add_thread(P10, a, &active);
    for (p, t) in [(P10, a), (P10, b), (p20, c)] {
        w.add_time(p, t, who, &second);
    }
    let mut agent = w.clone();
    w.retain_active();
    let two = ThreadTime {
        alive_ns: 2 * S,
        cpu_ns: Some(S / 5),
        queued_ns: None,
    };
    assert_eq!(w.processes.len(), 1, "process 20 took no lock");
    assert_eq!(w.processes[&P10][&a].time, two);
    assert_eq!(w.processes[&P10][&b].time, two, "idle, both seconds");
    assert_eq!(w.processes[&P10][&a].read.count, 1);
    // The agent's view keeps every live thread's time.
    agent.settle(true);
    assert_eq!(agent.processes[&p20][&c].time, two);
    assert_eq!(agent.processes[&P10][&b].time, two);
}

/// A thread's run-queue delay (time runnable, waiting for a CPU) is counted as its CPU time
/// is, from the same reports: from its start or its first report, window by window, and
/// absent where the kernel keeps none.
#[test]
fn run_queue_delay_is_counted_beside_the_cpu_time() {
    const S: u64 = 1_000_000_000;
    let mut tot = Totals::starting_at(100 * S);
    let young = StatsKey {
        tid: 12,
        tid_start: 101 * S,
        ..W
    };
    let t12 = ThreadId::new(12, 10100);
    // 11 predates the run (its 7 s of queueing before it are not the run's); 12 started in
    // it and queued 0.3 s by its first report.
    tot.note_cpu(T11, 50 * S, Some(7 * S), 102 * S);
    tot.note_cpu(t12, S / 5, Some(3 * S / 10), 102 * S);
    tot.update(&[
        (W, kernel_entry(&[(5, 5)])),
        (young, kernel_entry(&[(7, 7)])),
    ]);
    let mut first = Window::default();
    tot.tick(102 * S, Some(&mut first));
    first.settle(true);
    let iv = &first.processes[&P10];
    assert_eq!(iv[&T11].time.queued_ns, Some(0), "from its first report");
    assert_eq!(iv[&t12].time.queued_ns, Some(3 * S / 10), "from its start");
    // The next window: what each queued since.
    tot.note_cpu(T11, 51 * S, Some(7 * S + S / 2), 103 * S);
    tot.note_cpu(t12, S / 2, Some(S), 103 * S);
    tot.update(&[
        (W, kernel_entry(&[(6, 6)])),
        (young, kernel_entry(&[(8, 8)])),
    ]);
    let mut second = Window::default();
    tot.tick(103 * S, Some(&mut second));
    second.settle(true);
    let iv = &second.processes[&P10];
    assert_eq!(iv[&T11].time.queued_ns, Some(S / 2));
    assert_eq!(iv[&t12].time.queued_ns, Some(7 * S / 10));
    // A kernel that keeps none: absent, not 0.
    let mut none = Totals::starting_at(100 * S);
    none.note_cpu(T11, 50 * S, None, 102 * S);
    none.update(&[(W, kernel_entry(&[(5, 5)]))]);
    let mut w = Window::default();
    none.tick(102 * S, Some(&mut w));
    w.settle(true);
    assert_eq!(w.processes[&P10][&T11].time.queued_ns, None);
    assert_eq!(w.processes[&P10][&T11].time.cpu_ns, Some(0));
}
