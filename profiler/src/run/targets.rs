//! The one-shot's targets: the `--pid` processes, watched through pidfds, and the processes
//! the kernel's selection starts with (`--comm`, `--children`).

use std::{
    collections::HashSet,
    io::{self},
    os::fd::{FromRawFd, OwnedFd},
};

use tokio::io::{Interest, unix::AsyncFd};

use crate::{
    kernel::{
        collector::{Collector, CollectorConfig, CollectorError},
        selection::Pick,
        selectors::{KernelSelectors, comm_key, exec_name},
    },
    run::SessionError,
    vocab::ids::{self, ProcId},
};

/// Waits for processes to exit through pidfds (no polling, no pid-reuse race).
pub struct Targets {
    fds: Vec<AsyncFd<OwnedFd>>,
}

impl Targets {
    /// Opens every pid; a pid that does not exist is a usage error.
    pub fn open(pids: &[u32]) -> Result<Self, SessionError> {
        let mut fds = Vec::new();
        for &pid in pids {
            // SAFETY: plain syscall; the returned fd is owned by us from here on.
            let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
            if fd < 0 {
                let e = io::Error::last_os_error();
                return Err(if e.raw_os_error() == Some(libc::ESRCH) {
                    SessionError::NoSuchPid(pid)
                } else {
                    SessionError::Watch(pid, e)
                });
            }
            let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
            // SAFETY: the OwnedFd stays open, and the same fd, for the AsyncFd's lifetime.
            let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
                .map_err(|e| SessionError::Watch(pid, io::Error::other(e.to_string())))?;
            fds.push(fd);
        }
        Ok(Targets { fds })
    }

    /// Resolves once every target has exited; never if there are none.
    pub async fn all_exited(&self) {
        if self.fds.is_empty() {
            return std::future::pending().await;
        }
        for fd in &self.fds {
            // A pidfd becomes readable when its process exits.
            let _ = fd.readable().await;
        }
    }
}

/// When the kernel's selection decides (`--comm`, `--children`): gives the kernel the
/// `--comm` names, matched at every exec and rename from now on, then puts in the processes
/// already running: the `--pid` targets, the processes running under one of the names, and
/// with `--children` the targets' descendants. Before "attached" is said: a process started
/// after it is selected from its first instruction.
pub fn select_at_start(
    collector: &mut Collector,
    cfg: &CollectorConfig,
) -> Result<(), SessionError> {
    if cfg.comms.is_empty() && !cfg.children {
        return Ok(());
    }
    let comms = cfg
        .comms
        .iter()
        .map(|c| comm_key(c).ok_or_else(|| CollectorError::CommTooLong(c.clone())))
        .collect::<Result<_, _>>()?;
    collector.set_selectors(&KernelSelectors {
        comms,
        ..KernelSelectors::default()
    })?;
    let mut picks: Vec<Pick> = (cfg.pids.iter())
        .filter_map(|&pid| ProcId::of_live(pid))
        .map(|p| Pick::pid(p.pid, p.start))
        .collect();
    if !cfg.comms.is_empty() {
        // Not those the kernel selected meanwhile (at exec, say): it knows how it did.
        let known: HashSet<(u32, u64)> = collector.selected().into_iter().collect();
        picks.extend(
            running_named(&cfg.comms)
                .into_iter()
                .filter(|p| !known.contains(&(p.pid, p.ticks))),
        );
    }
    collector.update_selection(&picks, &[])?;
    if cfg.children {
        // From now on the kernel follows the forks of every selected process, so a scan that
        // finds no one new has found them all.
        for _ in 0..64 {
            let selected: Vec<u32> = collector.selected().iter().map(|&(pid, _)| pid).collect();
            let new: Vec<Pick> = ids::descendants(&selected)
                .into_iter()
                .filter(|d| !selected.contains(&d.pid))
                .map(|d| Pick::pid(d.pid, d.start))
                .collect();
            if new.is_empty() {
                break;
            }
            collector.update_selection(&new, &[])?;
        }
    }
    Ok(())
}

/// The processes running now under one of `names` (selected by the name's rule, the name's
/// number + 1 said).
fn running_named(names: &[String]) -> Vec<Pick> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let (Some(comm), Some(start)) = (stat_comm(&stat), ids::stat_start_ticks(&stat)) else {
            continue;
        };
        // The executable is read only for a process whose name is not one of them (a
        // kernel thread has none).
        let exe = || {
            std::fs::read_link(format!("/proc/{pid}/exe"))
                .ok()
                .map(|p| p.to_string_lossy().into_owned())
        };
        if let Some(i) = name_matched(names, comm, exe) {
            out.push(Pick::rule(pid, start, i as u8 + 1));
        }
    }
    out
}

/// Field 2 of a `/proc/PID/stat` line: the command name, between the first '(' and the last
/// ')' (it may hold either).
fn stat_comm(stat: &str) -> Option<&str> {
    stat.get(stat.find('(')? + 1..stat.rfind(')')?)
}

/// Which of `names` a running process matches: its name now, or else the name its exec gave
/// it (`exec_name`): a process that renamed itself (Node's `process.title`) before the run
/// began is still the `node` it was exec'd as.
fn name_matched(
    names: &[String],
    comm: &str,
    exe: impl FnOnce() -> Option<String>,
) -> Option<usize> {
    if let Some(i) = names.iter().position(|n| n == comm) {
        return Some(i);
    }
    let exe = exe()?;
    let name = exec_name(&exe);
    names.iter().position(|n| n.as_bytes() == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_process_matches_by_its_name_or_its_executables() {
        let names = ["node".to_string(), "api".into(), "a-long-exe-name".into()];
        let none =
            || -> Option<String> { panic!("the executable is not read when the name matches") };
        assert_eq!(name_matched(&names, "api", none), Some(1));
        // Renamed before the run began: its executable says what it was exec'd as.
        let node = || Some("/usr/local/bin/node".to_string());
        assert_eq!(name_matched(&names, "node (vitest)", node), Some(0));
        let deleted = || Some("/usr/bin/node (deleted)".to_string());
        assert_eq!(name_matched(&names, "myapp", deleted), Some(0));
        // A name is 15 bytes: an executable's longer name is cut as exec cuts it.
        let long = || Some("/opt/a-long-exe-name-indeed".to_string());
        assert_eq!(name_matched(&names, "x", long), Some(2));
        assert_eq!(
            name_matched(&names, "bash", || Some("/bin/bash".into())),
            None
        );
        // A kernel thread has no executable.
        assert_eq!(name_matched(&names, "kworker/0:1", || None), None);
    }

    #[test]
    fn the_name_is_read_between_the_parentheses() {
        let stat = "42 (node (vitest) x) S 1 42 42 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 777 0";
        assert_eq!(stat_comm(stat), Some("node (vitest) x"));
        assert_eq!(ids::stat_start_ticks(stat), Some(777));
        assert_eq!(stat_comm("garbage"), None);
    }
}
