//! The detectors of the patterns about how memory is asked for, and whether the lock matters
//! at all (the table is in `patterns`; those about who holds it are in `holders`). Each reads
//! one process of a summary and returns its finding, or None.

use std::collections::BTreeMap;

use super::{
    Finding, Severity,
    evidence::{finding, js_functions, pct, ratio, roles_text, stacks_of},
    patterns::*,
    view::{wait, writes_by},
};
use crate::{
    output::{
        report::{ProcessReport, Report},
        text::{fmt_ns, fmt_per_cpu},
    },
    registry::roles::Role,
};

pub(super) fn not_a_bottleneck(s: &Report, p: &ProcessReport) -> Option<Finding> {
    let share = p.time_share.as_ref()?;
    let cpu_small = share.cpu.is_none_or(|c| c < NOT_A_BOTTLENECK_SHARE);
    let roles_small = p.time_share_by_role.iter().flatten().all(|r| {
        matches!(r.role, Role::Foreign | Role::Profiler)
            || r.share.wall < NOT_A_BOTTLENECK_ROLE_SHARE
    });
    if share.wall >= NOT_A_BOTTLENECK_SHARE || !cpu_small || !roles_small {
        return None;
    }
    let cpu = share.cpu.map_or(String::new(), |c| {
        format!(" ({} of wait per CPU-second)", fmt_per_cpu(c))
    });
    let mut f = Finding {
        severity: Severity::Info,
        time_share: Some(share.wall),
        ..finding(
            s,
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

pub(super) fn arena_growth(s: &Report, p: &ProcessReport) -> Option<Finding> {
    let (n, w, per_role) = writes_by(p, "mprotect", NON_MAIN);
    if n < MIN_WRITES || ratio(w, wait(p)) < MIN_SHARE_OF_WAIT {
        return None;
    }
    let (sampled, malloc, code) = stacks_of(p, "mprotect", true);
    // Sampled stacks that are mostly not malloc's: mprotect for another reason (JIT code).
    if sampled >= 10 && malloc * 2 < sampled {
        return None;
    }
    let (roles, by_role) = roles_text(&per_role);
    let involved = involved(&per_role);
    let mut f = finding(
        s,
        p,
        format!(
            "glibc's malloc arenas of the {} threads grow and shrink: {n} mprotect writes",
            roles.first().map_or("non-main", String::as_str)
        ),
        w,
        &involved,
    );
    f.evidence.roles = roles;
    f.evidence.causes = vec!["mprotect".into()];
    f.evidence.code = code;
    f.evidence.js_functions = js_functions(p);
    f.evidence.facts.push(format!(
        "mprotect writes by thread role: {by_role}; they waited {} ({} of the process's wait)",
        fmt_ns(w),
        pct(ratio(w, wait(p)))
    ));
    if sampled > 0 {
        f.evidence.facts.push(format!(
            "{malloc} of {sampled} sampled mprotect stacks are malloc's (a thread's arena growing)"
        ));
    }
    Some(f)
}

pub(super) fn mmap_threshold(s: &Report, p: &ProcessReport) -> Option<Finding> {
    let (mmaps, w1, r1) = writes_by(p, "mmap", JS);
    let (munmaps, w2, r2) = writes_by(p, "munmap", JS);
    let (n, w) = (mmaps + munmaps, w1 + w2);
    if n < MIN_WRITES || ratio(w, wait(p)) < MIN_SHARE_OF_WAIT {
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
    let involved = involved(&per_role);
    let mut f = finding(
        s,
        p,
        format!(
            "large allocations map and unmap memory of their own: {mmaps} mmap and {munmaps} munmap writes"
        ),
        w,
        &involved,
    );
    f.evidence.roles = roles;
    f.evidence.causes = vec!["mmap".into(), "munmap".into()];
    f.evidence.code = code;
    f.evidence.js_functions = js_functions(p);
    f.evidence.facts.push(format!(
        "mmap and munmap writes by thread role: {by_role}; they waited {}",
        fmt_ns(w)
    ));
    if sampled > 0 {
        f.evidence.facts.push(format!(
            "{malloc} of {sampled} sampled mmap stacks are malloc's (an allocation above glibc's mmap threshold)"
        ));
    }
    Some(f)
}

pub(super) fn fault_reads(s: &Report, p: &ProcessReport) -> Option<Finding> {
    let roles = p.blocked_by_role.as_ref()?;
    let mut waiters: BTreeMap<Role, u64> = BTreeMap::new();
    let mut holders: BTreeMap<Role, u64> = BTreeMap::new();
    let mut w = 0;
    for r in roles
        .iter()
        .filter(|r| r.cause == "read" && r.write_wait_ns > 0)
    {
        w += r.write_wait_ns;
        *waiters.entry(r.waiter_role).or_default() += r.write_wait_ns;
        *holders.entry(r.holder_role).or_default() += r.write_wait_ns;
    }
    if ratio(w, p.lock.write.wait_ns.sum) < 0.25 || ratio(w, wait(p)) < MIN_SHARE_OF_WAIT {
        return None;
    }
    let (waiter_roles, _) = roles_text(&waiters);
    let (holder_roles, _) = roles_text(&holders);
    let mut f = finding(
        s,
        p,
        format!(
            "writers wait behind page faults' read holds: {} of the write wait",
            pct(ratio(w, p.lock.write.wait_ns.sum))
        ),
        w,
        &involved(&waiters),
    );
    f.evidence.facts.push(format!(
        "{} of the writers' {} wait was charged to read holds (by {} threads), {} read acquisitions in all",
        fmt_ns(w),
        fmt_ns(p.lock.write.wait_ns.sum),
        holder_roles.join(", "),
        p.lock.read.count
    ));
    f.evidence.roles = waiter_roles;
    f.evidence.causes = vec!["read".into()];
    f.evidence.js_functions = js_functions(p);
    Some(f)
}

pub(super) fn v8_gc_unmap(s: &Report, p: &ProcessReport) -> Option<Finding> {
    let (n, w, _) = writes_by(p, "munmap", &[Role::V8]);
    // With blockers: the wait V8's unmaps made others wait (the write hold, and the read
    // hold a munmap keeps after downgrading).
    let charged: u64 = p
        .blocked_by_role
        .iter()
        .flatten()
        .filter(|r| r.holder_role == Role::V8 && (r.cause == "munmap" || r.cause == "downgrade"))
        .map(|r| r.wait_ns)
        .sum();
    let explained = w + charged;
    if n < MIN_WRITES || ratio(explained, wait(p)) < MIN_SHARE_OF_WAIT {
        return None;
    }
    let (_, _, code) = stacks_of(p, "munmap", false);
    let mut f = finding(
        s,
        p,
        format!("V8's platform threads unmap freed memory: {n} munmap writes"),
        explained,
        &[Role::V8, Role::Worker, Role::Main],
    );
    f.evidence.facts.push(format!(
        "v8 threads' munmap writes waited {}{}",
        fmt_ns(w),
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

/// The roles of a count per role, as a finding costs them.
fn involved(per_role: &BTreeMap<Role, u64>) -> Vec<Role> {
    let total: u64 = per_role.values().sum();
    per_role
        .iter()
        .filter(|r| *r.1 > 0 && *r.1 * 10 >= total)
        .map(|r| *r.0)
        .collect()
}
