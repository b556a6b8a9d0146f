//! The findings of the evidence chain (`chain`): per mechanism its stacks show, the code
//! whose writes made others wait, how, and whom. The waiters are its victims and their wait
//! its cost; what its writes waited themselves for readers is counted with it (they need
//! the lock alone). A process whose threads did not wait materially gets, of each
//! mechanism, only what is there: how many writes it made, and that they made no one wait.

use std::collections::BTreeMap;

use super::{
    Finding, Severity, VictimRef,
    chain::{Chain, Link, chain},
    evidence::finding,
    impact::{CpuFigures, ImpactKind},
    listing::waited_materially,
    mechanism::Mechanism,
    patterns::{MIN_SAMPLED_STACKS, MIN_SHARE_OF_WAIT, MIN_WRITES},
};
use crate::{
    output::{
        report::{ProcessReport, Report},
        text::fmt_ns,
    },
    registry::roles::Role,
    vocab::Mode,
};

/// `libuv`, `libuv and addon`, `main, worker and libuv`.
fn and_list(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

/// Roles by a count, most first, those with a tenth of the total or more.
fn main_roles(by: &BTreeMap<Role, f64>) -> Vec<Role> {
    let total: f64 = by.values().sum();
    let mut v: Vec<(Role, f64)> = by
        .iter()
        .filter(|(_, n)| **n > 0.0 && **n * 10.0 >= total)
        .map(|(r, n)| (*r, *n))
        .collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1));
    v.into_iter().map(|(r, _)| r).collect()
}

fn names(roles: &[Role]) -> Vec<String> {
    roles.iter().map(|r| r.as_str().to_string()).collect()
}

/// What a mechanism's writes do, after "N writes".
fn what_writes_do(m: Mechanism) -> &'static str {
    match m {
        Mechanism::Threads => "map, guard and unmap thread stacks",
        Mechanism::LargeAlloc => "map and unmap blocks above malloc's mmap threshold",
        Mechanism::Arena => "grow and shrink glibc's malloc arenas",
        Mechanism::V8Heap => "map, protect and unmap V8's heap and code pages",
        Mechanism::Wasm => "grow WebAssembly memory",
        Mechanism::FileMap => "map shared objects from their files",
        Mechanism::Own | Mechanism::Unnamed => "map and unmap memory",
    }
}

/// The finding's subject: who does what, where.
fn subject(m: Mechanism, code: &str, roles: &str) -> String {
    match m {
        Mechanism::Threads => format!("{code} starts and joins threads ({roles} threads)"),
        Mechanism::LargeAlloc => {
            format!("{code} allocates and frees large blocks ({roles} threads)")
        }
        Mechanism::Arena => {
            format!("glibc's malloc arenas grow and shrink under {code} ({roles} threads)")
        }
        Mechanism::V8Heap => format!("V8's heap and code space change ({code}, {roles} threads)"),
        Mechanism::Wasm => format!("WebAssembly memory grows ({code}, {roles} threads)"),
        Mechanism::FileMap => {
            format!("shared objects are loaded from their files ({code}, {roles} threads)")
        }
        Mechanism::Own | Mechanism::Unnamed => {
            format!("{code} maps and unmaps memory itself ({roles} threads)")
        }
    }
}

/// What to change, most effective first, for the code named.
pub(super) fn advice(m: Mechanism, code: &str, in_addon: bool) -> Vec<String> {
    let tell = if in_addon {
        " (and tell the addon's maintainers)"
    } else {
        ""
    };
    match m {
        Mechanism::Threads => vec![
            format!(
                "Reuse threads: have {code} keep a pool of threads started once{tell}, rather than start and join threads per call: each new thread's stack is an mmap and an mprotect of its guard page, each stack glibc does not keep a munmap"
            ),
            "Lower its parallelism: fewer threads per call, or fewer calls at once (UV_THREADPOOL_SIZE, the addon's own option): fewer stacks alive at once".to_string(),
            "Keep freed stacks for reuse: GLIBC_TUNABLES=glibc.pthread.stack_cache_size=N in the process's environment (glibc 2.34+; bytes, 40 MiB by default), N at least the threads alive at once times their stack size (8 MiB by default): e.g. 268435456 keeps 32 stacks".to_string(),
        ],
        Mechanism::LargeAlloc => vec![
            format!(
                "Reuse large blocks: have {code} keep its buffer (one per thread, or a pool){tell} rather than allocate and free it per call: every block at or above malloc's mmap threshold is an mmap, and its free a munmap that holds the lock while the kernel frees its pages"
            ),
            "Raise the threshold so such blocks come from malloc's heap: GLIBC_TUNABLES=glibc.malloc.mmap_threshold=N (or MALLOC_MMAP_THRESHOLD_=N), N above the block size (at most 32 MiB on 64-bit), or allocate them at start and keep them".to_string(),
            "From JavaScript: reuse large Buffers (read into one with fs.readSync) or take them from a pool of your own".to_string(),
        ],
        Mechanism::Arena => vec![
            "Cap glibc's malloc arenas: MALLOC_ARENA_MAX=2 (or GLIBC_TUNABLES=glibc.malloc.arena_max=2) in the process's environment: threads then share a few arenas, which are grown once and seldom shrink".to_string(),
            "Or preload jemalloc (Debian's libjemalloc2: LD_PRELOAD=/usr/lib/$(uname -m)-linux-gnu/libjemalloc.so.2), whose arenas take memory in large extents and keep it".to_string(),
            format!("Reuse buffers in {code} rather than allocate and free one per operation{tell}"),
        ],
        Mechanism::V8Heap => vec![
            "Allocate less short-lived garbage: V8's young generation maps, protects and unmaps pages as it grows and shrinks; a larger young generation (node --max-semi-space-size=MiB) makes it resize less often".to_string(),
            "Keep code stable: V8 changes its code pages' protection (mprotect) as it compiles and optimizes; code that is warmed up at start compiles less under load".to_string(),
        ],
        Mechanism::Wasm => vec![
            "Give WebAssembly memory its size once: new WebAssembly.Memory({ initial }) at the size it needs, rather than memory.grow() page by page".to_string(),
        ],
        Mechanism::FileMap => vec![
            "Load addons and libraries once, at start (require them at the top of the module), not per request".to_string(),
        ],
        Mechanism::Own | Mechanism::Unnamed => vec![
            format!(
                "Have {code} reuse its mappings or allocate larger blocks at once{tell}"
            ),
            "If it cannot change, run it in a process of its own (child_process): its writes then take that process's lock".to_string(),
        ],
    }
}

/// The finding of mechanism `m` in `p`.
pub(super) fn of_mechanism(s: &Report, p: &ProcessReport, m: Mechanism) -> Option<Finding> {
    let c = chain(p);
    if !c.sampled {
        return None;
    }
    let link = c.links.get(&m)?;
    let writes = link.writes.round() as u64;
    // In contention mode the writers' own writes are counted only when they waited: their
    // stacks as holders are the evidence.
    let enough_writes = writes >= MIN_WRITES || s.mode == Mode::Contention;
    if link.stacks < MIN_SAMPLED_STACKS || !enough_writes {
        return None;
    }
    let cost = link.cost();
    let waited = waited_materially(p) && c.wait_ns > 0.0 && cost / c.wait_ns >= MIN_SHARE_OF_WAIT;
    if waited_materially(p) && !waited {
        return None;
    }
    Some(build(s, p, m, link, &c, waited))
}

fn build(
    s: &Report,
    p: &ProcessReport,
    m: Mechanism,
    link: &Link,
    c: &Chain,
    waited: bool,
) -> Finding {
    let writers = main_roles(&link.writes_by_role);
    let writers = if writers.is_empty() {
        vec![Role::Other]
    } else {
        writers
    };
    let code = link.top(&link.code, 3);
    let first = code.first().cloned().unwrap_or_else(|| "its code".into());
    let in_addon = code.iter().any(|c| c.contains(".node)"));
    let victims_by: BTreeMap<Role, f64> = link.victims.iter().map(|(r, v)| (*r, v.0)).collect();
    let mut victims = main_roles(&victims_by);
    let mut involved = victims.clone();
    if link.behind_readers > 0.0 {
        involved.extend(writers.iter().copied());
    }
    involved.sort();
    involved.dedup();
    let cost = link.cost().round() as u64;
    let writes = link.writes.round() as u64;
    let count = match s.mode {
        Mode::Full => format!("{writes} writes"),
        Mode::Contention => format!("{writes} contended writes"),
    };
    let roles = and_list(&names(&writers));
    let who = subject(m, &first, &roles);
    let title = if waited {
        victims.sort_by(|a, b| victims_by[b].total_cmp(&victims_by[a]));
        let behind = match (victims.is_empty(), link.behind_readers > 0.0) {
            (true, _) => format!("its writes waited {} for readers", fmt_ns(cost)),
            (false, _) => format!(
                "{} threads waited {} behind them",
                and_list(&names(&victims)),
                fmt_ns(cost)
            ),
        };
        format!("{who}: {count} {}; {behind}", what_writes_do(m))
    } else if cost >= 1 && !victims.is_empty() {
        // Waits too small to matter (waited_materially): said as what they were.
        format!(
            "{who}: {count} {}; {} threads waited only {} behind them",
            what_writes_do(m),
            and_list(&names(&victims)),
            fmt_ns(cost)
        )
    } else {
        format!(
            "{who}: {count} {}; no one waited for them",
            what_writes_do(m)
        )
    };
    let mut f = finding(s, p, title, cost, &involved);
    f.writes = Some(writes);
    if !waited {
        f.severity = Severity::Info;
    }
    // The writers.
    let mut causes: Vec<(&String, &f64)> = link.writes_by_cause.iter().collect();
    causes.sort_by(|a, b| b.1.total_cmp(a.1));
    let by_cause: Vec<String> = causes
        .iter()
        .map(|(c, n)| format!("{c} {}", n.round()))
        .collect();
    let by_role: Vec<String> = {
        let mut v: Vec<(&Role, &f64)> = link.writes_by_role.iter().collect();
        v.sort_by(|a, b| b.1.total_cmp(a.1));
        v.iter()
            .map(|(r, n)| format!("{} {}", r.as_str(), n.round()))
            .collect()
    };
    f.evidence.facts.push(format!(
        "{count} ({}) by {} threads: {} sampled stacks show {}",
        by_cause.join(", "),
        by_role.join(", "),
        link.stacks,
        m.what()
    ));
    if link.hold_ns > 0.0 {
        f.evidence.facts.push(format!(
            "their holds lasted {} in all",
            fmt_ns(link.hold_ns.round() as u64)
        ));
    }
    // The victims.
    let mut v: Vec<(&Role, &(f64, f64))> = link.victims.iter().filter(|v| v.1.0 >= 1.0).collect();
    v.sort_by(|a, b| b.1.0.total_cmp(&a.1.0));
    if !v.is_empty() {
        let parts: Vec<String> = v
            .iter()
            .map(|(r, (all, writes))| {
                let reads = all - writes;
                let kind = match (reads >= 1.0, *writes >= 1.0) {
                    (true, true) => format!(
                        " ({} reading, {} writing)",
                        fmt_ns(reads.round() as u64),
                        fmt_ns(writes.round() as u64)
                    ),
                    (true, false) => " (reading: page faults)".into(),
                    _ => " (writing)".into(),
                };
                format!(
                    "{} threads {}{kind}",
                    r.as_str(),
                    fmt_ns(all.round() as u64)
                )
            })
            .collect();
        f.evidence.facts.push(format!(
            "who waited behind them: {}; {}",
            parts.join(", "),
            if c.charged {
                "charged to these writes' holds (who made whom wait)"
            } else {
                "estimated: without --blockers who waited behind whom is not measured, so the process's waits of over 2 us are shared by the writes' hold time"
            }
        ));
    }
    let long_unmaps = link.behind_unmaps * 2.0 >= link.cost();
    if link.behind_unmaps >= 1.0 {
        f.evidence.facts.push(format!(
            "{} of that wait was behind their munmaps' read holds after downgrading: the kernel freeing the unmapped pages (downgrade holds up to {})",
            fmt_ns(link.behind_unmaps.round() as u64),
            p.lock.downgrade.hold_ns.as_ref().map_or("-".into(), |h| fmt_ns(h.max))
        ));
    }
    if link.behind_readers >= 1.0 {
        f.evidence.facts.push(format!(
            "their own writes waited {} for read holds (page faults) to end; readers queued behind them meanwhile",
            fmt_ns(link.behind_readers.round() as u64)
        ));
    }
    if let Some(u) = c.links.get(&Mechanism::Unnamed).filter(|u| u.stacks > 0) {
        f.evidence.facts.push(format!(
            "{} more sampled stacks went through C runtime code that has no names here: install its debug symbols (Debian: libc6-dbg) to tell what they were for",
            u.stacks
        ));
    }
    f.evidence.victims = v
        .iter()
        .map(|(r, (all, writes))| VictimRef {
            role: r.as_str().to_string(),
            wait_ns: all.round() as u64,
            write_wait_ns: writes.round() as u64,
        })
        .collect();
    f.evidence.roles = names(&writers);
    f.evidence.causes = causes.iter().map(|(c, _)| (*c).clone()).collect();
    f.evidence.code = code.clone();
    f.evidence.js_functions = link
        .top(&link.js, 3)
        .into_iter()
        .map(|j| format!("{j} ({} of {} sampled stacks)", link.js[&j], link.stacks))
        .collect();
    f.advice = advice(m, &first, in_addon);
    if long_unmaps {
        // Most of the wait was the unmaps' long holds: giving the pages back in pieces first
        // shortens them whatever else changes.
        f.advice.insert(
            1.min(f.advice.len()),
            format!(
                "Where a large block must go, give its pages back in pieces first: madvise(MADV_DONTNEED) 2 MiB at a time before free (in {first}), so that its munmap, which holds the lock while the kernel frees every page, finds it empty; each piece is a short hold"
            ),
        );
    }
    // Throughput or latency, and the severity that follows.
    let held = (s.mode == Mode::Full && link.hold_ns > 0.0).then(|| link.hold_ns.round() as u64);
    if cost > 0
        && let Some(i) = CpuFigures::of(s, p).and_then(|c| c.impact(cost as f64, held))
    {
        if i.kind == ImpactKind::Latency {
            f.severity = f.severity.min(Severity::Low);
        }
        f.impact = Some(i);
    }
    f
}
