//! What the detectors ask of a summary, over the report's own types: waits, the process's own
//! threads, writes by cause and role, time alive by role, sampled stacks. Reports of older
//! builds lack the later fields (no `time_share`, no stacks, no blockers): each question
//! then has no answer (None, or nothing), never a wrong one.

use std::collections::BTreeMap;

use crate::{
    output::report::{ProcessReport, Stats, ThreadReport},
    registry::roles::Role,
};

/// All a thread's wait (write and read) on this lock, ns.
pub fn thread_wait(t: &ThreadReport) -> u64 {
    t.lock.write.wait_ns.sum + t.lock.read.wait_ns.sum
}

/// All the wait (write and read) on this process's lock, ns (the profiler's is apart).
pub fn wait(p: &ProcessReport) -> u64 {
    p.lock.write.wait_ns.sum + p.lock.read.wait_ns.sum
}

/// A thread's writes of one cause.
pub fn cause<'a>(t: &'a ThreadReport, cause: &str) -> Option<&'a Stats> {
    t.lock
        .causes
        .iter()
        .find(|c| c.cause == cause)
        .map(|c| &c.write)
}

/// The process's own threads: not other processes' (`foreign`), not the profiler's. A
/// group of threads the report did not list one by one is one row (`thread_rows` says how
/// many threads each stands for).
pub fn own(p: &ProcessReport) -> impl Iterator<Item = &ThreadReport> {
    p.thread_rows()
        .map(|(t, _)| t)
        .filter(|t| !matches!(t.role, Role::Foreign | Role::Profiler))
}

/// Wall time alive of the threads of these roles (None: the report has no time share).
pub fn alive_of(p: &ProcessReport, roles: &[Role]) -> Option<u64> {
    let by_role = p.time_share_by_role.as_ref()?;
    Some(
        by_role
            .iter()
            .filter(|r| roles.contains(&r.role))
            .map(|r| r.share.alive_ns)
            .sum(),
    )
}

/// Whether the report has sampled stacks of the process (`samples`): the evidence chain's
/// findings read them; without, the patterns read the counts alone.
pub fn has_stacks(p: &ProcessReport) -> bool {
    p.samples.as_ref().is_some_and(|s| !s.stacks.is_empty())
}

/// Writes of `cause` by own threads of the roles `roles` (empty: every own thread): count,
/// contended wait (acquisitions that found the lock free are no one's cost), and the count
/// per role.
pub fn writes_by(
    p: &ProcessReport,
    cause_: &str,
    roles: &[Role],
) -> (u64, u64, BTreeMap<Role, u64>) {
    let (mut n, mut wait, mut per_role) = (0, 0, BTreeMap::new());
    for t in own(p).filter(|t| roles.is_empty() || roles.contains(&t.role)) {
        if let Some(s) = cause(t, cause_) {
            n += s.count;
            wait += super::chain::contended(s);
            *per_role.entry(t.role).or_default() += s.count;
        }
    }
    (n, wait, per_role)
}

/// Sampled write stacks, innermost frame first, with their counts: every distinct one
/// (`flame`) or, without it, the longest waiting ones (`stacks`).
pub fn sampled_stacks(p: &ProcessReport) -> Vec<(Vec<String>, u64)> {
    if let Some(flame) = p.flame.as_ref().filter(|f| !f.is_empty()) {
        return flame
            .iter()
            .map(|f| (f.stack.rsplit(';').map(str::to_string).collect(), f.count))
            .collect();
    }
    p.stacks
        .iter()
        .flatten()
        .map(|s| (s.frames.clone(), s.count))
        .collect()
}

/// The function of a `function (file)` frame.
pub fn function(frame: &str) -> &str {
    frame.rsplit_once(" (").map_or(frame, |(f, _)| f)
}

/// The file of a `function (file)` frame.
pub fn file(frame: &str) -> &str {
    frame
        .rsplit_once(" (")
        .map_or("", |(_, f)| f.trim_end_matches(')'))
}

/// The C runtime, which allocates on behalf of the code that called it.
pub fn in_c_runtime(frame: &str) -> bool {
    let f = file(frame);
    [
        "libc.so",
        "ld-linux",
        "libstdc++",
        "libgcc_s",
        "libpthread",
        "libjemalloc",
    ]
    .iter()
    .any(|r| f.starts_with(r))
}
