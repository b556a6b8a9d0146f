//! The detectors of the patterns (the table is in `patterns`): each reads one process of a
//! summary and returns its finding, or None.

use std::collections::BTreeMap;

use super::{
    Finding, Severity, ThreadRef,
    evidence::{finding, js_functions, pct, ratio, roles_text, stacks_of},
    patterns::*,
    view::{self, Process, Summary},
};
use crate::output::text::fmt_ns;

pub(super) fn not_a_bottleneck(_: &Summary, p: &Process) -> Option<Finding> {
    let share = p.time_share.as_ref()?;
    let cpu_small = share.cpu.is_none_or(|c| c < NOT_A_BOTTLENECK_SHARE);
    let roles_small = p.time_share_by_role.iter().flatten().all(|r| {
        r.role == "foreign" || r.role == "profiler" || r.share.wall < NOT_A_BOTTLENECK_ROLE_SHARE
    });
    if share.wall >= NOT_A_BOTTLENECK_SHARE || !cpu_small || !roles_small {
        return None;
    }
    let cpu = share.cpu.map_or(String::new(), |c| {
        format!(" ({} of their CPU time)", pct(c))
    });
    let mut f = Finding {
        severity: Severity::Info,
        time_share: Some(share.wall),
        ..finding(
            &Summary::default(),
            p,
            format!(
                "mmap_lock is not this process's bottleneck: its threads waited {} of their time for it{cpu}",
                pct(share.wall)
            ),
            share.wait_ns,
            &[],
        )
    };
    f.evidence.facts.push(format!(
        "{} of wait against {} of its {} threads' time alive{}",
        fmt_ns(share.wait_ns),
        fmt_ns(share.alive_ns),
        share.threads.unwrap_or(0),
        share
            .cpu_ns
            .map_or(String::new(), |c| format!(" and {} of CPU time", fmt_ns(c)))
    ));
    Some(f)
}

pub(super) fn arena_growth(s: &Summary, p: &Process) -> Option<Finding> {
    let (n, wait, per_role) = p.writes_by("mprotect", NON_MAIN);
    if n < MIN_WRITES || ratio(wait, p.wait()) < MIN_SHARE_OF_WAIT {
        return None;
    }
    let (sampled, malloc, code) = stacks_of(p, "mprotect", true);
    // Sampled stacks that are mostly not malloc's: mprotect for another reason (JIT code).
    if sampled >= 10 && malloc * 2 < sampled {
        return None;
    }
    let (roles, by_role) = roles_text(&per_role);
    let involved: Vec<&str> = roles.iter().map(String::as_str).collect();
    let mut f = finding(
        s,
        p,
        format!(
            "glibc's malloc arenas of the {} threads grow and shrink: {n} mprotect writes",
            roles.first().map_or("non-main", String::as_str)
        ),
        wait,
        &involved,
    );
    f.evidence.roles = roles;
    f.evidence.causes = vec!["mprotect".into()];
    f.evidence.code = code;
    f.evidence.js_functions = js_functions(p);
    f.evidence.facts.push(format!(
        "mprotect writes by thread role: {by_role}; they waited {} ({} of the process's wait)",
        fmt_ns(wait),
        pct(ratio(wait, p.wait()))
    ));
    if sampled > 0 {
        f.evidence.facts.push(format!(
            "{malloc} of {sampled} sampled mprotect stacks are malloc's (a thread's arena growing)"
        ));
    }
    Some(f)
}

pub(super) fn mmap_threshold(s: &Summary, p: &Process) -> Option<Finding> {
    let (mmaps, w1, r1) = p.writes_by("mmap", JS);
    let (munmaps, w2, r2) = p.writes_by("munmap", JS);
    let (n, wait) = (mmaps + munmaps, w1 + w2);
    if n < MIN_WRITES || ratio(wait, p.wait()) < MIN_SHARE_OF_WAIT {
        return None;
    }
    let (sampled, malloc, code) = stacks_of(p, "mmap", true);
    if sampled >= 10 && malloc * 2 < sampled {
        return None;
    }
    let mut per_role = r1;
    for (r, k) in r2 {
        *per_role.entry(r).or_default() += k;
    }
    let (roles, by_role) = roles_text(&per_role);
    let involved: Vec<&str> = roles.iter().map(String::as_str).collect();
    let mut f = finding(
        s,
        p,
        format!(
            "large allocations map and unmap memory of their own: {mmaps} mmap and {munmaps} munmap writes"
        ),
        wait,
        &involved,
    );
    f.evidence.roles = roles;
    f.evidence.causes = vec!["mmap".into(), "munmap".into()];
    f.evidence.code = code;
    f.evidence.js_functions = js_functions(p);
    f.evidence.facts.push(format!(
        "mmap and munmap writes by thread role: {by_role}; they waited {}",
        fmt_ns(wait)
    ));
    if sampled > 0 {
        f.evidence.facts.push(format!(
            "{malloc} of {sampled} sampled mmap stacks are malloc's (an allocation above glibc's mmap threshold)"
        ));
    }
    Some(f)
}

pub(super) fn fault_reads(s: &Summary, p: &Process) -> Option<Finding> {
    let roles = p.blocked_by_role.as_ref()?;
    let mut waiters: BTreeMap<String, u64> = BTreeMap::new();
    let mut holders: BTreeMap<String, u64> = BTreeMap::new();
    let mut wait = 0;
    for r in roles
        .iter()
        .filter(|r| r.cause == "read" && r.write_wait_ns > 0)
    {
        wait += r.write_wait_ns;
        *waiters.entry(r.waiter_role.clone()).or_default() += r.write_wait_ns;
        *holders.entry(r.holder_role.clone()).or_default() += r.write_wait_ns;
    }
    if ratio(wait, p.write.wait_ns.sum) < 0.25 || ratio(wait, p.wait()) < MIN_SHARE_OF_WAIT {
        return None;
    }
    let (waiter_roles, _) = roles_text(&waiters);
    let (holder_roles, _) = roles_text(&holders);
    let involved: Vec<&str> = waiter_roles.iter().map(String::as_str).collect();
    let mut f = finding(
        s,
        p,
        format!(
            "writers wait behind page faults' read holds: {} of the write wait",
            pct(ratio(wait, p.write.wait_ns.sum))
        ),
        wait,
        &involved,
    );
    f.evidence.facts.push(format!(
        "{} of the writers' {} wait was charged to read holds (by {} threads), {} read acquisitions in all",
        fmt_ns(wait),
        fmt_ns(p.write.wait_ns.sum),
        holder_roles.join(", "),
        p.read.count
    ));
    f.evidence.roles = waiter_roles;
    f.evidence.causes = vec!["read".into()];
    f.evidence.js_functions = js_functions(p);
    Some(f)
}

const WRITE_CAUSES: &[&str] = &[
    "mmap",
    "munmap",
    "mprotect",
    "brk",
    "madvise",
    "mremap",
    "fork",
    "exit",
    "page_fault",
    "other",
];

pub(super) fn long_holds(s: &Summary, p: &Process) -> Option<Finding> {
    // With blockers: the thread whose holds were charged the most, if one thread's writes.
    let (holder, cause, charged, waits) = match p.blockers.as_ref() {
        Some(b) => {
            let top = b
                .iter()
                .find(|b| WRITE_CAUSES.contains(&b.cause.as_str()))?;
            if ratio(top.wait_ns, p.wait()) < 0.3 {
                return None;
            }
            (top.tid, top.cause.clone(), top.wait_ns, Some(top.waits))
        }
        // Without: the thread holding the lock for write longest in one cause.
        None => {
            let (t, c) = p
                .own()
                .flat_map(|t| t.causes.iter().map(move |c| (t, c)))
                .max_by_key(|(_, c)| c.write.hold_ns.sum)?;
            let others: u64 = p.own().filter(|o| o.tid != t.tid).map(|o| o.wait()).sum();
            if ratio(c.write.hold_ns.sum, p.wait()) < 0.3 || others == 0 {
                return None;
            }
            (
                t.tid,
                c.cause.clone(),
                c.write.hold_ns.sum.min(others),
                None,
            )
        }
    };
    let t = p.threads.iter().find(|t| t.tid == holder)?;
    let holds = t.cause(&cause)?;
    if holds.count == 0 || holds.hold_ns.mean < LONG_HOLD_NS {
        return None;
    }
    let roles: Vec<&str> = p
        .own()
        .filter(|o| o.tid != holder)
        .map(|o| o.role.as_str())
        .collect();
    let mut f = finding(
        s,
        p,
        format!(
            "thread {holder} ({}, {}) holds mmap_lock for write in {cause} for {} at a time: the others wait behind it",
            t.comm,
            t.role,
            fmt_ns(holds.hold_ns.mean as u64)
        ),
        charged,
        &roles,
    );
    f.evidence.facts.push(format!(
        "{} {cause} calls held the lock {} in all (up to {} each)",
        holds.count,
        fmt_ns(holds.hold_ns.sum),
        fmt_ns(holds.hold_ns.max)
    ));
    f.evidence.facts.push(match waits {
        Some(w) => format!(
            "{} of the others' wait ({w} waits) is charged to its holds",
            fmt_ns(charged)
        ),
        None => format!(
            "without --blockers, who waited behind it is not measured: up to {} of the others' wait",
            fmt_ns(charged)
        ),
    });
    f.evidence.threads.push(ThreadRef {
        tid: holder,
        role: t.role.clone(),
        comm: t.comm.clone(),
        cause: cause.clone(),
    });
    f.evidence.causes = vec![cause];
    f.evidence.roles = vec![t.role.clone()];
    Some(f)
}

pub(super) fn addon_threads(s: &Summary, p: &Process) -> Option<Finding> {
    let addon: Vec<&view::Thread> = p.own().filter(|t| t.role == "addon").collect();
    let (writes, wait): (u64, u64) = addon
        .iter()
        .fold((0, 0), |a, t| (a.0 + t.write.count, a.1 + t.wait()));
    let sampled: u64 = p.dsos.iter().flatten().map(|d| d.write.count).sum();
    let files: Vec<&view::Dso> = p
        .dsos
        .iter()
        .flatten()
        .filter(|d| d.dso.ends_with(".node"))
        .collect();
    let file_writes: u64 = files.iter().map(|d| d.write.count).sum();
    if writes < MIN_WRITES && (file_writes < MIN_WRITES || ratio(file_writes, sampled) < 0.1) {
        return None;
    }
    // Sampled writes' wait, scaled to all writes by the sampling rate.
    let scale = s.stack_sample.unwrap_or(1).max(1);
    let file_wait: u64 = files.iter().map(|d| d.write.wait_ns.sum * scale).sum();
    let names: Vec<String> = files
        .iter()
        .map(|d| {
            std::path::Path::new(&d.dso)
                .file_name()
                .map_or(d.dso.clone(), |n| n.to_string_lossy().into_owned())
        })
        .collect();
    let what = if names.is_empty() {
        "a native addon (sample stacks to name its .node file)".to_string()
    } else {
        names.join(", ")
    };
    let explained = wait.max(file_wait);
    let mut roles = vec!["addon"];
    if !files.is_empty() {
        roles.extend(JS);
    }
    let mut f = finding(
        s,
        p,
        format!("{what} takes the lock for write itself: {writes} writes by its own threads"),
        explained,
        &roles,
    );
    f.evidence.facts.push(format!(
        "{} addon thread(s): {writes} writes, {} of wait",
        addon.len(),
        fmt_ns(wait)
    ));
    for d in &files {
        f.evidence.facts.push(format!(
            "{} of {sampled} sampled writes came from {}",
            d.write.count, d.dso
        ));
    }
    f.evidence.code = files.iter().map(|d| d.dso.clone()).collect();
    f.evidence.roles = vec!["addon".into()];
    f.evidence.causes = addon
        .iter()
        .flat_map(|t| t.causes.iter().map(|c| c.cause.clone()))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    Some(f)
}

pub(super) fn v8_gc_unmap(s: &Summary, p: &Process) -> Option<Finding> {
    let (n, wait, _) = p.writes_by("munmap", &["v8"]);
    // With blockers: the wait V8's unmaps made others wait (the write hold, and the read
    // hold a munmap keeps after downgrading).
    let charged: u64 = p
        .blocked_by_role
        .iter()
        .flatten()
        .filter(|r| r.holder_role == "v8" && (r.cause == "munmap" || r.cause == "downgrade"))
        .map(|r| r.wait_ns)
        .sum();
    let explained = wait + charged;
    if n < MIN_WRITES || ratio(explained, p.wait()) < MIN_SHARE_OF_WAIT {
        return None;
    }
    let (_, _, code) = stacks_of(p, "munmap", false);
    let mut f = finding(
        s,
        p,
        format!("V8's platform threads unmap freed memory: {n} munmap writes"),
        explained,
        &["v8", "worker", "main"],
    );
    f.evidence.facts.push(format!(
        "v8 threads' munmap writes waited {}{}",
        fmt_ns(wait),
        if charged > 0 {
            format!(
                "; {} of other threads' wait is charged to them",
                fmt_ns(charged)
            )
        } else {
            String::new()
        }
    ));
    f.evidence.roles = vec!["v8".into()];
    f.evidence.causes = vec!["munmap".into()];
    f.evidence.code = code;
    Some(f)
}

pub(super) fn profiler_presence(s: &Summary, p: &Process) -> Option<Finding> {
    let ours: Vec<&view::Thread> = p.threads.iter().filter(|t| t.is_profiler()).collect();
    if ours.is_empty() {
        return None;
    }
    let reads: u64 = ours.iter().map(|t| t.read.count).sum();
    let holds: u64 = ours.iter().map(|t| t.read.hold_ns.sum).sum();
    let charged: Option<u64> = p.blockers.as_ref().map(|b| {
        b.iter()
            .filter(|b| b.role == "profiler" || b.comm.starts_with("mmaplock-prof"))
            .map(|b| b.wait_ns)
            .sum()
    });
    // What it cost the others: charged to it, or at most its read holds.
    let explained = charged.unwrap_or(holds);
    if ratio(explained, p.wait()) < 0.01 && explained < 1_000_000 {
        return None;
    }
    let roles: Vec<&str> = p.own().map(|t| t.role.as_str()).collect();
    let mut f = finding(
        s,
        p,
        format!("the profiler's own reads of the process's memory map: {reads} read acquisitions"),
        explained,
        &roles,
    );
    f.evidence.facts.push(match charged {
        Some(c) => format!("{} of the process's wait is charged to its holds", fmt_ns(c)),
        None => format!(
            "its read holds lasted {} in all: an upper bound of what it made writers wait (--blockers measures it)",
            fmt_ns(holds)
        ),
    });
    f.evidence.roles = vec![ours[0].role.clone()];
    f.evidence.causes = vec!["read".into()];
    Some(f)
}
