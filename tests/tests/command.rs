//! ROOT-ONLY: `mmaplock-prof [OPTIONS] -- COMMAND [ARGS...]`. The command and every process it
//! starts are profiled from their first instruction (ground-truth helpers doing exact
//! numbers of syscalls, started by a shell, in a pipeline); under sudo (`SUDO_UID`,
//! `SUDO_GID`) it runs as that user, never as root; signals sent to the profiler reach it;
//! the profiler exits with its status; `--fail-above` exits 3 on one side of the threshold
//! and 0 on the other; the reports go where the options say, the command's output staying
//! its own.

use std::{
    os::unix::{fs::MetadataExt, process::CommandExt},
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::Duration,
};

use integration_tests::{
    bpf_test, cause_counts, lock_ops_bin, profiler_bin, read_lines, skip_because, target_dir,
    wait_until,
};
use serde_json::Value;

/// `mmaplock-prof ARGS`, in a process group of its own (a command's `kill 0` stays in it),
/// standard input closed; runs to its end.
fn profiler(args: &[&str]) -> Command {
    let mut c = Command::new(profiler_bin());
    c.args(args).stdin(Stdio::null()).process_group(0);
    c
}

fn run(mut c: Command) -> Output {
    c.output().expect("run mmaplock-prof")
}

fn said(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The summary in `-o FILE`: its last line.
fn summary(file: &Path) -> Value {
    let s = read_lines(file).pop().expect("a summary line");
    assert_eq!(s["type"], "summary");
    s
}

fn processes(s: &Value) -> &[Value] {
    s["processes"].as_array().map_or(&[], Vec::as_slice)
}

fn writes_of(p: &Value, cause: &str) -> u64 {
    cause_counts(p).get(cause).copied().unwrap_or(0)
}

/// The helper `lock-ops`'s processes in a summary, by their `mmap` writes.
fn helpers(s: &Value) -> Vec<&Value> {
    processes(s)
        .iter()
        .filter(|p| p["comm"] == "lock-ops")
        .collect()
}

/// Ground truth: a shell runs `lock-ops` twice, one in the background and one at the head of
/// a pipeline into `cat`. Each helper's writes are all counted under its own pid, with its
/// exec and its dynamic loader's start-up (it was selected before its first instruction);
/// the shell is the command, every other process its descendant.
#[test]
fn the_command_and_its_descendants_are_counted_from_their_first_instruction() {
    let Some(dir) = bpf_test() else { return };
    let out = dir.path().join("run.json");
    let ops = lock_ops_bin();
    let script = format!(
        "{ops} 300 200 7 0 0 </dev/null >/dev/null & {ops} 100 100 0 5 0 </dev/null | cat >/dev/null; wait",
        ops = ops.display()
    );
    let o = run(profiler(&[
        "-q",
        "-o",
        out.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        &script,
    ]));
    assert_eq!(o.status.code(), Some(0), "{}", said(&o));
    let s = summary(&out);
    assert_eq!(s["lost"]["events"], 0, "{}", s["lost"]);
    let sh: Vec<&Value> = processes(&s).iter().filter(|p| p["comm"] == "sh").collect();
    assert_eq!(sh.len(), 1, "{:?}", processes(&s));
    assert_eq!(
        sh[0]["selected_by"]["how"], "command",
        "{}",
        sh[0]["selected_by"]
    );
    let mut hs = helpers(&s);
    hs.sort_by_key(|p| writes_of(p, "mmap"));
    assert_eq!(hs.len(), 2, "{:?}", processes(&s));
    for (p, (mmaps, munmaps, mprotects, madvises)) in
        hs.iter().zip([(100, 100, 0, 5), (300, 200, 7, 0)])
    {
        let c = cause_counts(p);
        let of = |k: &str| c.get(k).copied().unwrap_or(0);
        assert_eq!(p["selected_by"]["how"], "fork", "{}", p["selected_by"]);
        // Its work, plus the dynamic loader's mappings of its start-up (a few dozen).
        assert!((mmaps + 1..=mmaps + 64).contains(&of("mmap")), "{c:?}");
        assert!((munmaps..=munmaps + 16).contains(&of("munmap")), "{c:?}");
        assert!(
            (mprotects + 1..=mprotects + 32).contains(&of("mprotect")),
            "{c:?}"
        );
        assert!((madvises..=madvises + 4).contains(&of("madvise")), "{c:?}");
        // The exec itself (its new image's setup, in execve) and the loader's heap: only a
        // process selected before its first instruction has them.
        assert!(of("other") > 0 && of("brk") > 0, "{c:?}");
        // Its main thread is named after its image, not its parent's.
        let main = p["threads"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["tid"] == p["pid"])
            .unwrap();
        assert_eq!(main["comm"], "lock-ops", "{main}");
    }
    let cat: Vec<&Value> = processes(&s)
        .iter()
        .filter(|p| p["comm"] == "cat")
        .collect();
    assert_eq!(cat.len(), 1, "the pipeline's tail");
    assert_eq!(cat[0]["selected_by"]["how"], "fork");
}

/// `id`'s answers and `$HOME` as the command saw them, and the owner of a file it made.
fn as_seen(dir: &Path, env: &[(&str, &str)]) -> (Vec<String>, u32) {
    let out = dir.join("run.json");
    let made = dir.join("made");
    let _ = std::fs::remove_file(&made);
    let script = format!(
        "id -u; id -g; id -G; echo \"$HOME\"; echo \"$USER\"; touch {}",
        made.display()
    );
    let mut c = profiler(&["-q", "-o", out.to_str().unwrap(), "--", "sh", "-c", &script]);
    c.env_remove("SUDO_USER");
    c.envs(env.iter().copied());
    let o = run(c);
    assert_eq!(o.status.code(), Some(0), "{}", said(&o));
    // The profiler's reports are in the file; its standard output is the command's.
    let lines = String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    let s = summary(&out);
    assert!(
        processes(&s).iter().any(|p| p["comm"] == "id"),
        "the command's children are profiled"
    );
    (lines, std::fs::metadata(&made).unwrap().uid())
}

/// Under sudo the command is the user's: ids no account has run with their group alone, in
/// the environment sudo passed.
#[test]
fn under_sudo_the_command_runs_as_the_user_not_root() {
    let Some(dir) = bpf_test() else { return };
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let env = [
        ("SUDO_UID", "54321"),
        ("SUDO_GID", "54322"),
        ("SUDO_USER", "mlp-no-such-user"),
        ("HOME", "/root"),
        ("USER", "root"),
    ];
    let (lines, owner) = as_seen(dir.path(), &env);
    assert_eq!(
        lines,
        ["54321", "54322", "54322", "/root", "root"],
        "{lines:?}"
    );
    assert_eq!(owner, 54321);
    // Not under sudo: as the profiler (root).
    let (lines, owner) = as_seen(dir.path(), &[]);
    assert_eq!((lines[0].as_str(), owner), ("0", 0));
}

/// A user and a group of this test's own, removed on drop.
struct Account {
    name: String,
    group: String,
}

impl Drop for Account {
    fn drop(&mut self) {
        let _ = Command::new("userdel").arg(&self.name).status();
        let _ = Command::new("groupdel").arg(&self.group).status();
    }
}

/// With an account (made by the test with useradd), the command has its supplementary groups,
/// and its `HOME` and `USER` where sudo pointed them at root's.
#[test]
fn a_sudo_account_runs_with_its_groups_and_home() {
    let Some(dir) = bpf_test() else { return };
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let tag = std::process::id();
    let (name, group) = (format!("mlpc{tag}"), format!("mlpg{tag}"));
    let home = dir.path().join("home");
    let ok = |c: &mut Command| c.status().is_ok_and(|s| s.success());
    if !ok(Command::new("groupadd").arg(&group)) {
        skip_because("groupadd could not make a group");
        return;
    }
    let made = ok(Command::new("useradd")
        .args(["-M", "-d"])
        .arg(&home)
        .args(["-G", &group, &name]));
    let account = Account {
        name: name.clone(),
        group: group.clone(),
    };
    if !made {
        skip_because("useradd could not make a user");
        return;
    }
    let id = |flag: &str, who: &str| {
        let o = Command::new("id").args([flag, who]).output().unwrap();
        String::from_utf8(o.stdout).unwrap().trim().to_string()
    };
    let (uid, gid) = (id("-u", &name), id("-g", &name));
    let extra = Command::new("getent")
        .args(["group", &group])
        .output()
        .unwrap();
    let extra_gid = String::from_utf8(extra.stdout)
        .unwrap()
        .split(':')
        .nth(2)
        .unwrap()
        .to_string();
    let env = [
        ("SUDO_UID", uid.as_str()),
        ("SUDO_GID", gid.as_str()),
        ("SUDO_USER", name.as_str()),
        ("HOME", "/root"),
        ("USER", "root"),
    ];
    let (lines, owner) = as_seen(dir.path(), &env);
    assert_eq!(lines[0], uid);
    assert_eq!(lines[1], gid);
    let groups: Vec<&str> = lines[2].split(' ').collect();
    assert!(
        groups.contains(&extra_gid.as_str()) && groups.contains(&gid.as_str()),
        "{lines:?}"
    );
    assert_eq!(lines[3], home.display().to_string());
    assert_eq!(lines[4], name);
    assert_eq!(owner.to_string(), uid);
    drop(account);
}

/// The profiler started on `script` (sh -c), once it has attached and the script says it is
/// ready (it writes `ready`). The signals sent here start at their default action in the
/// profiler, and so in the command: an ignored signal stays ignored across exec, and the
/// suite may run under `nohup` (SIGHUP ignored) or a shell that ignores SIGINT and SIGQUIT.
fn started(dir: &Path, script: &str) -> (std::process::Child, PathBuf) {
    let out = dir.join("sig.json");
    let ready = dir.join("ready");
    let _ = std::fs::remove_file(&ready);
    let script = script.replace("READY", &ready.display().to_string());
    let mut cmd = profiler(&["-q", "-o", out.to_str().unwrap(), "--", "sh", "-c", &script]);
    // SAFETY: between fork and exec only async-signal-safe calls (signal) are made.
    unsafe {
        cmd.pre_exec(|| {
            for sig in [libc::SIGHUP, libc::SIGINT, libc::SIGQUIT, libc::SIGTERM] {
                libc::signal(sig, libc::SIG_DFL);
            }
            Ok(())
        });
    }
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(50),
        || match ready.exists() {
            true => Ok(()),
            false => Err("the command is not ready".to_string()),
        },
    );
    (child, out)
}

/// Signals sent to the profiler reach the command, which handles them or dies of them; the
/// profiler goes on until it exits, writes its summary whole, and exits with its status
/// (128 plus the signal when it killed it). What the command sends its process group is not
/// sent back to it.
#[test]
fn signals_reach_the_command_and_its_status_is_the_profilers() {
    let Some(dir) = bpf_test() else { return };
    let said = dir.path().join("said");
    let traps = format!(
        "trap 'echo INT >> {s}; exit 5' INT; trap 'echo TERM >> {s}; exit 6' TERM; trap 'echo QUIT >> {s}; exit 7' QUIT; trap 'echo USR1 >> {s}' USR1; kill -USR1 0; echo ready > READY; while :; do sleep 0.05; done",
        s = said.display()
    );
    for (sig, name, code) in [
        (libc::SIGINT, "INT", 5),
        (libc::SIGTERM, "TERM", 6),
        (libc::SIGQUIT, "QUIT", 7),
    ] {
        let _ = std::fs::remove_file(&said);
        let (child, out) = started(dir.path(), &traps);
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, sig) };
        let o = child.wait_with_output().unwrap();
        assert_eq!(
            o.status.code(),
            Some(code),
            "{name}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let heard = std::fs::read_to_string(&said).unwrap();
        // Its own `kill -USR1 0` reached it once (directly), not a second time through the
        // profiler; the profiler's signal once.
        assert_eq!(heard, format!("USR1\n{name}\n"), "{name}");
        let s = summary(&out);
        assert!(
            processes(&s).iter().any(|p| p["comm"] == "sh"),
            "{name}: a complete summary"
        );
    }
    // A command without handlers dies of the signal: 128 + its number.
    for (sig, code) in [
        (libc::SIGTERM, 143),
        (libc::SIGHUP, 129),
        (libc::SIGINT, 130),
    ] {
        let (child, out) = started(dir.path(), "echo ready > READY; exec sleep 600");
        // SAFETY: as above.
        unsafe { libc::kill(child.id() as i32, sig) };
        let o = child.wait_with_output().unwrap();
        assert_eq!(
            o.status.code(),
            Some(code),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let s = summary(&out);
        assert!(
            processes(&s).iter().any(|p| p["comm"] == "sleep"),
            "a complete summary"
        );
    }
}

#[test]
fn the_exit_status_is_the_commands() {
    let Some(dir) = bpf_test() else { return };
    let out = dir.path().join("run.json");
    let o = run(profiler(&[
        "-q",
        "-o",
        out.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        "exit 7",
    ]));
    assert_eq!(o.status.code(), Some(7), "{}", said(&o));
    assert_eq!(summary(&out)["processes"][0]["comm"], "sh");
    // Not found: 127; found but not executable: 126; one line each, nothing on stdout.
    let o = run(profiler(&["--", "mlp-no-such-command"]));
    assert_eq!(o.status.code(), Some(127));
    assert_eq!(
        said(&o).trim(),
        "mmaplock-prof: mlp-no-such-command: command not found"
    );
    assert!(o.stdout.is_empty());
    let script = dir.path().join("not-executable");
    std::fs::write(&script, "#!/bin/sh\n").unwrap();
    let o = run(profiler(&["--", script.to_str().unwrap()]));
    assert_eq!(o.status.code(), Some(126));
    assert!(
        said(&o).trim().lines().count() == 1 && said(&o).contains("Permission denied"),
        "{}",
        said(&o)
    );
    // A command beside --pid is bad usage.
    let o = run(profiler(&["-p", "1", "--", "true"]));
    assert_eq!(o.status.code(), Some(2), "{}", said(&o));
}

/// The pooled share of a summary, as `--fail-above` judges it.
fn pooled(s: &Value) -> f64 {
    let (mut w, mut a) = (0u64, 0u64);
    for p in processes(s) {
        w += p["time_share"]["wait_ns"].as_u64().unwrap_or(0);
        a += p["time_share"]["alive_ns"].as_u64().unwrap_or(0);
    }
    w as f64 / a as f64
}

/// `time-share MODE SECS` under `--fail-above PCT` (and `extra`): the exit status, the
/// pooled share of the summary, what the profiler said and what the helper measured.
fn judged(dir: &Path, mode: &str, pct: &str, extra: &[&str]) -> (i32, f64, String, Value) {
    let out = dir.join("fa.json");
    let helper = target_dir().join("time-share");
    let mut args = vec!["-o", out.to_str().unwrap(), "--fail-above", pct];
    args.extend_from_slice(extra);
    args.extend(["--", helper.to_str().unwrap(), mode, "1.5"]);
    let o = run(profiler(&args));
    let s = summary(&out);
    let measured: Value = String::from_utf8(o.stdout.clone())
        .unwrap()
        .lines()
        .find(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .expect("the helper's measurement");
    (o.status.code().unwrap(), pooled(&s), said(&o), measured)
}

/// `--fail-above` on both sides of its threshold, on workloads whose waits are known: a
/// thread that waits behind another's long mprotects half of its life (its own clock says
/// so) is over 5% in both modes, and within 90% (no thread waits longer than it lives, and
/// the main thread does not wait); a spinning thread is within 1%.
#[test]
fn fail_above_judges_the_pooled_share_on_both_sides() {
    let Some(dir) = bpf_test() else { return };
    let (code, share, said, measured) = judged(dir.path(), "wait", "5", &[]);
    // The helper's own measure: its waiter's calls (nearly all waiting) against its life.
    let waiter = measured["waiter_call_ns"].as_f64().unwrap()
        / measured["waiter_alive_ns"].as_f64().unwrap();
    assert!(
        waiter > 0.3,
        "the workload waited {waiter} of its waiter's life: {measured}"
    );
    assert_eq!(code, 3, "{share} over 5%: {said}");
    assert!(share > 0.05, "{share}");
    assert!(
        said.contains("over --fail-above 5%") && said.contains("(exit status 3)"),
        "{said}"
    );
    let stated = format!("waited {}", fmt_pct(share));
    assert!(said.contains(&stated), "{stated} in {said}");
    let (code, share, said, _) = judged(dir.path(), "wait", "90", &["-q"]);
    assert_eq!(code, 0, "{share} within 90%: {said}");
    assert!(
        !said.contains("fail-above"),
        "-q: nothing said within the threshold: {said}"
    );
    let (code, share, said, _) = judged(dir.path(), "wait", "5", &["--mode", "contention"]);
    assert_eq!(code, 3, "contention mode, {share}: {said}");
    let (code, share, said, _) = judged(dir.path(), "spin", "1", &[]);
    assert_eq!(code, 0, "{share} within 1%: {said}");
    assert!(
        share < 0.01 && said.contains("within --fail-above 1%"),
        "{said}"
    );
}

/// The share as the profiler says it (fmt_share: one decimal from 0.1%).
fn fmt_pct(x: f64) -> String {
    let pct = x * 100.0;
    if pct >= 0.1 {
        format!("{pct:.1}%")
    } else {
        format!("{pct:.2}%")
    }
}

/// Without `-o`, the summary goes to standard error (here text, as asked), the command's
/// output alone to standard output; the page and the profile are written.
#[test]
fn without_output_the_summary_goes_to_standard_error() {
    let Some(dir) = bpf_test() else { return };
    let (html, pprof) = (dir.path().join("run.html"), dir.path().join("run.pb.gz"));
    let o = run(profiler(&[
        "-f",
        "text",
        "--html",
        html.to_str().unwrap(),
        "--pprof",
        pprof.to_str().unwrap(),
        "--stack-sample",
        "1",
        "--",
        lock_ops_bin().to_str().unwrap(),
        "50",
        "50",
        "0",
        "0",
        "0",
    ]));
    assert_eq!(o.status.code(), Some(0), "{}", said(&o));
    let stdout = String::from_utf8(o.stdout.clone()).unwrap();
    assert!(
        stdout.starts_with("ready ") && stdout.lines().count() == 1,
        "{stdout}"
    );
    let err = said(&o);
    assert!(err.contains("═══ mmaplock-prof summary"), "{err}");
    assert!(err.contains("the command run by the profiler"), "{err}");
    assert!(std::fs::metadata(&html).unwrap().len() > 0);
    assert!(std::fs::metadata(&pprof).unwrap().len() > 0);
}

/// The test files' (pid, threadId) as they recorded them.
fn recorded(path: &Path) -> Vec<(u64, u64)> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            let (p, t) = l.split_once(' ').unwrap();
            (p.parse().unwrap(), t.parse().unwrap())
        })
        .collect()
}

/// A real runner as users run it: `npm test` (Vitest's forks pool: a child process per test
/// file) and `npx vitest run` (its threads pool: Workers in the runner's process), each under
/// `mmaplock-prof -- ...`: every process that ran a test file is in the summary, forked from
/// the command, and the Workers are counted.
#[test]
fn npm_test_and_npx_vitest_run_under_the_profiler() {
    let Some(dir) = bpf_test() else { return };
    let Some(mjs) = integration_tests::vitest::installed() else {
        return;
    };
    let d = dir.path();
    integration_tests::vitest::write_suite(d);
    // The installed runner where npx looks for it.
    let modules = mjs.ancestors().nth(2).unwrap();
    std::os::unix::fs::symlink(modules, d.join("node_modules")).unwrap();
    let package = serde_json::json!({
        "name": "mlp-command-test",
        "private": true,
        "scripts": {"test": "vitest run --pool=forks --config vitest.config.mjs"}
    });
    std::fs::write(d.join("package.json"), package.to_string()).unwrap();
    for (pool, words) in [
        ("forks", vec!["npm", "test"]),
        (
            "threads",
            vec![
                "npx",
                "vitest",
                "run",
                "--pool=threads",
                "--config",
                "vitest.config.mjs",
            ],
        ),
    ] {
        let out = d.join(format!("{pool}.json"));
        let record = d.join(format!("{pool}.files"));
        let mut args = vec!["-q", "--all-processes", "-o", out.to_str().unwrap(), "--"];
        args.extend(words.iter().copied());
        let mut c = profiler(&args);
        c.current_dir(d)
            .env("MLP_RECORD", &record)
            .env("MLP_DATA", d.join("data.bin"))
            .env("npm_config_update_notifier", "false")
            .env("npm_config_offline", "true");
        let o = run(c);
        assert_eq!(
            o.status.code(),
            Some(0),
            "{pool}: {}\n{}",
            said(&o),
            String::from_utf8_lossy(&o.stdout)
        );
        let s = summary(&out);
        let files = recorded(&record);
        assert_eq!(
            files.len(),
            integration_tests::vitest::FILES,
            "{pool}: {files:?}"
        );
        let command: Vec<&Value> = processes(&s)
            .iter()
            .filter(|p| p["selected_by"]["how"] == "command")
            .collect();
        assert_eq!(command.len(), 1, "{pool}: one command");
        for (pid, thread) in &files {
            let p = processes(&s)
                .iter()
                .find(|p| p["pid"] == *pid)
                .unwrap_or_else(|| {
                    panic!("{pool}: the process {pid} of a test file is in the summary")
                });
            assert_eq!(
                p["selected_by"]["how"], "fork",
                "{pool}: {}",
                p["selected_by"]
            );
            if pool == "threads" {
                assert!(*thread > 0, "{pool}: ran in a Worker");
                let workers = p["threads"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|t| t["role"] == "worker")
                    .count();
                assert!(workers > 0, "{pool}: the runner's Workers are counted");
            }
        }
        eprintln!(
            "{pool}: {} processes, the command {} ({})",
            processes(&s).len(),
            command[0]["comm"],
            command[0]["pid"]
        );
    }
}
