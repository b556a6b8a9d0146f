//! A process's acquisitions by the role of its threads, in text: writes and reads and their
//! wait per role, and the libraries behind addons that started threads.

use std::fmt::Write as _;

use super::{count_of, fmt_ns};
use crate::output::report::ProcessReport;

/// Acquisitions by the role of the threads that made them: writes and reads, and their wait
/// (the longest wait first: a role may wait most on reads).
pub(super) fn roles_text(p: &ProcessReport) -> String {
    let roles = crate::output::report::role_totals(p);
    if roles.is_empty() {
        return String::new();
    }
    let mut out = format!(
        "\n  by thread role:\n  {:<10} {:>7} {:>9} {:>10} {:>9} {:>10}\n",
        "role", "threads", "writes", "write wait", "reads", "read wait"
    );
    for r in &roles {
        let _ = writeln!(
            out,
            "  {:<10} {:>7} {:>9} {:>10} {:>9} {:>10}",
            r.role.as_str(),
            r.threads,
            r.writes,
            fmt_ns(r.write_wait_ns),
            r.reads,
            fmt_ns(r.read_wait_ns)
        );
    }
    // Addon threads that a library behind the addon started: which library, whose addon.
    let mut libraries: Vec<(String, u64, u64)> = Vec::new();
    for (t, n) in p.thread_rows() {
        let (Some(lib), Some(addon)) = (&t.role_library, &t.role_addon) else {
            continue;
        };
        let name = |p: &str| {
            std::path::Path::new(p)
                .file_name()
                .map_or(p.to_string(), |n| n.to_string_lossy().into_owned())
        };
        let what = format!("{}, which {} needs", name(lib), name(addon));
        match libraries.iter_mut().find(|l| l.0 == what) {
            Some(l) => (l.1, l.2) = (l.1 + n, l.2 + t.lock.write.count),
            None => libraries.push((what, n, t.lock.write.count)),
        }
    }
    for (what, threads, writes) in libraries {
        let _ = writeln!(
            out,
            "  {} started in {what}: {}",
            count_of(threads, "addon thread", "addon threads"),
            count_of(writes, "write", "writes")
        );
    }
    out
}
