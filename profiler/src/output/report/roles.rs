//! A process's acquisitions by the role of the threads that made them: writes and reads and
//! their wait, the view the text's and the page's role tables share.

use super::ProcessReport;
use crate::registry::roles::Role;

/// One role's threads of a process, added up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoleTotals {
    pub role: Role,
    pub threads: u64,
    pub writes: u64,
    pub write_wait_ns: u64,
    pub reads: u64,
    pub read_wait_ns: u64,
}

impl RoleTotals {
    /// Wait, write and read.
    pub fn wait_ns(&self) -> u64 {
        self.write_wait_ns + self.read_wait_ns
    }
}

/// The roles of a process's threads that took its lock (the profiler's too: its reads are
/// its own, its writes the process's teardown), the longest wait (write and read) first,
/// then the most writes.
pub fn role_totals(p: &ProcessReport) -> Vec<RoleTotals> {
    let mut roles: Vec<RoleTotals> = Vec::new();
    let mut add = |role: Role, threads: u64, lock: &super::LockReport| {
        let i = match roles.iter().position(|r| r.role == role) {
            Some(i) => i,
            None => {
                roles.push(RoleTotals {
                    role,
                    threads: 0,
                    writes: 0,
                    write_wait_ns: 0,
                    reads: 0,
                    read_wait_ns: 0,
                });
                roles.len() - 1
            }
        };
        let r = &mut roles[i];
        r.threads += threads;
        r.writes += lock.write.count;
        r.write_wait_ns += lock.write.wait_ns.sum;
        r.reads += lock.read.count;
        r.read_wait_ns += lock.read.wait_ns.sum;
    };
    for (t, n) in p.thread_rows() {
        add(t.role, n, &t.lock);
    }
    roles.retain(|r| r.writes + r.reads > 0);
    roles.sort_by(|a, b| (b.wait_ns(), b.writes, a.role).cmp(&(a.wait_ns(), a.writes, b.role)));
    roles
}
