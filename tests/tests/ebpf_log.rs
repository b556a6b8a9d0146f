//! ROOT-ONLY: the eBPF programs' rare diagnostics (aya-log, `--log-level`), against a
//! workload that triggers two of them for certain: a shell that execs `/bin/true` once asked.
//! The exec takes the new address space's lock for write in execve (syscall 59), a syscall of
//! no known cause; and with `--max-threads 1` (4 stats entries) the process's kinds of
//! acquisition (reads, the exec, the loader's mmap and mprotect, the exit: 5 or more) fill the
//! map, a loss (`lost.map_full`). Each diagnostic is said once, and only when asked for;
//! otherwise the verifier removes the log calls.

use std::process::{Command, Stdio};

use integration_tests::{Finished, Profiler, Workload, profiler_bin, require_root_and_tracepoints};

/// Profiles the shell's exec with `args` added, `RUST_LOG` unset; returns what was said.
fn profile_exec(args: &[&str]) -> (u32, Finished) {
    let mut w = Workload::spawn({
        let mut c = Command::new("/bin/sh");
        c.args(["-c", "echo ready; read go; exec /bin/true"]);
        c
    });
    let pid = w.pid.to_string();
    let mut cmd = Command::new(profiler_bin());
    cmd.args([
        "-f",
        "json",
        "-i",
        "0",
        "--max-threads",
        "1",
        "--bpf-stats",
        "--pid",
        &pid,
    ])
    .args(args)
    .env_remove("RUST_LOG")
    .stdin(Stdio::null());
    let prof = Profiler::start_command(cmd);
    w.go();
    assert!(w.wait().success());
    let out = prof.finish();
    assert!(out.status.success(), "{:?}: {}", out.status, out.stderr);
    let lost = out.summary()["lost"]["map_full"].as_u64().unwrap();
    assert!(
        lost > 0,
        "the map did not fill up: {}",
        out.summary()["lost"]
    );
    (w.pid, out)
}

/// Instructions the verifier processed, over all programs (`--bpf-stats`' load report).
fn verified(out: &Finished) -> u64 {
    let programs = out.summary()["overhead"]["load"]["programs"]
        .as_array()
        .unwrap();
    programs
        .iter()
        .map(|p| p["verified_insns"].as_u64().unwrap())
        .sum()
}

/// The programs' lines on stderr (their target).
fn ebpf_lines(out: &Finished) -> Vec<&str> {
    out.stderr
        .lines()
        .filter(|l| l.contains("mmaplock_prof::ebpf"))
        .collect()
}

#[test]
fn ebpf_diagnostics_are_said_once_and_only_when_asked() {
    if !require_root_and_tracepoints() {
        return;
    }
    let (pid, out) = profile_exec(&["--log-level", "debug"]);
    let said = ebpf_lines(&out);
    eprintln!("{}", said.join("\n"));
    let exec: Vec<&&str> = said
        .iter()
        .filter(|l| l.contains("a write lock in syscall 59,"))
        .collect();
    assert_eq!(exec.len(), 1, "{said:#?}");
    // Seen in the exec'ing process itself (a single-threaded exec keeps its pid).
    assert!(
        exec[0].contains(&format!("(in task {pid} of process {pid})")),
        "{exec:?}"
    );
    let map_full: Vec<&&str> = said
        .iter()
        .filter(|l| l.contains("lost.map_full"))
        .collect();
    assert_eq!(map_full.len(), 1, "{said:#?}");
    assert!(map_full[0].contains("WARN"), "{map_full:?}");

    // Not asked: the same losses, nothing from the programs; and nothing to say it with: the
    // verifier knew the log calls off, so it did not even walk them.
    let (_, quiet) = profile_exec(&[]);
    assert_eq!(ebpf_lines(&quiet), Vec::<&str>::new(), "{}", quiet.stderr);
    let (on, off) = (verified(&out), verified(&quiet));
    eprintln!("instructions verified: {on} with the diagnostics, {off} without");
    assert!(off < on, "{off} instructions verified without, {on} with");
}
