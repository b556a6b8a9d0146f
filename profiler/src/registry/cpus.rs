//! The CPUs each process may use: its main thread's affinity mask and its cgroup's CPU quota
//! (cgroup v2 `cpu.max`, the lowest along its path), read while it lives. A finding's
//! throughput or latency weighs the process's CPU time against them (docs/findings.md,
//! "Throughput or latency").

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::{kernel::selectors::cgroup2_mount, vocab::ids::ProcId};

/// The CPUs a process may use.
#[serde_with::skip_serializing_none]
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CpuAllowance {
    /// CPUs in its affinity mask.
    pub affinity: u32,
    /// Its cgroup's CPU quota, in CPUs (the lowest `cpu.max` on its cgroup's path); absent
    /// when unlimited or unknown.
    pub quota: Option<f64>,
}

/// A quota is a finite ratio of two positive integers (never NaN): equality is total.
impl Eq for CpuAllowance {}

impl CpuAllowance {
    /// The CPUs it can use at most.
    pub fn usable(&self) -> f64 {
        let cpus = f64::from(self.affinity);
        self.quota.map_or(cpus, |q| q.min(cpus))
    }
}

#[derive(Default)]
pub struct CpuAllowances {
    by_proc: HashMap<ProcId, CpuAllowance>,
}

impl CpuAllowances {
    /// Reads a process's allowance, if it was not read yet and the process lives.
    pub fn prime(&mut self, p: ProcId) {
        if p.pid == 0 || self.by_proc.contains_key(&p) {
            return;
        }
        if let Some(a) = read(p.pid) {
            self.by_proc.insert(p, a);
        }
    }

    pub fn get(&self, p: ProcId) -> Option<CpuAllowance> {
        self.by_proc.get(&p).copied()
    }

    pub fn forget(&mut self, p: ProcId) {
        self.by_proc.remove(&p);
    }
}

/// A live process's allowance; None if it is gone.
pub fn read(pid: u32) -> Option<CpuAllowance> {
    Some(CpuAllowance {
        affinity: affinity(pid)?,
        quota: quota(pid),
    })
}

/// CPUs in the affinity mask of thread `tid`.
fn affinity(tid: u32) -> Option<u32> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the kernel writes at most its size.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is ours and as large as said.
    let r = unsafe {
        libc::sched_getaffinity(tid as libc::pid_t, size_of::<libc::cpu_set_t>(), &mut set)
    };
    // SAFETY: CPU_COUNT reads the set the kernel filled.
    (r == 0).then(|| unsafe { libc::CPU_COUNT(&set) } as u32)
}

/// The lowest CPU quota on the process's cgroup v2 path, in CPUs.
fn quota(pid: u32) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let path = text
        .lines()
        .find_map(|l| l.strip_prefix("0::"))?
        .to_string();
    let mount = cgroup2_mount()?;
    let mut dir = mount.join(path.trim_start_matches('/'));
    let mut lowest: Option<f64> = None;
    while dir.starts_with(&mount) {
        if let Some(q) = std::fs::read_to_string(dir.join("cpu.max"))
            .ok()
            .and_then(|t| parse_cpu_max(&t))
        {
            lowest = Some(lowest.map_or(q, |l: f64| l.min(q)));
        }
        if !dir.pop() || dir == mount {
            break;
        }
    }
    lowest
}

/// `cpu.max` (`QUOTA PERIOD` in microseconds, or `max PERIOD`): the quota in CPUs.
fn parse_cpu_max(text: &str) -> Option<f64> {
    let mut it = text.split_whitespace();
    let quota: f64 = it.next()?.parse().ok()?;
    let period: f64 = it.next()?.parse().ok()?;
    (period > 0.0).then(|| quota / period)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cgroups_cpu_max_is_its_quota_in_cpus() {
        assert_eq!(parse_cpu_max("150000 100000\n"), Some(1.5));
        assert_eq!(parse_cpu_max("max 100000\n"), None);
        assert_eq!(parse_cpu_max(""), None);
        let a = CpuAllowance {
            affinity: 4,
            quota: Some(1.5),
        };
        assert_eq!(a.usable(), 1.5);
        assert_eq!(CpuAllowance { quota: None, ..a }.usable(), 4.0);
    }

    /// This process's allowance: at least one CPU, at most those online.
    #[test]
    fn this_processs_affinity_is_read() {
        let a = read(std::process::id()).expect("our own process");
        let online = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
        assert!(
            a.affinity >= 1 && a.affinity <= online.max(a.affinity),
            "{a:?}"
        );
    }
}
