//! The command line as users type it: defaults, bad values and their one-line errors.

use super::*;

fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
    Cli::try_parse_from(std::iter::once("mmaplock-prof").chain(args.iter().copied()))
}

#[test]
fn defaults() {
    let c = parse(&[]).unwrap();
    assert!(c.command.is_none());
    assert_eq!(c.profile.interval(), Config::INTERVAL_S);
    assert_eq!(c.profile.max_threads, Config::MAX_THREADS);
    assert!(c.profile.pids.is_empty() && c.profile.duration.is_none());
    assert_eq!(c.log_level, None);
}

/// `--log-level` goes anywhere on a profiling line, and after a command's name.
#[test]
fn log_level_is_global() {
    use log::LevelFilter::{Debug, Off, Trace};
    for (args, level, command) in [
        (&["--log-level", "debug", "-d", "1"][..], Debug, None),
        (&["-d", "1", "--log-level", "off"], Off, None),
        (&["agent", "--log-level", "trace"], Trace, Some("agent")),
        (&["demo", "--log-level", "debug"], Debug, Some("demo")),
    ] {
        let c = parse(args).unwrap();
        assert_eq!(c.log_level, Some(level), "{args:?}");
        let parsed = match c.command {
            None => None,
            Some(Command::Agent(_)) => Some("agent"),
            Some(Command::Demo(_)) => Some("demo"),
            Some(_) => Some("another"),
        };
        assert_eq!(parsed, command, "{args:?}");
    }
    let e = parse(&["--log-level", "loud"]).unwrap_err().to_string();
    assert!(
        e.contains("possible values: off, error, warn, info, debug, trace"),
        "{e}"
    );
}

#[test]
fn repeatable_filters_and_durations() {
    let c = parse(&[
        // Above any pid_max: no process has them now (a kernel thread would be refused).
        "-p", "4194312", "--pid", "4194313", "--comm", "node", "-d", "1.5", "-i", "0",
    ])
    .unwrap();
    assert_eq!(c.profile.pids, vec![4194312, 4194313]);
    assert_eq!(c.profile.comms, vec!["node"]);
    assert_eq!(c.profile.duration, Some(Duration::from_millis(1500)));
    assert_eq!(c.profile.interval(), 0.0);
}

#[test]
fn bad_values_are_usage_errors() {
    for args in [
        &["--pid", "abc"][..],
        &["--pid", "0"],
        &["--pid", "-3"],
        &["-d", "0"],
        &["-i", "-1"],
        &["-f", "xml"],
        &["--bogus"],
        &["--comm", ""],
        &["--comm", "node", "--comm", ""],
        &["-o", ""],
        &["--stacks", ""],
        &["-i", "0.0000001"],
        &["-d", "1e-12"],
        &["-i", "nan"],
        &["demo", "--node", ""],
        &["agent", "--escalate-dir", ""],
        &["agent", "--escalate-dir", "d", "--escalate-at", "0"],
        &["agent", "--escalate-dir", "d", "--escalate-at", "101"],
        &["agent", "--escalate-dir", "d", "--escalate-at", "five"],
        &["agent", "--escalate-dir", "d", "--escalate-window", "0"],
        &["agent", "--escalate-dir", "d", "--escalate-for", "-1"],
        &["agent", "--escalate-dir", "d", "--escalate-cooldown", "x"],
        &["agent", "--escalate-dir", "d", "--escalate-budget-mib", "0"],
        &["--pid-start-ticks", "5"],
    ] {
        let e = parse(args).unwrap_err();
        assert_eq!(e.exit_code(), 2, "{args:?}");
    }
}

#[test]
fn escalation_defaults_are_the_contracts() {
    let Some(Command::Agent(a)) = parse(&["agent", "--escalate-dir", "caps"]).unwrap().command
    else {
        panic!("the agent");
    };
    assert_eq!(
        a.escalate_dir.as_deref(),
        Some(std::path::Path::new("caps"))
    );
    assert_eq!(a.escalate_at, 5.0);
    let secs = |d: std::time::Duration| d.as_secs();
    assert_eq!(
        (
            secs(a.escalate_window),
            secs(a.escalate_for),
            secs(a.escalate_cooldown)
        ),
        (30, 15, 600)
    );
    assert_eq!(a.escalate_budget_mib, 512);
    let Some(Command::Agent(a)) = parse(&["agent", "--escalate-at", "2.5%"]).unwrap().command
    else {
        panic!("the agent");
    };
    assert_eq!((a.escalate_at, a.escalate_dir), (2.5, None));
}

#[test]
fn empty_values_name_the_option() {
    for (args, needle) in [
        (
            &["--comm", ""][..],
            "--comm <NAME>': a command name cannot be empty",
        ),
        (&["-o", ""], "--output <FILE>': a path cannot be empty"),
        (&["--stacks", ""], "--stacks <FILE>'"),
        (&["-i", "1e-9"], "at least 0.001 seconds"),
    ] {
        let e = parse(args).unwrap_err().to_string();
        let first = e.lines().next().unwrap();
        assert!(first.contains(needle), "{args:?}: {first}");
    }
}

#[test]
fn the_agent_and_the_profiler_refuse_the_same_values() {
    let kthread = values::a_kernel_thread().to_string();
    for (args, needle) in [
        (&["--max-threads", "0"][..], "'0' for '--max-threads <N>'"),
        (
            &["agent", "--max-threads", "0"],
            "'0' for '--max-threads <N>'",
        ),
        (
            &["--comm", "sixteen-bytes-xx"],
            "is 16 bytes, longer than the 15 the kernel keeps",
        ),
        (&["agent", "--comm", "sixteen-bytes-xx"], "is 16 bytes"),
        (&["-i", "1e-400"], "too small to be a number of seconds"),
        (&["agent", "-i", "1e-400"], "too small"),
        (&["-d", "1e400"], "not a number of seconds"),
        (
            &["agent", "--cgroup", "system.slice"],
            "a cgroup v2 path is absolute",
        ),
        (&["--pid", &kthread], "is a kernel thread"),
        (&["agent", "--pid", &kthread], "kernel thread"),
        (
            &["--stacks", "f", "--stack-sample", "0"],
            "--stack-sample 0 takes none",
        ),
        (
            &["--pprof", "f.pb.gz", "--stack-sample", "0"],
            "--pprof FILE is a profile of the sampled stacks, and --stack-sample 0 takes none",
        ),
        (
            &["agent", "--pprof", "--stack-sample", "0"],
            "--stack-sample",
        ),
        (&["compare", "a.json"], "were not provided: <AFTER.json>"),
        (&["--children"], "were not provided: --pid <PID>"),
    ] {
        let e = parse(args).and_then(Cli::check).unwrap_err();
        assert_eq!(e.exit_code(), 2, "{args:?}");
        let line = one_line(&e);
        assert!(line.contains(needle), "{args:?}: {line}");
        assert!(!line.contains('\n'), "{line}");
    }
    // Zero is zero, and a comm of exactly 15 bytes is fine.
    assert_eq!(parse(&["-i", "0e5"]).unwrap().profile.interval(), 0.0);
    assert!(parse(&["--comm", "fifteen-bytes-x"]).is_ok());
    assert!(
        parse(&["--stacks", "f", "--stack-sample", "1"])
            .and_then(Cli::check)
            .is_ok()
    );
}

#[test]
fn children_has_its_own_help() {
    use clap::CommandFactory as _;
    let help = Cli::command().render_long_help().to_string();
    let children = help
        .split("--children")
        .nth(1)
        .and_then(|s| s.lines().nth(1))
        .unwrap()
        .trim()
        .to_string();
    assert!(
        children.starts_with("Also profile every descendant"),
        "{children}"
    );
}

#[test]
fn floor_is_hidden_but_accepted() {
    assert!(parse(&["--floor", "-d", "1"]).unwrap().profile.floor);
    assert!(!parse(&[]).unwrap().profile.floor);
    use clap::CommandFactory as _;
    let help = Cli::command().render_long_help().to_string();
    assert!(!help.contains("--floor"), "{help}");
    assert!(
        parse(&["--floor-clock", "-d", "1"])
            .unwrap()
            .profile
            .floor_clock
    );
    assert!(parse(&["--floor", "--floor-clock"]).is_err());
    assert!(parse(&["--floor-storage"]).unwrap().profile.floor_storage);
    assert!(parse(&["--floor-clock", "--floor-storage"]).is_err());
    assert!(parse(&["--floor", "--floor-storage"]).is_err());
}

#[test]
fn study_takes_lists_and_sizes_with_units() {
    let c = parse(&[
        "study",
        "-k",
        "2,4",
        "-k",
        "8",
        "--sizes",
        "128B,64KiB",
        "--size",
        "1MiB",
        "--size",
        "16",
        "--scenarios",
        "reuse,default",
        "--scenario",
        "dispose",
    ])
    .unwrap();
    let Some(Command::Study(s)) = c.command else {
        panic!("expected study");
    };
    assert_eq!(s.ks, [2, 4, 8]);
    assert_eq!(s.sizes, [0.125, 64.0, 1024.0, 16.0]);
    assert_eq!(s.scenarios, ["reuse", "default", "dispose"]);
    assert_eq!(s.out, PathBuf::from("study-out"));
    assert!(!s.quick && s.iterations.is_none());
    assert_eq!(s.repeat, Config::STUDY_REPEAT);
}

#[test]
fn study_bad_values_are_usage_errors() {
    for (args, needle) in [
        (
            &["study", "--scenario", "pool"][..],
            "'pool' for '--scenario <ID>'",
        ),
        (&["study", "--scenarios", "reuse,bogus"], "'bogus'"),
        (&["study", "-k", "0"], "'0' for '-k <K>'"),
        (&["study", "-k", "2,x"], "'x' for '-k <K>'"),
        (&["study", "--size", "10B"], "\"10B\" is not a file size"),
        (&["study", "--size", "2GiB"], "not a file size"),
        (&["study", "--size", "64parsecs"], "not a file size"),
        (&["study", "-n", "0"], "'0' for '-n <N>'"),
        (&["study", "--repeat", "0"], "'0' for '--repeat <N>'"),
        (&["study", "--out", ""], "a path cannot be empty"),
    ] {
        let e = parse(args).unwrap_err();
        assert_eq!(e.exit_code(), 2, "{args:?}");
        let msg = e.to_string();
        assert!(
            msg.lines().next().unwrap().contains(needle),
            "{args:?}: {msg}"
        );
    }
}

#[test]
fn demo_subcommand() {
    let c = parse(&["demo", "-k", "2", "-n", "10"]).unwrap();
    match c.command {
        Some(Command::Demo(d)) => {
            assert_eq!((d.workers, d.iterations, d.file_kib), (2, 10, 64));
        }
        _ => panic!("expected demo"),
    }
}

/// `-- COMMAND [ARGS...]`: everything after `--` is the command, hyphens and all; it takes no
/// `--pid` beside it, and its reports default to the summary alone unless written to a file.
#[test]
fn a_command_after_the_double_dash() {
    let c = parse(&["-f", "json", "--", "sh", "-c", "a | b", "--pid", "1"]).unwrap();
    assert!(c.command.is_none());
    let words: Vec<&str> = c
        .profile
        .command
        .iter()
        .map(|w| w.to_str().unwrap())
        .collect();
    assert_eq!(words, ["sh", "-c", "a | b", "--pid", "1"]);
    assert_eq!(c.profile.interval(), 0.0);
    let c = parse(&["-o", "run.json", "--", "npm", "test"]).unwrap();
    assert_eq!(c.profile.interval(), Config::INTERVAL_S);
    let c = parse(&["-i", "2", "--", "npm", "test"]).unwrap();
    assert_eq!(c.profile.interval(), 2.0);
    // Words that look like subcommands are the command's.
    let c = parse(&["--", "agent", "--listen", "x"]).unwrap();
    assert!(c.command.is_none() && c.profile.command.len() == 3);
    for args in [
        &["-p", "4194312", "--", "true"][..],
        &["--comm", "x", "--children", "--", "true"],
    ] {
        let e = parse(args).unwrap_err();
        assert_eq!(
            e.kind(),
            clap::error::ErrorKind::ArgumentConflict,
            "{args:?}"
        );
    }
    assert!(parse(&["--"]).unwrap().profile.command.is_empty());
    let c = parse(&["--fail-above", "2.5%", "--", "true"]).unwrap();
    assert_eq!(c.profile.fail_above, Some(2.5));
    assert_eq!(
        parse(&["--fail-above", "0"]).unwrap().profile.fail_above,
        Some(0.0)
    );
    for bad in ["-1", "101", "x"] {
        let e = parse(&[&format!("--fail-above={bad}")]).unwrap_err();
        assert!(
            one_line(&e).contains("is not a percentage from 0 to 100"),
            "{bad}"
        );
    }
}
