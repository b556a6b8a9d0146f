//! What the detectors build findings from: a finding's cost, the roles involved, and the code
//! of the sampled stacks.

use std::collections::BTreeMap;

use super::{
    Evidence, Finding, Severity,
    view::{self, own, wait},
};
use crate::{
    output::report::{ProcessReport, Report},
    registry::roles::Role,
};

pub(super) fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

pub(super) fn pct(x: f64) -> String {
    crate::output::text::fmt_share(x)
}

/// A finding of `wait_ns` in `p`, costing the threads of `roles`.
pub(super) fn finding(
    s: &Report,
    p: &ProcessReport,
    title: String,
    wait_ns: u64,
    roles: &[Role],
) -> Finding {
    let time_share = view::alive_of(p, roles)
        .filter(|&a| a > 0)
        .map(|a| ratio(wait_ns, a));
    let n = own(p).filter(|t| roles.contains(&t.role)).count() as u64;
    let time_share_bound = match (time_share, s.duration_s) {
        (None, Some(d)) if d > 0.0 && n > 0 => Some(wait_ns as f64 / (d * 1e9 * n as f64)),
        _ => None,
    };
    let severity = Severity::of_share(time_share.or(time_share_bound).unwrap_or(0.0));
    Finding {
        id: String::new(),
        pid: p.pid,
        comm: p.comm.clone(),
        severity,
        title,
        writes: None,
        wait_ns,
        share_of_wait: (ratio(wait_ns, wait(p)) * 1e4).round() / 1e4,
        time_share: time_share.map(|x| (x * 1e6).round() / 1e6),
        time_share_bound: time_share_bound.map(|x| (x * 1e6).round() / 1e6),
        evidence: Evidence::default(),
        impact: None,
        advice: Vec::new(),
        measured: Vec::new(),
        measured_on: None,
        source: String::new(),
        window: None,
    }
}

/// The roles involved (those with a tenth of the count or more), most first, and every
/// role's count as text.
pub(super) fn roles_text(per_role: &BTreeMap<Role, u64>) -> (Vec<String>, String) {
    let mut v: Vec<(&Role, &u64)> = per_role.iter().filter(|r| *r.1 > 0).collect();
    v.sort_by_key(|r| std::cmp::Reverse(*r.1));
    let total: u64 = v.iter().map(|r| *r.1).sum();
    (
        v.iter()
            .filter(|r| *r.1 * 10 >= total)
            .map(|r| r.0.as_str().to_string())
            .collect(),
        v.iter()
            .map(|(r, n)| format!("{} {n}", r.as_str()))
            .collect::<Vec<_>>()
            .join(", "),
    )
}

/// A function name without its template arguments and parameters, and its file:
/// `v8::internal::Heap::AllocateRaw (node)`.
pub(super) fn short(frame: &str) -> String {
    let name = view::function(frame);
    let mut f = String::new();
    let mut depth = 0usize;
    for (i, c) in name.char_indices() {
        match c {
            '<' => depth += 1,
            '>' => depth = depth.saturating_sub(1),
            '(' if depth == 0
                && !f.is_empty()
                && !name[i..].starts_with("(anonymous namespace)") =>
            {
                break;
            }
            c if depth == 0 => f.push(c),
            _ => {}
        }
    }
    let file = view::file(frame);
    if file.is_empty() {
        f
    } else {
        format!("{f} ({file})")
    }
}

const MALLOC: &[&str] = &[
    "malloc",
    "calloc",
    "realloc",
    "free",
    "__libc_free",
    "__libc_malloc",
    "__libc_calloc",
    "__libc_realloc",
    "posix_memalign",
    "aligned_alloc",
    "memalign",
    "cfree",
];

/// Sampled stacks whose innermost frame is `syscall`: how many, how many went through
/// malloc or free, and the code that called the C runtime (in those through malloc only,
/// when `via_malloc`), most sampled first.
pub(super) fn stacks_of(
    p: &ProcessReport,
    syscall: &str,
    via_malloc: bool,
) -> (u64, u64, Vec<String>) {
    let (mut n, mut malloc) = (0, 0);
    let mut code: BTreeMap<String, u64> = BTreeMap::new();
    for (frames, count) in view::sampled_stacks(p) {
        let Some(inner) = frames.first() else {
            continue;
        };
        if !view::function(inner)
            .trim_start_matches('_')
            .starts_with(syscall)
        {
            continue;
        }
        n += count;
        let runtime: Vec<&String> = frames
            .iter()
            .take_while(|f| view::in_c_runtime(f))
            .collect();
        let through = runtime.iter().any(|f| MALLOC.contains(&view::function(f)));
        if through {
            malloc += count;
        }
        if let Some(caller) = frames.get(runtime.len()).filter(|_| through || !via_malloc) {
            *code.entry(short(caller)).or_default() += count;
        }
    }
    let mut code: Vec<(String, u64)> = code.into_iter().collect();
    code.sort_by_key(|c| std::cmp::Reverse(c.1));
    (n, malloc, code.into_iter().take(3).map(|c| c.0).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_shortened_to_their_function_and_file() {
        assert_eq!(
            short(
                "v8::internal::Heap::AllocateExternalBackingStore(std::function<void* (unsigned long)> const&, unsigned long) (node)"
            ),
            "v8::internal::Heap::AllocateExternalBackingStore (node)"
        );
        assert_eq!(
            short(
                "heap::base::Worklist<std::pair<v8::internal::HeapObject, int>, 64ul>::Local::Publish() (node)"
            ),
            "heap::base::Worklist::Local::Publish (node)"
        );
        assert_eq!(
            short("node::(anonymous namespace)::PlatformWorkerThread(void*) (node)"),
            "node::(anonymous namespace)::PlatformWorkerThread (node)"
        );
        assert_eq!(short("malloc (libc.so.6)"), "malloc (libc.so.6)");
        assert_eq!(short("[jit]"), "[jit]");
    }
}
