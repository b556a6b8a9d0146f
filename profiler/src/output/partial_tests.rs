use super::*;
use crate::output::fixtures::{interval, stats};

#[test]
fn interval_lines_add_up_per_process_thread_and_cause() {
    let mut a = interval("2026-01-01T00:00:01.000Z", 100);
    let mut b = interval("2026-01-01T00:00:02.000Z", 100);
    a.processes[0].lock.write = stats(4, 4096, 3000, &[(1024, 3), (4096, 1)]);
    b.processes[0].lock.write = stats(2, 1 << 19, (1 << 20) - 1, &[(1024, 1), (1 << 20, 1)]);
    b.processes[0].threads[1].role = Role::Libuv;
    // An addon thread named in the first line only: it stays named.
    a.processes[0].threads[0].role = Role::Addon;
    a.processes[0].threads[0].role_addon = Some("/app/a.node".into());
    a.processes[0].threads[0].role_library = Some("/app/liba.so".into());
    b.processes[0].threads[0].role = Role::Addon;
    // The cgroup and executable of the first line only: kept (`compare --by` reads them).
    a.processes[0].cgroup = Some("/app.slice/a.scope".into());
    a.processes[0].exe = Some("/usr/bin/node".into());
    a.lost.nested = 2;
    b.lost.nested = 3;
    b.uncounted.fork_child = 4;
    let mut s = Summed::default();
    s.add(&a);
    s.add(&b);
    let r = s.report();
    assert_eq!(
        (r.start.as_str(), r.end.as_str()),
        ("2026-01-01T00:00:00.000Z", "2026-01-01T00:00:02.000Z")
    );
    // The lines' span and count, which the text and the page say.
    assert_eq!((r.duration_s, r.summed_lines), (Some(2.0), Some(2)));
    let p = &r.processes[0];
    assert_eq!(r.processes.len(), 1);
    assert_eq!(p.lock.write.count, 6);
    assert_eq!(p.lock.write.wait_ns.sum, 4096 + (1 << 19));
    assert_eq!(p.lock.write.wait_ns.max, (1 << 20) - 1);
    assert_eq!(
        p.lock.write.wait_ns.buckets,
        [(1024, 4), (4096, 1), (1 << 20, 1)]
    );
    // The percentiles of the sum, by the one definition: 6 waits, the median in the
    // 1024 bucket, the p99 in the last one (at its middle, within hdrhistogram's 1%).
    let (p50, p99) = (p.lock.write.wait_ns.p50, p.lock.write.wait_ns.p99);
    assert!((768..776).contains(&p50), "{p50}");
    assert!(
        ((1 << 19) + (1 << 18)..(1 << 20) - 1).contains(&p99),
        "{p99}"
    );
    assert_eq!([p50, p99], p.lock.write.side().wait.quantiles([0.5, 0.99]));
    assert_eq!(p.lock.causes[0].cause, "mprotect");
    assert_eq!(p.lock.causes[0].write.count, 14);
    // Two threads, the worker's latest role.
    assert_eq!(p.threads.len(), 2);
    assert_eq!(p.threads[0].role, Role::Libuv);
    assert_eq!(p.threads[0].lock.write.count, 12);
    assert_eq!(p.threads[1].role, Role::Addon);
    assert_eq!(
        (
            p.threads[1].role_addon.as_deref(),
            p.threads[1].role_library.as_deref()
        ),
        (Some("/app/a.node"), Some("/app/liba.so"))
    );
    assert_eq!(p.cgroup.as_deref(), Some("/app.slice/a.scope"));
    assert_eq!(p.exe.as_deref(), Some("/usr/bin/node"));
    assert_eq!((r.lost.nested, r.uncounted.fork_child), (5, 4));
}

/// The time shares of the lines add up: waits and times summed, the ratios of the sums.
#[test]
fn interval_lines_time_shares_add_up() {
    use crate::output::report::{RoleShare, TimeShare};
    let share = |wait_ns, alive_ns, cpu_ns: Option<u64>, threads| TimeShare {
        wait_ns,
        alive_ns,
        wall: wait_ns as f64 / alive_ns as f64,
        cpu_ns,
        cpu: cpu_ns.map(|c| wait_ns as f64 / c as f64),
        queued_ns: None,
        threads,
    };
    let mut lines = Vec::new();
    for (wait, cpu) in [(100, Some(400)), (300, None)] {
        let mut l = interval("2026-01-01T00:00:01.000Z", 100);
        let p = &mut l.processes[0];
        p.threads[1].time_share = Some(share(wait, 1000, cpu, None));
        p.time_share = Some(share(wait, 2000, cpu, Some(2)));
        p.time_share_by_role = Some(vec![RoleShare {
            role: Role::Worker,
            share: share(wait, 1000, cpu, Some(1)),
        }]);
        lines.push(l);
    }
    // A line from before time shares: nothing to add.
    lines.push(interval("2026-01-01T00:00:02.000Z", 100));
    let mut s = Summed::default();
    lines.iter().for_each(|l| s.add(l));
    let r = s.report();
    let p = &r.processes[0];
    let all = p.time_share.as_ref().unwrap();
    assert_eq!((all.wait_ns, all.alive_ns, all.wall), (400, 4000, 0.1));
    // Over CPU: only the line whose CPU time was known.
    assert_eq!(
        (all.cpu_ns, all.cpu, all.threads),
        (Some(400), Some(0.25), Some(2))
    );
    let w = &p.time_share_by_role.as_ref().unwrap()[0];
    assert_eq!(
        (w.role, w.share.wall, w.share.threads),
        (Role::Worker, 0.2, Some(1))
    );
    let t = p.threads.iter().find(|t| t.role == Role::Worker).unwrap();
    let ts = t.time_share.as_ref().unwrap();
    assert_eq!((ts.wait_ns, ts.alive_ns, ts.threads), (400, 2000, None));
    // A thread whose lines had no share has none.
    assert!(
        p.threads
            .iter()
            .any(|t| t.role == Role::Main && t.time_share.is_none())
    );
}
