//! Where a process's perf map is, and when the process started: node writes
//! `/tmp/perf-PID.map` with the pid its own pid namespace sees, in its own root (a
//! container's /tmp), and a file older than the process is an earlier process's.

use std::{
    fs,
    path::{Path, PathBuf},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use crate::vocab::ids;

/// What `/proc/PID/status` says of a process's perf map, read once: who may own it (its
/// effective uid) and the pid it is named by (the one its own pid namespace sees).
pub(super) struct Whose {
    pub euid: u32,
    pub inner_pid: u32,
}

pub(super) fn whose(pid: u32) -> Option<Whose> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let euid = crate::registry::untrusted::euid_in(&status)?;
    let line = status.lines().find(|l| l.starts_with("NSpid:"));
    let inner_pid = line
        .and_then(|l| l.split_whitespace().last()?.parse().ok())
        .unwrap_or(pid);
    Some(Whose { euid, inner_pid })
}

/// When `pid` started, as wall-clock time (boot time plus its start in clock ticks).
fn started_at(pid: u32) -> Option<SystemTime> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let ticks = ids::stat_start_ticks(&stat)?;
    let btime: u64 = fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())?;
    let since_boot = Duration::from_secs_f64(ticks as f64 / ids::clock_ticks() as f64);
    Some(UNIX_EPOCH + Duration::from_secs(btime) + since_boot)
}

/// Where the perf map of `pid` (`inner` in its own pid namespace) may be: through its root
/// while it lives, else this host's /tmp. A process in our own root writes the host's file:
/// that one is named, as it stays readable after the process exits (its /proc/PID/root does
/// not).
pub(super) fn candidates(pid: u32, inner: u32) -> Vec<PathBuf> {
    let through_root = PathBuf::from(format!("/proc/{pid}/root/tmp/perf-{inner}.map"));
    let host = PathBuf::from(format!("/tmp/perf-{pid}.map"));
    let same_root = fs::read_link(format!("/proc/{pid}/root")).is_ok_and(|r| r == Path::new("/"))
        && inner == pid;
    if same_root {
        vec![host]
    } else {
        vec![through_root, host]
    }
}

/// Whether a file last written at `mtime` (seconds since the epoch) was written before process
/// `pid` started: then it is an earlier process's with the same pid (node leaves its map
/// behind). A second of slack: start times have clock-tick resolution.
pub(super) fn predates(pid: u32, mtime: i64) -> bool {
    started_at(pid).is_some_and(|start| {
        u64::try_from(mtime).is_ok_and(|mtime| UNIX_EPOCH + Duration::from_secs(mtime + 1) < start)
    })
}
