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
        report::{DsoReport, ProcessReport, Report, ThreadReport},
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

pub(super) fn addon_threads(s: &Report, p: &ProcessReport) -> Option<Finding> {
    let addon: Vec<&ThreadReport> = own(p).filter(|t| t.role == Role::Addon).collect();
    let (writes, w): (u64, u64) = addon.iter().fold((0, 0), |a, t| {
        (a.0 + t.lock.write.count, a.1 + thread_wait(t))
    });
    let sampled: u64 = p.dsos.iter().flatten().map(|d| d.write.count).sum();
    let files: Vec<&DsoReport> = p
        .dsos
        .iter()
        .flatten()
        .filter(|d| d.dso.ends_with(".node"))
        .collect();
    let file_writes: u64 = files.iter().map(|d| d.write.count).sum();
    if writes < MIN_WRITES
        && (file_writes < MIN_WRITES || ratio(file_writes, sampled) < ADDON_SAMPLED_SHARE)
    {
        return None;
    }
    // Sampled writes' wait, scaled to all writes by the sampling rate.
    let scale = u64::from(s.stack_sample.unwrap_or(1).max(1));
    let file_wait: u64 = files.iter().map(|d| d.write.wait_ns.sum * scale).sum();
    let names: Vec<String> = files
        .iter()
        .map(|d| {
            std::path::Path::new(&d.dso)
                .file_name()
                .map_or(d.dso.clone(), |n| n.to_string_lossy().into_owned())
        })
        .collect();
    // Without sampled stacks, the addons its threads' start routines named.
    let file_name = |p: &str| {
        std::path::Path::new(p)
            .file_name()
            .map_or(p.to_string(), |n| n.to_string_lossy().into_owned())
    };
    let started: std::collections::BTreeSet<String> = addon
        .iter()
        .filter_map(|t| t.role_addon.as_deref().map(file_name))
        .collect();
    let what = if !names.is_empty() {
        names.join(", ")
    } else if !started.is_empty() {
        started.into_iter().collect::<Vec<_>>().join(", ")
    } else {
        "a native addon (sample stacks to name its .node file)".to_string()
    };
    let explained = w.max(file_wait);
    let mut roles = vec![Role::Addon];
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
        fmt_ns(w)
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
