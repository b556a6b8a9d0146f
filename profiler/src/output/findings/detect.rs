//! The detectors of the patterns about how memory is asked for, and whether the lock matters
//! at all (the table is in `patterns`; those about who holds it are in `holders`). Each reads
//! one process of a summary and returns its finding, or None.

use std::collections::BTreeMap;

use super::{
    Finding, Severity,
    evidence::{finding, pct, ratio, roles_text, stacks_of},
    listing::small_share,
    mechanism::Mechanism,
    patterns::*,
    view::{has_stacks, wait, writes_by},
    writers::advice,
};
use crate::{
    output::{
        report::{ProcessReport, Report},
        text::{fmt_ns, fmt_per_cpu},
    },
    registry::roles::Role,
    vocab::Mode,
};

pub(super) fn not_a_bottleneck(s: &Report, p: &ProcessReport) -> Option<Finding> {
    // Its share of the threads' time rests on enough of its writes: a fork child's two
    // writes before its exec say nothing. In contention mode, which counts only the waits,
    // on enough of its threads' time watched: no wait at all is a result there.
    let share = p.time_share.as_ref()?;
    let enough = match s.mode {
        Mode::Full => p.lock.write.count >= MIN_WRITES,
        Mode::Contention => share.alive_ns >= MIN_WATCHED_NS,
    };
    if !enough || small_share(p) != Some(true) {
        return None;
    }
    if s.mode == Mode::Contention {
        return Some(watched(s, p, share));
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

/// Contention mode's verdict: what it watched (threads, their time, for how long) and how
/// few of their acquisitions went to the lock's slow path, none at all being a result.
fn watched(s: &Report, p: &ProcessReport, share: &crate::output::report::TimeShare) -> Finding {
    let waits = p.lock.write.count + p.lock.read.count;
    let threads = share.threads.unwrap_or(0);
    let what = if waits == 0 {
        "no contended wait".to_string()
    } else {
        format!(
            "{} of their time in {waits} contended wait{}",
            pct(share.wall),
            if waits == 1 { "" } else { "s" }
        )
    };
    let over = s
        .duration_s
        .map_or(String::new(), |d| format!(" in {d:.1} s"));
    let mut f = Finding {
        severity: Severity::Info,
        time_share: Some(share.wall),
        ..finding(
            s,
            p,
            format!(
                "mmap_lock is not this process's bottleneck: its {threads} thread{} watched{over}, {what}",
                if threads == 1 { "" } else { "s" }
            ),
            share.wait_ns,
            &[],
        )
    };
    f.evidence.facts.push(format!(
        "watched {threads} thread{} for {} of their time alive{}{over}: {waits} contended wait{} ({} writes, {} reads), {} of wait",
        if threads == 1 { "" } else { "s" },
        fmt_ns(share.alive_ns),
        share
            .cpu_ns
            .map_or(String::new(), |c| format!(" ({} on CPU)", fmt_ns(c))),
        if waits == 1 { "" } else { "s" },
        p.lock.write.count,
        p.lock.read.count,
        fmt_ns(share.wait_ns)
    ));
    f
}

pub(super) fn arena_growth(s: &Report, p: &ProcessReport) -> Option<Finding> {
    let (n, w, per_role) = writes_by(p, "mprotect", NON_MAIN);
    if n < MIN_WRITES || ratio(w, wait(p)) < MIN_SHARE_OF_WAIT {
        return None;
    }
    let (sampled, malloc, code) = stacks_of(p, "mprotect", true);
    // Sampled stacks that are mostly not malloc's: mprotect for another reason (JIT code).
    let stacks = stack_evidence(s, sampled, malloc, "mprotect", "a thread's arena growing")?;
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
    f.evidence.facts.push(format!(
        "mprotect writes by thread role: {by_role}; they waited {} ({} of the process's wait)",
        fmt_ns(w),
        pct(ratio(w, wait(p)))
    ));
    f.evidence.facts.push(stacks);
    f.evidence.code = if sampled >= MIN_SAMPLED_STACKS {
        code
    } else {
        Vec::new()
    };
    f.advice = advice(Mechanism::Arena, "the threads' code", false);
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
    let stacks = stack_evidence(
        s,
        sampled,
        malloc,
        "mmap",
        "an allocation above glibc's mmap threshold",
    )?;
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
    f.evidence.facts.push(format!(
        "mmap and munmap writes by thread role: {by_role}; they waited {}",
        fmt_ns(w)
    ));
    f.evidence.facts.push(stacks);
    f.evidence.code = if sampled >= MIN_SAMPLED_STACKS {
        code
    } else {
        Vec::new()
    };
    f.advice = advice(Mechanism::LargeAlloc, "the JavaScript", false);
    Some(f)
}

pub(super) fn fault_reads(s: &Report, p: &ProcessReport) -> Option<Finding> {
    // With stacks, the writers' wait for readers is their own mechanism's (the evidence
    // chain's findings count it): they need the lock alone.
    if has_stacks(p) {
        return None;
    }
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
    if p.lock.write.count < MIN_WRITES
        || ratio(w, p.lock.write.wait_ns.sum) < FAULT_READS_SHARE
        || ratio(w, wait(p)) < MIN_SHARE_OF_WAIT
    {
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
    Some(f)
}

pub(super) fn v8_gc_unmap(s: &Report, p: &ProcessReport) -> Option<Finding> {
    // With stacks, the evidence chain tells what V8's threads unmap (a large block freed,
    // its heap's pages).
    if has_stacks(p) {
        return None;
    }
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

/// What the sampled stacks of `syscall` say of a pattern about malloc (`sampled` of them,
/// `malloc` through it), as a fact; None when they say it is not malloc's. Fewer than
/// [`MIN_SAMPLED_STACKS`] tell nothing either way: the pattern then rests on its writes
/// alone where no stack was sampled (`--stack-sample 0`, older builds), and is not reported
/// where stacks were sampled but too few of these.
fn stack_evidence(
    s: &Report,
    sampled: u64,
    malloc: u64,
    syscall: &str,
    why: &str,
) -> Option<String> {
    if sampled >= MIN_SAMPLED_STACKS {
        return (malloc * 2 >= sampled).then(|| {
            format!("{malloc} of {sampled} sampled {syscall} stacks are malloc's ({why})")
        });
    }
    if s.stack_sample.is_some_and(|n| n > 0) {
        return None;
    }
    Some(if sampled == 0 {
        format!(
            "no {syscall} stacks sampled: whose code asked for the memory is not known (stack sampling, on by default, tells)"
        )
    } else {
        format!(
            "only {sampled} sampled {syscall} stacks: too few to tell whose code asked for the memory ({MIN_SAMPLED_STACKS} needed)"
        )
    })
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
