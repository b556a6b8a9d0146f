//! Which processes of a summary matter: those that waited materially, listed and looked at
//! by every pattern, and of the others only the few that waited longest (their verdict);
//! the rest are grouped by command (`minor_processes`), so that a run of a thousand
//! short-lived processes reads, and weighs, like a run of a few (docs/findings.md, "What is
//! material").

use std::cmp::Reverse;

use super::{
    patterns::{NOT_A_BOTTLENECK_ROLE_SHARE, NOT_A_BOTTLENECK_SHARE},
    view::wait,
};
use crate::{
    output::report::{self, ProcessReport, Report},
    registry::roles::Role,
};

/// A process waited materially when its wait (write and read) is at least this, and not
/// `not-your-bottleneck`'s small share of its threads' time.
pub const MATERIAL_WAIT_NS: u64 = 10_000_000;
/// That small share: under this of their time alive and of their CPU time (and no role of
/// its own over 2%).
pub const MATERIAL_SHARE: f64 = NOT_A_BOTTLENECK_SHARE;
/// The processes that did not wait materially listed one by one, at most (those that waited
/// longest); the others are grouped.
pub const LISTED_IMMATERIAL: usize = 10;
/// `not-your-bottleneck` is said of at most this many processes of a run (those that waited
/// longest): for the others, the run's line on what it grouped says as much.
pub const VERDICTS: usize = 3;

/// The shares `not-your-bottleneck` reads: the process's threads waited under 1%
/// ([`MATERIAL_SHARE`]) of their time alive and of their CPU time (when known), and no role
/// of its own over 2%.
/// None without a time share (a report of an older build).
pub(super) fn small_share(p: &ProcessReport) -> Option<bool> {
    let share = p.time_share.as_ref()?;
    let cpu_small = share.cpu.is_none_or(|c| c < NOT_A_BOTTLENECK_SHARE);
    let roles_small = p.time_share_by_role.iter().flatten().all(|r| {
        matches!(r.role, Role::Foreign | Role::Profiler)
            || r.share.wall < NOT_A_BOTTLENECK_ROLE_SHARE
    });
    Some(share.wall < NOT_A_BOTTLENECK_SHARE && cpu_small && roles_small)
}

/// Whether the lock cost `p` anything worth a change: its threads waited at least
/// [`MATERIAL_WAIT_NS`] in all and not `not-your-bottleneck`'s small share of their time
/// (without a time share, the wait alone says). Both, so that neither a few microseconds of
/// a short process's life nor a long-running process's thin wait count.
pub fn waited_materially(p: &ProcessReport) -> bool {
    wait(p) >= MATERIAL_WAIT_NS && small_share(p) != Some(true)
}

/// The processes a summary lists, as indices into `processes`, the longest wait first (the
/// findings' order); and whether each process waited materially.
pub struct Listing {
    pub order: Vec<usize>,
    pub material: Vec<bool>,
}

/// Every process that waited materially and the [`LISTED_IMMATERIAL`] others that waited
/// longest. A summary already grouped lists the same again.
pub fn listing(s: &Report) -> Listing {
    let material: Vec<bool> = s.processes.iter().map(waited_materially).collect();
    let mut by_wait: Vec<usize> = (0..s.processes.len()).collect();
    by_wait.sort_by_key(|&i| Reverse(wait(&s.processes[i])));
    let mut others = 0;
    let order = by_wait
        .into_iter()
        .filter(|&i| {
            material[i] || {
                others += 1;
                others <= LISTED_IMMATERIAL
            }
        })
        .collect();
    Listing { order, material }
}

/// Groups the processes the summary does not list into `minor_processes`.
pub fn group_minor(s: &mut Report) {
    let Listing { order, .. } = listing(s);
    let mut listed = vec![false; s.processes.len()];
    for i in order {
        listed[i] = true;
    }
    let mut i = 0;
    report::group(s, |_| {
        i += 1;
        listed[i - 1]
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::fixtures::{process, summary, time_share};

    /// Process `pid` whose threads waited `wait` in `alive` of their time.
    fn waited(pid: u32, wait: u64, alive: u64) -> ProcessReport {
        let mut p = process(pid, "sh", wait - 10, false);
        p.time_share = Some(time_share(wait, alive, 2));
        p
    }

    #[test]
    fn material_is_a_wait_of_10_ms_and_1_percent_of_the_time() {
        let ms = 1_000_000;
        // At both limits: material; just under either: not.
        assert!(waited_materially(&waited(1, 10 * ms, 1000 * ms)));
        assert!(!waited_materially(&waited(1, 10 * ms - 1, 100 * ms)));
        assert!(!waited_materially(&waited(1, 10 * ms, 1000 * ms + 1)));
        // A short process's large share of a small wait is not material.
        assert!(!waited_materially(&waited(1, ms, 3 * ms)));
        // Without a time share (an older build): the wait alone.
        let mut old = waited(1, 10 * ms, 1);
        old.time_share = None;
        assert!(waited_materially(&old));
        old.lock.write.wait_ns.sum -= 1;
        assert!(!waited_materially(&old));
    }

    #[test]
    fn the_material_and_the_ten_that_waited_longest_are_listed_the_rest_grouped() {
        let ms = 1_000_000;
        // 500 processes that hardly waited (1 us + pid ns each), and 3 that waited 5% of
        // their time.
        let mut procs: Vec<ProcessReport> = (1..=500)
            .map(|pid| waited(pid, 1000 + u64::from(pid), ms))
            .collect();
        for pid in [601, 602, 603] {
            procs.push(waited(pid, 50 * ms, 1000 * ms));
        }
        let mut s = summary(procs);
        let l = listing(&s);
        let pids: Vec<u32> = l.order.iter().map(|&i| s.processes[i].pid).collect();
        assert_eq!(pids[..3], [601, 602, 603], "material, longest wait first");
        assert_eq!(pids[3..], (491..=500).rev().collect::<Vec<_>>());
        group_minor(&mut s);
        let kept: Vec<u32> = s.processes.iter().map(|p| p.pid).collect();
        assert_eq!(kept.len(), 13);
        assert!(kept.contains(&601) && kept.contains(&491) && !kept.contains(&490));
        let m = s.minor_processes.as_ref().unwrap();
        assert_eq!((m.totals.processes, m.max_writes), (490, 10));
        // Grouped again, as a file read back: the same listed, nothing more grouped.
        group_minor(&mut s);
        assert_eq!(s.processes.len(), 13);
        assert_eq!(s.minor_processes.as_ref().unwrap().totals.processes, 490);
    }
}
