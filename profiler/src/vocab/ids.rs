//! Processes and threads named by id *and* start time: a pid or tid that the kernel reuses
//! names a new process or thread, with its own name, role, maps and totals.
//!
//! Start times are in clock ticks since boot, as /proc shows them (`/proc/PID/stat` field
//! 22), so that an id found in /proc (a `--pid` target) and one from the kernel side (which
//! reports `start_boottime` in ns, see [`ticks_of_ns`]) compare equal. Two processes would
//! have to reuse one pid within one tick (10 ms) to be confused.

use serde::Serialize;

/// A process: its pid and its start time (its group leader's, in clock ticks since boot; 0
/// when unknown, e.g. the owner-0 bucket of kernels without `mm->owner`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct ProcId {
    pub pid: u32,
    pub start: u64,
}

/// A thread: its tid and its start time (clock ticks since boot).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct ThreadId {
    pub tid: u32,
    pub start: u64,
}

impl ProcId {
    pub const fn new(pid: u32, start: u64) -> Self {
        ProcId { pid, start }
    }

    /// A live process as /proc shows it now (None: no such process).
    pub fn of_live(pid: u32) -> Option<Self> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        Some(ProcId::new(pid, stat_start_ticks(&stat)?))
    }
}

/// Now, on the clock of the kernel's start times (`CLOCK_BOOTTIME`, ns since boot): that of
/// threads' start and exit, and of the kernel's CPU time readings.
pub fn boot_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A kernel start time (`start_boottime`, ns since boot) in clock ticks, as /proc shows it.
pub fn ticks_of_ns(ns: u64) -> u64 {
    ns / (1_000_000_000 / clock_ticks())
}

/// A record's run-queue delay: None on a kernel that keeps none
/// ([`profiler_common::NO_RUN_DELAY`]).
pub fn run_delay(queued_ns: u64) -> Option<u64> {
    (queued_ns != profiler_common::NO_RUN_DELAY).then_some(queued_ns)
}

impl ThreadId {
    pub const fn new(tid: u32, start: u64) -> Self {
        ThreadId { tid, start }
    }

    /// Made-up threads of these tids, all started at tick 1 (for tests).
    #[cfg(test)]
    pub fn made_up<const N: usize>(tids: [u32; N]) -> [ThreadId; N] {
        tids.map(|tid| ThreadId::new(tid, 1))
    }
}

/// Clock ticks per second of /proc's start times (`sysconf(_SC_CLK_TCK)`, 100 on Linux).
pub fn clock_ticks() -> u64 {
    static TICKS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        // SAFETY: sysconf has no preconditions.
        let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        if t > 0 { t as u64 } else { 100 }
    })
}

/// Field 22 of a `/proc/PID/stat` line: the start time in clock ticks since boot. The command
/// name (field 2) may hold spaces and parentheses, so fields are counted after its last ')'.
pub fn stat_start_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // After ')' come fields 3, 4, ...: field 22 is the 20th.
    rest.split_ascii_whitespace().nth(19)?.parse().ok()
}

/// What /proc shows of a thread (tid *and* start time) of process `pid`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Presence {
    /// Listed and not a zombie: it may still take its process's lock.
    Alive,
    /// Listed but a zombie (or dead): it has run its last instruction, and is not reaped yet.
    Zombie,
    /// Not listed, or its tid is another thread's now.
    Gone,
}

/// Reads `/proc/PID/task/TID/stat` once and tells what it shows of thread `t`. A thread not
/// `Alive` has run its last instruction; until then, even after its exit notice, it may still
/// take its process's lock (exit_mm; the last thread's exit_mmap).
pub fn presence(pid: u32, t: ThreadId) -> Presence {
    match std::fs::read_to_string(format!("/proc/{pid}/task/{}/stat", t.tid)) {
        Ok(stat) if stat_start_ticks(&stat) == Some(t.start) => {
            if matches!(stat_state(&stat), Some('Z' | 'X')) {
                Presence::Zombie
            } else {
                Presence::Alive
            }
        }
        _ => Presence::Gone,
    }
}

/// Does this very process (same pid, same start time) live (a zombie not reaped yet
/// included)? Asked of its pidfd while it runs, of /proc at first and once it has exited
/// (`pidfds`).
pub fn is_alive(p: ProcId) -> bool {
    if super::pidfds::running(p) {
        return true;
    }
    // Opened first: alive in /proc after this, the process is the pidfd's.
    let fd = if super::pidfds::held(p) {
        None
    } else {
        super::pidfds::open(p.pid)
    };
    // The leader's own stat, not the process's: the latter sums every thread's times and
    // faults, which costs a millisecond with ten thousand threads; the start time is the same.
    let alive = presence(p.pid, ThreadId::new(p.pid, p.start)) != Presence::Gone;
    match (alive, fd) {
        (true, Some(fd)) => super::pidfds::hold(p, fd),
        (false, _) => super::pidfds::forget(p),
        (true, None) => {}
    }
    alive
}

/// Field 3 of a `/proc/PID/stat` line: the state (R, S, D, Z, X...).
pub fn stat_state(stat: &str) -> Option<char> {
    stat[stat.rfind(')')? + 1..].trim_start().chars().next()
}

/// Field 4 of a `/proc/PID/stat` line: the parent's pid.
pub fn stat_ppid(stat: &str) -> Option<u32> {
    stat[stat.rfind(')')? + 1..]
        .split_ascii_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Every process /proc shows descending from one of `roots` (children, theirs, ...), the roots
/// left out, with their start times: a scan of /proc, so a process forked meanwhile may be
/// missing (scan again once its parent is followed).
pub fn descendants(roots: &[u32]) -> Vec<ProcId> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut children: std::collections::HashMap<u32, Vec<ProcId>> = Default::default();
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if let (Some(ppid), Some(start)) = (stat_ppid(&stat), stat_start_ticks(&stat)) {
            children
                .entry(ppid)
                .or_default()
                .push(ProcId::new(pid, start));
        }
    }
    let mut out = Vec::new();
    let mut todo: Vec<u32> = roots.to_vec();
    let mut seen: std::collections::HashSet<u32> = roots.iter().copied().collect();
    while let Some(parent) = todo.pop() {
        for &c in children.get(&parent).into_iter().flatten() {
            if seen.insert(c.pid) {
                out.push(c);
                todo.push(c.pid);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_ticks_after_a_command_name_with_spaces_and_parens() {
        let line = "1234 (we (ird) name) S 1 1234 1234 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 1 0 98765 1000000 200 18446744073709551615";
        assert_eq!(stat_start_ticks(line), Some(98765));
        assert_eq!(stat_start_ticks("garbage"), None);
        assert_eq!(stat_state(line), Some('S'));
        assert_eq!(stat_state("1 (x) Z 0"), Some('Z'));
    }

    #[test]
    fn a_zombie_thread_is_present_but_not_alive() {
        let me = std::process::id();
        let tid = ThreadId::new(me, ProcId::of_live(me).unwrap().start);
        assert_eq!(presence(me, tid), Presence::Alive);
        assert_eq!(
            presence(me, ThreadId::new(me, tid.start + 1)),
            Presence::Gone
        );
        // A child that exited and is not waited for yet: a zombie.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let start = ProcId::of_live(pid).map(|p| p.start);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            && stat_state(&stat) != Some('Z')
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        if let Some(start) = start {
            let p = ProcId::new(pid, start);
            assert_eq!(presence(pid, ThreadId::new(pid, start)), Presence::Zombie);
            assert!(is_alive(p), "not reaped yet");
            // Asked again with its pidfd held: exited, so /proc decides (a zombie: alive);
            // gone once reaped, and its pidfd closed.
            assert!(super::super::pidfds::held(p) && !super::super::pidfds::running(p));
            assert!(is_alive(p), "not reaped yet (pidfd held)");
            child.wait().unwrap();
            assert!(!is_alive(p), "reaped");
            assert!(!super::super::pidfds::held(p));
        } else {
            child.wait().unwrap();
        }
    }

    /// A process asked about before it was started (the pid another's, or free) is not
    /// alive, and its pidfd is not kept; asked about alive, its pidfd follows it, not its pid.
    #[test]
    fn a_pidfd_is_kept_only_for_a_process_shown_alive() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let p = ProcId::of_live(child.id()).unwrap();
        let earlier = ProcId::new(p.pid, p.start.saturating_sub(1));
        assert!(!is_alive(earlier));
        assert!(!super::super::pidfds::held(earlier));
        assert!(is_alive(p) && is_alive(p));
        assert!(super::super::pidfds::held(p));
        // Running: its pidfd says so. Exited, not reaped: a zombie, alive as /proc says.
        assert!(super::super::pidfds::running(p));
        child.kill().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while super::super::pidfds::running(p) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        assert!(!super::super::pidfds::running(p), "killed");
        assert!(is_alive(p), "a zombie, not reaped yet");
        child.wait().unwrap();
        assert!(!is_alive(p));
        assert!(!super::super::pidfds::held(p));
    }

    #[test]
    fn this_process_is_alive_under_its_own_start_time_only() {
        let pid = std::process::id();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let ticks = stat_start_ticks(&stat).unwrap();
        assert!(is_alive(ProcId::new(pid, ticks)));
        assert!(!is_alive(ProcId::new(pid, ticks + 1000)));
        assert_eq!(ProcId::of_live(pid), Some(ProcId::new(pid, ticks)));
        assert_eq!(
            ticks_of_ns(ticks * (1_000_000_000 / clock_ticks()) + 5),
            ticks
        );
    }
}
