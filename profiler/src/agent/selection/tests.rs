//! Selectors parsed, matched and counted; a scan finding this very process.

use super::selectors::cgroup2_mounts;
use super::*;

#[test]
fn default_selects_node_executables_only() {
    let s = Selectors::default();
    assert!(s.matches(1, "node", Some("/usr/bin/node"), "/"));
    assert!(s.matches(
        1,
        "MainThread",
        Some("/opt/node-v20/bin/node (deleted)"),
        "/"
    ));
    assert!(!s.matches(1, "node", Some("/usr/bin/nodejs-helper"), "/"));
    assert!(!s.matches(1, "node", None, "/"));
}

#[test]
fn selectors_by_name_exe_cgroup_and_pid() {
    let s = Selectors {
        comms: vec!["api".into()],
        exes: vec!["*/bin/deno".into()],
        cgroups: vec!["/system.slice/web.service".into()],
        pids: vec![42],
    };
    assert!(s.matches(7, "api", None, "/"));
    assert!(s.matches(7, "x", Some("/usr/local/bin/deno"), "/"));
    assert!(s.matches(7, "x", None, "/system.slice/web.service"));
    assert!(s.matches(7, "x", None, "/system.slice/web.service/worker"));
    assert!(!s.matches(7, "x", None, "/system.slice/web.service2"));
    assert!(s.matches(42, "x", None, "/"));
    assert!(!s.matches(7, "node", Some("/usr/bin/node"), "/"));
    // A name is also the one exec gave: a process that renamed itself since is found by it
    // (the kernel selected those at their exec), and stays selected when the scan looks again.
    assert!(s.matches(7, "api (prod)", Some("/srv/bin/api"), "/"));
    assert!(!s.matches(7, "other", Some("/srv/bin/other"), "/"));
}

#[test]
fn config_files_name_the_bad_line() {
    // This very process: a pid that exists and is no kernel thread on any host.
    let me = std::process::id();
    let mut s = Selectors::default();
    s.add_text(&format!(
        "# node services\ncomm node\nexe */bin/node  # any\n\ncgroup /a/b/\npid {me}\n"
    ))
    .unwrap();
    assert_eq!(s.comms, vec!["node"]);
    assert_eq!(s.exes, vec!["*/bin/node"]);
    assert_eq!(s.cgroups, vec!["/a/b"]);
    assert_eq!(s.pids, vec![me]);
    assert_eq!(s.add_text("comm x\nbogus 1\n").unwrap_err().0, 2);
    assert_eq!(s.add_text("pid x\n").unwrap_err().0, 1);
    // Each value as the command line checks it, with the same words.
    let kthread = format!("pid {}", crate::cli::a_kernel_thread());
    for (line, needle) in [
        ("cgroup relative/path", "a cgroup v2 path is absolute"),
        (
            "comm sixteen-bytes-xx",
            "longer than the 15 the kernel keeps",
        ),
        (kthread.as_str(), "kernel thread"),
        ("pid 0", "not a process id"),
        ("exe [", "not a glob"),
        ("bogus 1", "unknown selector \"bogus\""),
    ] {
        let (n, what) = s.add_text(line).unwrap_err();
        assert_eq!(n, 1);
        assert!(what.contains(needle), "{line}: {what}");
    }
}

#[test]
fn cgroups_with_the_mount_point_or_not_there_are_warned_about() {
    let Some(mount) = cgroup2_mounts().into_iter().next() else {
        profiler_common::skip::skip_because("no cgroup v2 hierarchy");
        return;
    };
    let s = Selectors {
        cgroups: vec![
            format!("{}/system.slice/x.service", mount.display()),
            "/no-such-cgroup-mlp".into(),
            "/".into(),
        ],
        ..Default::default()
    };
    let w = s.warnings();
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(
        w[0].ends_with("--cgroup /system.slice/x.service"),
        "{}",
        w[0]
    );
    assert!(w[1].contains("no such cgroup now"), "{}", w[1]);
}

#[test]
fn each_selector_is_counted_apart() {
    let s = Selectors {
        comms: vec!["api".into()],
        pids: vec![7],
        ..Default::default()
    };
    assert_eq!(s.labels(), ["comm api", "pid 7"]);
    assert_eq!(s.matches_each(7, "api", None, "/"), [true, true]);
    assert_eq!(s.matches_each(8, "api", None, "/"), [true, false]);
    assert_eq!(Selectors::default().labels(), ["exe node"]);
}

#[test]
fn a_scan_finds_this_process_by_pid_and_forgets_it_when_deselected() {
    let me = std::process::id();
    let mut sel = Selection::new(Selectors {
        pids: vec![me],
        ..Default::default()
    });
    let c = sel.scan();
    assert_eq!(c.added.len(), 1, "{c:?}");
    assert_eq!(c.added[0].pid, me);
    assert!(sel.scan().added.is_empty(), "found once");
    sel.reload(Selectors {
        comms: vec!["no-such-comm-xyz".into()],
        ..Default::default()
    });
    let c = sel.scan();
    assert_eq!(c.removed.len(), 1);
    assert_eq!(sel.len(), 0);
}
