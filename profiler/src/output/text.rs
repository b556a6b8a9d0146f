//! The text rendering of reports, for people: tables, top threads and log2 histograms side
//! by side.

use std::fmt::Write as _;

use crate::output::report::{Dist, Kind, Lost, ProcessReport, Report, Stats};

/// Human-readable duration: `850ns`, `12.3us`, `4.56ms`, `1.20s`.
pub fn fmt_ns(ns: u64) -> String {
    let n = ns as f64;
    if ns < 1_000 {
        format!("{ns}ns")
    } else if ns < 1_000_000 {
        format!("{:.1}us", n / 1e3)
    } else if ns < 1_000_000_000 {
        format!("{:.2}ms", n / 1e6)
    } else {
        format!("{:.2}s", n / 1e9)
    }
}

fn fmt_f(ns: f64) -> String {
    fmt_ns(ns.round() as u64)
}

const BAR_WIDTH: usize = 24;

/// Log2 histogram lines `  <2.0us ████       1234`, over the same bucket range for every
/// histogram passed so that they can stand side by side. Zero-length waits (trylocks) get a
/// row of their own instead of stretching the range down to 1 ns.
pub fn histogram_lines(dists: &[&Dist]) -> Vec<Vec<String>> {
    let bounds: Vec<u64> = dists
        .iter()
        .flat_map(|d| d.buckets.iter().map(|b| b.0))
        .collect();
    let zero_row = bounds.contains(&1);
    let nonzero = bounds.iter().filter(|&&b| b > 1);
    let range = nonzero.clone().min().zip(nonzero.max());
    if !zero_row && range.is_none() {
        return dists.iter().map(|_| Vec::new()).collect();
    }
    let mut rows: Vec<(String, u64)> = Vec::new();
    if zero_row {
        rows.push(("0".into(), 1));
    }
    if let Some((&lo, &hi)) = range {
        let mut ub = lo;
        while ub <= hi && ub != 0 {
            rows.push((format!("<{}", fmt_ns(ub)), ub));
            ub = ub.saturating_mul(2);
        }
    }
    dists
        .iter()
        .map(|d| {
            let peak = d.buckets.iter().map(|b| b.1).max().unwrap_or(0).max(1);
            rows.iter()
                .map(|(label, ub)| {
                    let n = d.buckets.iter().find(|b| b.0 == *ub).map_or(0, |b| b.1);
                    let filled = ((n as f64 / peak as f64) * BAR_WIDTH as f64).ceil() as usize;
                    format!(
                        "{label:>8} {}{} {n:>8}",
                        "█".repeat(filled),
                        " ".repeat(BAR_WIDTH - filled),
                    )
                })
                .collect()
        })
        .collect()
}

/// Columns of text side by side, each padded to `width` characters.
pub fn side_by_side(cols: &[Vec<String>], width: usize) -> String {
    let rows = cols.iter().map(Vec::len).max().unwrap_or(0);
    let mut out = String::new();
    for r in 0..rows {
        let mut line = String::new();
        for c in cols {
            let cell = c.get(r).map(String::as_str).unwrap_or("");
            let pad = width.saturating_sub(cell.chars().count());
            line.push_str("  ");
            line.push_str(cell);
            line.push_str(&" ".repeat(pad));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// `s` in at most `width` characters: cut with an ellipsis when longer, so that the columns
/// after it stay where the header puts them.
pub fn fit(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        return s.to_string();
    }
    let mut out: String = s.chars().take(width.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// A file's name alone when its path does not fit a table column.
fn short_path(p: &str) -> String {
    if p.chars().count() <= LABEL {
        return p.to_string();
    }
    std::path::Path::new(p)
        .file_name()
        .map_or(p.to_string(), |n| n.to_string_lossy().into_owned())
}

/// Width of the first column of the tables of STATS.
const LABEL: usize = 10;

/// The figures of a process's or thread's row: writes, their wait (sum, p99), reads, their
/// wait (sum).
fn row_figures(write: &Stats, read: &Stats) -> (u64, String, String, u64, String) {
    (
        write.count,
        fmt_ns(write.wait_ns.sum),
        fmt_ns(write.wait_ns.p99),
        read.count,
        fmt_ns(read.wait_ns.sum),
    )
}

fn stats_row(label: &str, s: &Stats) -> String {
    let label = fit(label, LABEL);
    format!(
        "  {label:<LABEL$} {:>9} {:>7} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}\n",
        s.count,
        s.failed_trylocks,
        fmt_ns(s.wait_ns.sum),
        fmt_f(s.wait_ns.mean),
        fmt_ns(s.wait_ns.p50),
        fmt_ns(s.wait_ns.p99),
        fmt_ns(s.wait_ns.max),
        fmt_ns(s.hold_ns.p50),
        fmt_ns(s.hold_ns.p99),
    )
}

const TOP_THREADS: usize = 8;

/// Writes by the role of the thread that made them (count and total wait, most waited
/// first).
fn roles_text(p: &ProcessReport) -> String {
    let mut by_role: Vec<(&str, u64, u64)> = Vec::new();
    for t in &p.threads {
        let role = t.role.as_str();
        match by_role.iter_mut().find(|r| r.0 == role) {
            Some(r) => {
                r.1 += t.write.count;
                r.2 += t.write.wait_ns.sum;
            }
            None => by_role.push((role, t.write.count, t.write.wait_ns.sum)),
        }
    }
    by_role.retain(|r| r.1 > 0);
    if by_role.is_empty() {
        return String::new();
    }
    by_role.sort_by_key(|r| std::cmp::Reverse((r.2, r.1)));
    let mut out = format!(
        "\n  writes by thread role:\n  {:<10} {:>9} {:>10}\n",
        "role", "writes", "wait sum"
    );
    for (role, n, wait) in by_role {
        let _ = writeln!(out, "  {role:<10} {n:>9} {:>10}", fmt_ns(wait));
    }
    // Addon threads that a library behind the addon started: which library, whose addon.
    let mut libraries: Vec<(String, u64, u64)> = Vec::new();
    for t in &p.threads {
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
            Some(l) => (l.1, l.2) = (l.1 + 1, l.2 + t.write.count),
            None => libraries.push((what, 1, t.write.count)),
        }
    }
    for (what, threads, writes) in libraries {
        let _ = writeln!(
            out,
            "  {threads} addon thread(s) started in {what}: {writes} writes"
        );
    }
    out
}

/// The text rendering of a report.
pub fn to_text(r: &Report) -> String {
    let mut out = String::new();
    match r.kind {
        Kind::Interval => {
            // One compact block per interval: totals per process.
            let _ = writeln!(
                out,
                "── interval {} ({:.1}s) ──",
                r.end,
                r.interval_s.unwrap_or(0.0)
            );
            if r.processes.is_empty() {
                out.push_str("  no mmap_lock activity\n");
            }
            for p in &r.processes {
                let (writes, wait, p99, reads, read_wait) = row_figures(&p.write, &p.read);
                let _ = writeln!(
                    out,
                    "  {:>7} {:<15} writes {writes:>7} wait {wait:>9} (p99 {p99:>8})   reads {reads:>8} wait {read_wait:>9}",
                    p.pid,
                    fit(&p.comm, 15),
                );
            }
        }
        Kind::Summary => {
            let _ = writeln!(
                out,
                "═══ mmaplock-prof summary: {} to {} ({:.1}s) ═══",
                r.start,
                r.end,
                r.duration_s.unwrap_or(0.0)
            );
            if r.processes.is_empty() {
                out.push_str("no mmap_lock activity by the selected processes\n");
            }
            if let Some(f) = &r.findings {
                out.push_str(&crate::output::findings::to_text(f));
            }
            for p in &r.processes {
                out.push_str(&process_text(p));
            }
            if let Some(o) = &r.overhead {
                let _ = writeln!(
                    out,
                    "\nprofiler cost: {} events, {:.1} ns of BPF per event, {:.3}% of one CPU",
                    o.events, o.bpf_ns_per_event, o.bpf_cpu_pct
                );
            }
            out.push_str(&lost_text(&r.lost));
        }
    }
    out
}

/// One line naming every non-zero reason, or nothing when nothing was lost.
fn lost_text(l: &Lost) -> String {
    let reasons = [
        (l.map_full, "map full: raise --max-threads"),
        (l.nested, "more than two mm locks at once"),
        (l.no_state, "no per-thread state"),
        (l.ring_full, "pending ring full"),
        (l.exit_flush, "exited thread unreachable"),
        (l.exit_pending, "threads still exiting at the end"),
        (l.stacks, "stacks dropped: raise --stack-sample"),
    ];
    let parts: Vec<String> = reasons
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, why)| format!("{n} ({why})"))
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!("lost: {}\n", parts.join(", "))
    }
}

fn process_text(p: &ProcessReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "\nprocess {} ({})", p.pid, p.comm);
    let _ = writeln!(
        out,
        "  {:<LABEL$} {:>9} {:>7} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "lock",
        "acquired",
        "failed",
        "wait sum",
        "mean",
        "p50",
        "p99",
        "max",
        "hold p50",
        "hold p99"
    );
    out.push_str(&stats_row("write", &p.write));
    out.push_str(&stats_row("read", &p.read));
    if p.downgrade.count > 0 {
        out.push_str(&stats_row("downgrade", &p.downgrade));
    }
    if let Some(own) = &p.profiler {
        let _ = writeln!(
            out,
            "  (not counted above: mmaplock-prof's own {} reads and {} writes of this lock, {:.2}% of its acquisitions)",
            own.read.count,
            own.write.count,
            own.share * 100.0
        );
    }
    out.push_str(&time_share_text(p));
    if !p.causes.is_empty() {
        let _ = writeln!(out, "\n  writes by cause:");
        for c in &p.causes {
            out.push_str(&stats_row(&c.cause, &c.write));
        }
    }
    out.push_str(&roles_text(p));
    if let Some(dsos) = p.dsos.as_ref().filter(|d| !d.is_empty()) {
        let _ = writeln!(out, "\n  sampled writes by code:");
        for d in dsos.iter().take(TOP_THREADS) {
            out.push_str(&stats_row(&short_path(&d.dso), &d.write));
        }
    }
    if let Some(js) = p.js_functions.as_ref().filter(|j| !j.is_empty()) {
        // Shares of all sampled writes (the writes charged to any code).
        let sampled: u64 = p.dsos.iter().flatten().map(|d| d.write.count).sum();
        let _ = writeln!(
            out,
            "\n  sampled writes by JS function:\n  {:<32} {:>9} {:>6} {:>10}  definition",
            "function", "writes", "share", "wait sum"
        );
        for f in js.iter().take(TOP_THREADS) {
            let share = 100.0 * f.writes as f64 / sampled.max(1) as f64;
            let _ = writeln!(
                out,
                "  {:<32} {:>9} {:>5.1}% {:>10}  {}",
                fit(&f.function, 32),
                f.writes,
                share,
                fmt_ns(f.wait_ns_sum),
                f.file
            );
        }
    }
    if let Some(note) = &p.v8_note {
        let _ = writeln!(out, "\n  JavaScript frames unnamed from the heap: {note}");
    }
    if let Some(ends) = p.stack_ends.as_ref().filter(|e| !e.is_empty()) {
        let parts: Vec<String> = ends.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let _ = writeln!(out, "\n  sampled stacks end at: {}", parts.join(", "));
    }
    if let Some(hint) = &p.js_hint {
        let _ = writeln!(out, "\n  {hint}");
    }
    if let Some(stacks) = p.stacks.as_ref().filter(|s| !s.is_empty()) {
        let _ = writeln!(out, "\n  sampled write stacks that waited longest:");
        for s in stacks.iter().take(3) {
            let _ = writeln!(
                out,
                "    {} writes, {} waited:",
                s.count,
                fmt_ns(s.wait_ns_sum)
            );
            for f in s.frames.iter().take(8) {
                let _ = writeln!(out, "      {f}");
            }
        }
    }
    out.push_str(&blockers_text(p));
    let _ = writeln!(
        out,
        "\n  top threads by write wait:\n  {:>8} {:<9} {:<15} {:>8} {:>10} {:>9} {:>9} {:>10}",
        "tid", "role", "comm", "writes", "wait sum", "wait p99", "reads", "wait sum"
    );
    for t in p.threads.iter().take(TOP_THREADS) {
        let (writes, wait, p99, reads, read_wait) = row_figures(&t.write, &t.read);
        let _ = writeln!(
            out,
            "  {:>8} {:<9} {:<15} {writes:>8} {wait:>10} {p99:>9} {reads:>9} {read_wait:>10}",
            t.tid,
            t.role.as_str(),
            fit(&t.comm, 15),
        );
    }
    if p.threads.len() > TOP_THREADS {
        let _ = writeln!(
            out,
            "  ... and {} more threads",
            p.threads.len() - TOP_THREADS
        );
    }
    let hists = histogram_lines(&[&p.write.wait_ns, &p.read.wait_ns]);
    if hists.iter().any(|h| !h.is_empty()) {
        let width = 8 + 1 + BAR_WIDTH + 1 + 8;
        let mut cols = vec![
            vec![format!("{:<width$}", "write wait (log2 buckets)")],
            vec!["read wait (log2 buckets)".to_string()],
        ];
        for (c, h) in cols.iter_mut().zip(hists) {
            c.extend(h);
        }
        out.push('\n');
        out.push_str(&side_by_side(&cols, width));
    }
    let hists = histogram_lines(&[&p.write.hold_ns, &p.read.hold_ns]);
    if hists.iter().any(|h| !h.is_empty()) {
        let width = 8 + 1 + BAR_WIDTH + 1 + 8;
        let mut cols = vec![
            vec!["write hold (log2 buckets)".to_string()],
            vec!["read hold (log2 buckets)".to_string()],
        ];
        for (c, h) in cols.iter_mut().zip(hists) {
            c.extend(h);
        }
        out.push('\n');
        out.push_str(&side_by_side(&cols, width));
    }
    out
}

/// A share as people read it: `6.1%`, `0.042%` (small ones keep two significant digits).
pub fn fmt_share(x: f64) -> String {
    let pct = x * 100.0;
    if pct == 0.0 || pct >= 0.1 {
        format!("{pct:.1}%")
    } else {
        let digits = (1 - pct.log10().floor() as i32).clamp(2, 6) as usize;
        format!("{pct:.digits$}%")
    }
}

/// What the lock cost the process's threads: `worker threads spent 6.1% of their time
/// waiting for mmap_lock (18.0% of their CPU time)`, per role, then for the process.
pub fn time_share_text(p: &ProcessReport) -> String {
    let mut out = String::new();
    let Some(all) = &p.time_share else {
        return out;
    };
    let cpu = |s: &crate::output::report::TimeShare| {
        s.cpu.map_or(String::new(), |c| {
            format!(" ({} of their CPU time)", fmt_share(c))
        })
    };
    let _ = writeln!(
        out,
        "\n  time share: its threads spent {} of their time waiting for mmap_lock{} ({} of {} alive)",
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
            "    {} threads spent {} of their time waiting for mmap_lock{}",
            r.role.as_str(),
            fmt_share(r.share.wall),
            cpu(&r.share)
        );
    }
    out
}

/// "Who made whom wait": write waits by waiter role, charged to holder role and cause, as a
/// share of that role's write wait; then the threads that held the lock the longest while
/// others waited.
pub fn blockers_text(p: &ProcessReport) -> String {
    let mut out = String::new();
    let (Some(roles), Some(blockers)) = (&p.blocked_by_role, &p.blockers) else {
        return out;
    };
    let total_wait = p.write.wait_ns.sum + p.read.wait_ns.sum;
    let charged = p.blocked_wait_ns.unwrap_or(0);
    let _ = writeln!(
        out,
        "\n  who made whom wait ({} of {} wait charged to the holds it overlapped):",
        fmt_ns(charged),
        fmt_ns(total_wait),
    );
    if roles.iter().all(|r| r.write_wait_ns == 0) {
        out.push_str("    no write waited behind another thread's hold\n");
    } else {
        let _ = writeln!(
            out,
            "    {:<9} {:<9} {:<11} {:>10} {:>8}",
            "waiter", "holder", "its hold", "write wait", "share"
        );
        let mut role_wait: std::collections::BTreeMap<&str, u64> = Default::default();
        for t in &p.threads {
            *role_wait.entry(t.role.as_str()).or_default() += t.write.wait_ns.sum;
        }
        for r in roles
            .iter()
            .filter(|r| r.write_wait_ns > 0)
            .take(TOP_THREADS)
        {
            let of = role_wait.get(r.waiter_role.as_str()).copied().unwrap_or(0);
            let share = if of == 0 {
                0.0
            } else {
                100.0 * r.write_wait_ns as f64 / of as f64
            };
            let _ = writeln!(
                out,
                "    {:<9} {:<9} {:<11} {:>10} {:>7.0}%",
                r.waiter_role.as_str(),
                r.holder_role.as_str(),
                r.cause,
                fmt_ns(r.write_wait_ns),
                share
            );
        }
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

/// A file size given in KiB, in the unit a person would say it in: `128 B`, `64 KiB`, `1 MiB`.
pub fn size_name(kib: f64) -> String {
    if kib < 1.0 {
        format!("{} B", (kib * 1024.0).round())
    } else if kib >= 1024.0 {
        format!("{} MiB", kib / 1024.0)
    } else {
        format!("{kib} KiB")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::{
        fixtures::{process, stats},
        report::{DsoReport, JsFunctionReport},
    };
    use crate::registry::roles::Role;

    #[test]
    fn long_names_are_cut_and_the_columns_stay_aligned() {
        let mut p = process(1, "node", 5000, false);
        let write = stats(3, 3000, 1000, &[(1024, 3)]);
        p.dsos = Some(vec![
            DsoReport {
                dso: "/usr/lib/x86_64-linux-gnu/libsomething-with-a-very-long-name-1.2.3.so".into(),
                write: write.clone(),
            },
            DsoReport {
                dso: "/usr/bin/node".into(),
                write,
            },
        ]);
        p.js_functions = Some(vec![JsFunctionReport {
            function: "aVeryLongJavaScriptFunctionNameThatGoesOnAndOn".into(),
            file: "/app/server.js:10:3".into(),
            writes: 3,
            wait_ns_sum: 3000,
        }]);
        p.threads[1].comm = "a-name-longer-than-15".into();
        let text = process_text(&p);
        let lines: Vec<&str> = text.lines().collect();
        let width = |l: &str| l.chars().count();
        let header = lines.iter().find(|l| l.starts_with("  lock")).unwrap();
        let at = lines
            .iter()
            .position(|l| l.contains("sampled writes by code"))
            .unwrap();
        for row in &lines[at + 1..at + 3] {
            assert_eq!(width(row), width(header), "{row}\n{header}\n{text}");
        }
        assert!(lines[at + 1].starts_with("  libsometh… "), "{text}");
        assert!(lines[at + 2].starts_with("  node       "), "{text}");
        // The JS function's and the thread's tables too.
        let js = lines.iter().find(|l| l.contains("/app/server.js")).unwrap();
        assert!(js.starts_with(&format!("  {}… ", "aVeryLongJavaScriptFunctionName")));
        let thread = lines.iter().find(|l| l.contains("a-name-longer-")).unwrap();
        let head = lines.iter().find(|l| l.contains("wait p99")).unwrap();
        assert_eq!(width(thread), width(head), "{thread}\n{head}");
        assert_eq!(fit("short", 10), "short");
        assert_eq!(fit("exactly-10", 10), "exactly-10");
    }

    /// Addon threads that a library behind the addon started say which, by file name.
    #[test]
    fn the_roles_name_the_library_behind_an_addon() {
        let mut p = process(1, "node", 5000, false);
        let t = &mut p.threads[1];
        t.role = Role::Addon;
        t.role_addon = Some("/app/node_modules/sharp/build/Release/sharp.node".into());
        t.role_library = Some("/app/node_modules/sharp/lib/libvips-cpp.so.42".into());
        let writes = t.write.count;
        let text = roles_text(&p);
        let line = format!(
            "  1 addon thread(s) started in libvips-cpp.so.42, which sharp.node needs: {writes} writes"
        );
        assert!(text.lines().any(|l| l == line), "{text}");
        // An addon thread started in the addon itself: nothing more to say.
        p.threads[1].role_library = None;
        assert!(!roles_text(&p).contains("started in"));
    }
}
