//! The detectors of the patterns about who holds the lock (the table is in `patterns`): long
//! holds, an addon's threads, the profiler's own reads. Each reads one process of a summary
//! and returns its finding, or None.

use super::{
    Finding, ThreadRef,
    evidence::{finding, pct, ratio},
    patterns::*,
    view::{cause, own, thread_wait, wait},
};
use crate::{
    output::{
        report::{ProcessReport, Report, ThreadReport},
        text::fmt_ns,
    },
    registry::roles::Role,
    vocab::Mode,
};

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

pub(super) fn long_holds(s: &Report, p: &ProcessReport) -> Option<Finding> {
    // With blockers (always in contention mode): the thread whose holds were charged the
    // most, if one thread's writes.
    let (holder, cause_, charged, top) = match p.blockers.as_ref() {
        Some(b) => {
            let top = b
                .iter()
                .find(|b| WRITE_CAUSES.contains(&b.cause.as_ref()))?;
            if ratio(top.wait_ns, wait(p)) < LONG_HOLDS_SHARE {
                return None;
            }
            (top.tid, top.cause.to_string(), top.wait_ns, Some(top))
        }
        // Without: the thread holding the lock for write longest in one cause.
        None => {
            let (t, c) = own(p)
                .flat_map(|t| t.lock.causes.iter().map(move |c| (t, c)))
                .max_by_key(|(_, c)| c.write.hold().sum)?;
            let others: u64 = own(p).filter(|o| o.tid != t.tid).map(thread_wait).sum();
            let held = c.write.hold().sum;
            if ratio(held, wait(p)) < LONG_HOLDS_SHARE || others == 0 {
                return None;
            }
            (t.tid, c.cause.to_string(), held.min(others), None)
        }
    };
    // The holder as the report has it: among the threads, or (in contention mode, a holder
    // that never waited itself) only among the blockers.
    let t = p.threads.iter().find(|t| t.tid == holder);
    let (role, comm) = match (t, top) {
        (Some(t), _) => (t.role, t.comm.clone()),
        (None, Some(b)) => (b.role, b.comm.clone()),
        (None, None) => return None,
    };
    let holds = t
        .and_then(|t| cause(t, &cause_))
        .filter(|c| c.count > 0)
        .and_then(|c| Some((c.count, c.hold_ns.clone()?)));
    let roles: Vec<Role> = own(p).filter(|o| o.tid != holder).map(|o| o.role).collect();
    let (title, held_fact) = match (holds, top) {
        (Some((count, h)), _) => {
            if h.mean < LONG_HOLD_NS || count < MIN_LONG_HOLDS {
                return None;
            }
            (
                format!(
                    "thread {holder} ({comm}, {}) holds mmap_lock for write in {cause_} for {} at a time: the others wait behind it",
                    role.as_str(),
                    fmt_ns(h.mean as u64)
                ),
                format!(
                    "{count} {cause_} calls held the lock {} in all (up to {} each)",
                    fmt_ns(h.sum),
                    fmt_ns(h.max)
                ),
            )
        }
        // Contention mode measures no hold: the waits behind it tell how long it held.
        (None, Some(b)) if s.mode == Mode::Contention => {
            let per = b.wait_ns / b.waits.max(1);
            if (per as f64) < LONG_HOLD_NS || b.waits < MIN_LONG_HOLDS {
                return None;
            }
            (
                format!(
                    "thread {holder} ({comm}, {}) holds mmap_lock for write in {cause_}: each contended wait behind it lasted {} on average",
                    role.as_str(),
                    fmt_ns(per)
                ),
                "contention mode measures no hold time: a hold lasted at least as long as the waits behind it".to_string(),
            )
        }
        _ => return None,
    };
    // Its code, where the holders' stacks name it: the JavaScript function the writers of
    // this cause were running when the most wait began behind them.
    let code = (p.holder_functions.iter().flatten())
        .filter(|h| h.cause == cause_)
        .max_by_key(|h| h.wait_ns_sum);
    let title = match code {
        Some(h) => format!("{title} (running {})", h.function),
        None => title,
    };
    let mut f = finding(s, p, title, charged, &roles);
    f.evidence.facts.push(held_fact);
    if let Some(h) = code {
        f.evidence.facts.push(format!(
            "the writers holding it for {cause_} were running {} ({}) when {} of the sampled waits began behind them ({} of wait)",
            h.function,
            h.file,
            h.waits,
            fmt_ns(h.wait_ns_sum)
        ));
    }
    f.evidence.facts.push(match top {
        Some(b) => format!(
            "{} of the others' wait ({} waits) is charged to its holds",
            fmt_ns(charged),
            b.waits
        ),
        None => format!(
            "without --blockers, who waited behind it is not measured: up to {} of the others' wait",
            fmt_ns(charged)
        ),
    });
    f.evidence.threads.push(ThreadRef {
        tid: holder,
        role: role.as_str().to_string(),
        comm,
        cause: cause_.clone(),
    });
    f.evidence.causes = vec![cause_];
    f.evidence.roles = vec![role.as_str().to_string()];
    Some(f)
}

/// Without sampled stacks (`--stack-sample 0`, older builds): an addon's own threads' writes,
/// and the wait they made the others wait (charged to their holds with `--blockers` and in
/// contention mode; else the process's contended waits shared by the writes' hold time).
/// With stacks, the evidence chain names the addon's code and what its writes were for.
pub(super) fn addon_threads(s: &Report, p: &ProcessReport) -> Option<Finding> {
    if super::view::has_stacks(p) {
        return None;
    }
    let addon: Vec<&ThreadReport> = own(p).filter(|t| t.role == Role::Addon).collect();
    let writes: u64 = addon.iter().map(|t| t.lock.write.count).sum();
    if writes < MIN_WRITES {
        return None;
    }
    let file_name = |p: &str| {
        std::path::Path::new(p)
            .file_name()
            .map_or(p.to_string(), |n| n.to_string_lossy().into_owned())
    };
    let started: std::collections::BTreeSet<String> = addon
        .iter()
        .filter_map(|t| t.role_addon.as_deref().map(file_name))
        .collect();
    // The addon's file: from the sampled writes' code where an older build kept it, else
    // the addons its threads' start routines named.
    let files: Vec<String> = (p.dsos.iter().flatten())
        .filter(|d| d.dso.ends_with(".node"))
        .map(|d| d.dso.clone())
        .collect();
    let what = if !files.is_empty() {
        files
            .iter()
            .map(|f| file_name(f))
            .collect::<Vec<_>>()
            .join(", ")
    } else if started.is_empty() {
        "a native addon (sample stacks to name its .node file)".to_string()
    } else {
        started.into_iter().collect::<Vec<_>>().join(", ")
    };
    // What their holds made the others wait.
    let (made_wait, how) = match p.blocked_by_role.as_ref() {
        Some(rows) => (
            rows.iter()
                .filter(|r| r.holder_role == Role::Addon && r.cause != "read")
                .map(|r| r.wait_ns)
                .sum::<u64>(),
            "charged to their holds",
        ),
        None => {
            let held = |ts: &mut dyn Iterator<Item = &ThreadReport>| -> u64 {
                ts.map(|t| t.lock.write.hold_ns.as_ref().map_or(0, |h| h.sum))
                    .sum()
            };
            let all = held(&mut own(p));
            let theirs = held(&mut addon.iter().copied());
            let contended: u64 = own(p)
                .map(|t| {
                    super::chain::contended(&t.lock.write) + super::chain::contended(&t.lock.read)
                })
                .sum();
            (
                (contended as f64 * ratio(theirs, all)).round() as u64,
                "estimated: the process's waits of over 2 us shared by the writes' hold time",
            )
        }
    };
    let roles: Vec<Role> = own(p).map(|t| t.role).collect();
    let mut f = finding(
        s,
        p,
        format!(
            "{what}'s threads map and unmap memory: {writes} writes; the others waited {} behind them",
            fmt_ns(made_wait)
        ),
        made_wait,
        &roles,
    );
    if made_wait == 0 || ratio(made_wait, wait(p)) < MIN_SHARE_OF_WAIT {
        f.severity = super::Severity::Info;
    }
    f.evidence.facts.push(format!(
        "{} addon thread(s): {writes} writes; {} of the others' wait behind them ({how})",
        addon.len(),
        fmt_ns(made_wait)
    ));
    // Threads that a library behind the addon started (libvips's, behind sharp's addon).
    let mut libraries: std::collections::BTreeMap<(&str, &str), (u64, u64)> = Default::default();
    for t in &addon {
        if let (Some(lib), Some(a)) = (&t.role_library, &t.role_addon) {
            let e = libraries.entry((lib, a)).or_default();
            (e.0, e.1) = (e.0 + 1, e.1 + t.lock.write.count);
        }
    }
    for ((lib, a), (threads, writes)) in libraries {
        f.evidence.facts.push(format!(
            "{threads} of them started in {lib}, a library {} needs: {writes} writes",
            file_name(a)
        ));
    }
    f.evidence.code = files;
    f.evidence.roles = vec!["addon".into()];
    f.evidence.causes = addon
        .iter()
        .flat_map(|t| t.lock.causes.iter().map(|c| c.cause.to_string()))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    Some(f)
}

/// The profiler's own acquisitions of the process's lock (`profiler` in the summary, its
/// threads of the role `profiler`): what it may have made the process's threads wait. The
/// kernel never charges waits to its holds, so their length is the bound.
pub(super) fn profiler_presence(s: &Report, p: &ProcessReport) -> Option<Finding> {
    let ours = p.profiler.as_ref()?;
    let (reads, writes) = (ours.read.count, ours.write.count);
    // Contention mode measures no hold: what its reads made others wait is not known there
    // (a wait behind readers is charged to `readers`, whoever they are).
    let (Some(r), Some(w)) = (&ours.read.hold_ns, &ours.write.hold_ns) else {
        return None;
    };
    let holds = r.sum + w.sum;
    let material = super::listing::waited_materially(p);
    if holds < MIN_PROFILER_HOLD_NS && !(material && ratio(holds, wait(p)) >= MIN_PROFILER_SHARE) {
        return None;
    }
    let roles: Vec<Role> = own(p).map(|t| t.role).collect();
    let writes_text = if writes > 0 {
        format!(" and {writes} writes")
    } else {
        String::new()
    };
    let mut f = finding(
        s,
        p,
        format!(
            "the profiler's own reads of the process's memory map: {reads} read acquisitions{writes_text}"
        ),
        holds,
        &roles,
    );
    f.evidence.facts.push(format!(
        "its holds lasted {} in all: an upper bound of what it made the process's threads wait; {} of the lock's acquisitions were its own (not counted in the process's)",
        fmt_ns(holds),
        pct(ours.share)
    ));
    f.evidence.roles = vec![Role::Profiler.as_str().to_string()];
    f.evidence.causes = if writes > 0 {
        vec!["read".into(), "write".into()]
    } else {
        vec!["read".into()]
    };
    Some(f)
}
