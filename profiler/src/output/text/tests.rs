//! The text view with names longer than its columns, and an addon's library.

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
    let text = process_text(&p, crate::vocab::Mode::Full);
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
    let writes = t.lock.write.count;
    let text = roles_text(&p);
    let line = format!(
        "  1 addon thread started in libvips-cpp.so.42, which sharp.node needs: {writes} writes"
    );
    assert!(text.lines().any(|l| l == line), "{text}");
    // An addon thread started in the addon itself: nothing more to say.
    p.threads[1].role_library = None;
    assert!(!roles_text(&p).contains("started in"));
}

/// "Who made whom wait" says what its figures add up: the charged part of the process's
/// threads' waits (never more than they waited), why overlapping read holds do not add up to
/// more, and what the share column is a share of.
#[test]
fn the_blockers_header_names_what_it_adds_up_and_the_shares_base() {
    use crate::output::report::{BlockerReport, RoleBlock};
    let mut p = process(1, "node", 5_000_000, false);
    // Of the process's 5.00ms of write wait and 10ns of read wait, 4.00ms charged.
    p.blocked_wait_ns = Some(4_000_000);
    p.blocked_by_role = Some(vec![RoleBlock {
        waiter_role: Role::Worker,
        holder_role: Role::Worker,
        cause: "read".into(),
        wait_ns: 4_000_000,
        write_wait_ns: 2_499_999,
    }]);
    p.blockers = Some(vec![BlockerReport {
        tid: 2,
        pid: 1,
        role: Role::Worker,
        comm: "w".into(),
        cause: "read".into(),
        waits: 3,
        wait_ns: 4_000_000,
        write_wait_ns: 2_499_999,
    }]);
    let text = blockers_text(&p);
    assert!(
        text.contains("who made whom wait: 4.00ms of the 5.00ms its threads waited (write and read) is charged to the holds they waited behind"),
        "{text}"
    );
    assert!(
        text.contains(
            "overlapping read holds in proportion, so no wait is charged more than it lasted"
        ),
        "{text}"
    );
    assert!(
        text.contains("share: of all the wait, write and read, of the waiter's role)"),
        "{text}"
    );
    // The worker's wait is the process's write wait less its main thread's: 80% of it
    // charged, of which the reads' part is said too.
    let row = format!(
        "    {:<9} {:<9} {:<11} {:>10} {:>10} {:>10} {:>6}",
        "worker", "worker", "read", "4.00ms", "2.50ms", "1.50ms", "80%"
    );
    assert!(text.lines().any(|l| l == row), "{row}\n{text}");
}

/// The roles table has the reads and their wait beside the writes', the longest wait first.
#[test]
fn the_roles_table_has_reads_beside_writes() {
    let mut p = process(1, "node", 5000, false);
    // The main thread: few writes, but the longest wait, on reads.
    p.threads[0].lock.read = stats(40, 9_000_000, 1_000_000, &[(1 << 20, 40)]);
    let text = roles_text(&p);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[1], "  by thread role:", "{text}");
    let row = |role: &str, threads: u64, writes: u64, ww: &str, reads: u64, rw: &str| {
        format!("  {role:<10} {threads:>7} {writes:>9} {ww:>10} {reads:>9} {rw:>10}")
    };
    assert_eq!(lines[3], row("main", 1, 4, "1ns", 40, "9.00ms"), "{text}");
    assert_eq!(lines[4], row("worker", 1, 6, "5.0us", 0, "0ns"), "{text}");
}

/// Contention mode's holder stacks: the text says what the writers that sampled waits began
/// behind were running, their JavaScript function first, then their stacks.
#[test]
fn held_by_names_the_holders_function_and_stack() {
    use crate::output::report::{HolderFunctionReport, StackReport};
    let mut p = process(1, "node", 5_000_000, false);
    assert!(waits::holders_text(&p).is_empty());
    p.holder_functions = Some(vec![HolderFunctionReport {
        function: "shrinkBuffer".into(),
        file: "/srv/app.js:10:3".into(),
        cause: "mprotect".into(),
        waits: 12,
        wait_ns_sum: 93_000_000,
    }]);
    p.holder_stacks = Some(vec![StackReport {
        frames: vec![
            "__mprotect (libc.so.6)".into(),
            "shrinkBuffer (/srv/app.js:10:3)".into(),
        ],
        count: 12,
        wait_ns_sum: 93_000_000,
    }]);
    let text = process_text(&p, crate::vocab::Mode::Contention);
    let at = text.find("held by:").expect("a held-by section");
    let held = &text[at..];
    assert!(
        held.contains(
            "shrinkBuffer (/srv/app.js:10:3): 12 waits behind it (held for mprotect), 93.00ms waited"
        ),
        "{held}"
    );
    assert!(held.contains("      __mprotect (libc.so.6)"), "{held}");
}

/// Threads grouped are said after the listed ones, a line per group with its count, where it
/// started and its totals; a process's entry cut to the bound says what it lost.
#[test]
fn grouped_threads_and_what_was_cut_are_said() {
    use crate::output::report::{
        ThreadGroupReport,
        budget::{RowsCut, Trimmed},
        thread_groups::SHORT_LIVED,
    };
    let mut p = process(1, "node", 5_000_000, false);
    let mut row = p.threads[1].clone();
    row.tid = 0;
    row.role = Role::Addon;
    row.role_addon = Some("/app/node_modules/argon2/build/Release/argon2.node".into());
    p.thread_groups = Some(vec![ThreadGroupReport {
        threads: 4922,
        grouped: SHORT_LIVED.into(),
        start_routine: Some("fill_segment_thr".into()),
        row,
    }]);
    p.trimmed = Some(Trimmed {
        bytes: 3_400_000,
        samples: Some(2_100),
        threads: None,
        js_functions: Some(RowsCut {
            rows: 40,
            count: 55,
            wait_ns_sum: 1_000,
        }),
        holder_functions: None,
    });
    let text = process_text(&p, crate::vocab::Mode::Full);
    assert!(
        text.contains("  4922 more threads grouped (JSON `thread_groups`, their totals exact):\n    4922 addon threads started in fill_segment_thr of argon2.node (each lived under a second): 6 writes (5.00ms wait), 0 reads (0ns wait)\n"),
        "{text}"
    );
    assert!(
        text.contains("(its entry, 3.4 MB, was cut to the summary's bound of 1 MB a process: 2100 sampled stacks that waited least (in samples.cut), 40 JavaScript functions (55 samples, 1.0us); its totals are whole)"),
        "{text}"
    );
    // The roles count the grouped threads.
    assert!(
        roles_text(&p).contains("  addon         4922 "),
        "{}",
        roles_text(&p)
    );
}
