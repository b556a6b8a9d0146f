//! What the lock cost a process, in words: its threads' time shares, and who made whom wait.

use std::fmt::Write as _;

use super::{TOP_THREADS, count_of, fmt_ns, fmt_per_cpu, fmt_share};
use crate::{
    output::report::{ProcessReport, role_totals},
    registry::roles::Role,
};

/// What the lock cost the process's threads: `worker threads spent 6.1% of their time
/// waiting for mmap_lock (0.180 s of wait per CPU-second)`, per role, then for the process.
pub fn time_share_text(p: &ProcessReport) -> String {
    let mut out = String::new();
    let Some(all) = &p.time_share else {
        return out;
    };
    let cpu = |s: &crate::output::report::TimeShare| {
        s.cpu.map_or(String::new(), |c| {
            format!(" ({} of wait per CPU-second)", fmt_per_cpu(c))
        })
    };
    // Every thread of the process, whether it took the lock or not: its whole time.
    let threads = all.threads.map_or("its threads".to_string(), |n| {
        format!("its {}", count_of(n, "thread", "threads"))
    });
    let ran = all
        .cpu_ns
        .map_or(String::new(), |c| format!(", {} of CPU", fmt_ns(c)));
    let _ = writeln!(
        out,
        "\n  time share: {threads} spent {} of their time waiting for mmap_lock{} ({} of wait in {} alive{ran})",
        fmt_share(all.wall),
        cpu(all),
        fmt_ns(all.wait_ns),
        fmt_ns(all.alive_ns)
    );
    let mut roles: Vec<_> = p.time_share_by_role.iter().flatten().collect();
    roles.sort_by(|a, b| b.share.wall.total_cmp(&a.share.wall));
    for r in roles
        .iter()
        .filter(|r| r.share.wait_ns > 0)
        .take(TOP_THREADS)
    {
        let _ = writeln!(
            out,
            "    {} threads{} spent {} of their time waiting for mmap_lock{}",
            r.role.as_str(),
            r.share.threads.map_or(String::new(), |n| format!(" ({n})")),
            fmt_share(r.share.wall),
            cpu(&r.share)
        );
    }
    out
}

/// "Who made whom wait": waits (write and read) by waiter role, charged to holder role and
/// cause, as a share of that role's wait, every waiting role shown; then the threads that held the lock the longest while
/// others waited. The header says what is added up (the process's threads' waits, write and
/// read, the profiler's own left out as everywhere else) and why it never exceeds them.
pub fn blockers_text(p: &ProcessReport) -> String {
    let mut out = String::new();
    let (Some(roles), Some(blockers)) = (&p.blocked_by_role, &p.blockers) else {
        return out;
    };
    let total_wait = p.lock.write.wait_ns.sum + p.lock.read.wait_ns.sum;
    let charged = p.blocked_wait_ns.unwrap_or(0);
    let _ = writeln!(
        out,
        "\n  who made whom wait: {} of the {} its threads waited (write and read) is charged to the holds they waited behind",
        fmt_ns(charged),
        fmt_ns(total_wait),
    );
    out.push_str(
        "    (each wait is split among the holds it overlapped, overlapping read holds in proportion, so no wait is charged more than it lasted; the rest overlapped no hold seen)\n",
    );
    let shown = crate::output::blockers::shown_rows(roles, TOP_THREADS);
    if shown.is_empty() {
        out.push_str("    no wait was charged to another thread's hold\n");
    } else {
        let _ = writeln!(
            out,
            "    {:<9} {:<9} {:<11} {:>10} {:>10} {:>10} {:>6}",
            "waiter", "holder", "its hold", "wait", "write wait", "read wait", "share"
        );
        let role_wait: Vec<(Role, u64)> = role_totals(p)
            .iter()
            .map(|r| (r.role, r.wait_ns()))
            .collect();
        for r in shown {
            let of = role_wait
                .iter()
                .find(|w| w.0 == r.waiter_role)
                .map_or(0, |w| w.1);
            let share = if of == 0 {
                "-".to_string()
            } else {
                format!("{:.0}%", 100.0 * r.wait_ns as f64 / of as f64)
            };
            let _ = writeln!(
                out,
                "    {:<9} {:<9} {:<11} {:>10} {:>10} {:>10} {share:>6}",
                r.waiter_role.as_str(),
                r.holder_role.as_str(),
                r.cause,
                fmt_ns(r.wait_ns),
                fmt_ns(r.write_wait_ns),
                fmt_ns(r.wait_ns.saturating_sub(r.write_wait_ns)),
            );
        }
        out.push_str(
            "    (largest wait first, and every waiting role's largest row; share: of all the wait, write and read, of the waiter's role)\n",
        );
    }
    if !blockers.is_empty() {
        let _ = writeln!(
            out,
            "    blockers: {}",
            blockers
                .iter()
                .take(3)
                .map(|b| format!(
                    "{} {} {} {} ({} waits, {})",
                    b.tid,
                    b.role.as_str(),
                    b.comm,
                    b.cause,
                    b.waits,
                    fmt_ns(b.wait_ns)
                ))
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
    out
}

/// Contention mode: what the writers that sampled waits began behind were running (their
/// stacks and JavaScript functions), most wait first.
pub fn holders_text(p: &ProcessReport) -> String {
    let mut out = String::new();
    let Some(stacks) = p.holder_stacks.as_ref().filter(|s| !s.is_empty()) else {
        return out;
    };
    let _ = writeln!(
        out,
        "\n  held by: what the writers that sampled write waits began behind were running"
    );
    if let Some(functions) = p.holder_functions.as_ref().filter(|f| !f.is_empty()) {
        for f in functions.iter().take(3) {
            let file = if f.file.is_empty() {
                String::new()
            } else {
                format!(" ({})", f.file)
            };
            let _ = writeln!(
                out,
                "    {}{file}: {} waits behind it (held for {}), {} waited",
                f.function,
                f.waits,
                f.cause,
                fmt_ns(f.wait_ns_sum)
            );
        }
    }
    for s in stacks.iter().take(2) {
        let _ = writeln!(
            out,
            "    {} waits behind it, {} waited:",
            s.count,
            fmt_ns(s.wait_ns_sum)
        );
        for f in s.frames.iter().take(8) {
            let _ = writeln!(out, "      {f}");
        }
    }
    out
}
