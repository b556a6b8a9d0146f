//! Runs of our programs that the kernel skipped. Where tracepoint callbacks can be preempted
//! (Linux 7.x calls them under SRCU; before, with preemption off), a thread can be preempted
//! inside one of our programs, and the kernel then skips that program on the same CPU for
//! any other thread until it resumes, counting each skipped run in the program's
//! `recursion_misses` (`/proc/PID/fdinfo` of the program, Linux 5.12+). A skipped lock
//! event is a wait never ended or a hold never released, so the lock programs have second
//! copies there (`profiler-ebpf/src/timing.rs`), and what they do not make up for is counted
//! in the report's `lost.skipped`.

use std::os::fd::{AsFd, AsRawFd};

use aya::{Ebpf, programs::Program};

/// The suffix of the lock programs' second copies, whose own skipped runs lose nothing
/// unless the first copy was skipped too (which the first copy's count has).
pub const SECOND: &str = "_second";

/// `recursion_misses` in a program's fdinfo text; None on a kernel without it (before 5.12).
pub fn parse_misses(fdinfo: &str) -> Option<u64> {
    fdinfo
        .lines()
        .find_map(|l| l.strip_prefix("recursion_misses:"))
        .and_then(|v| v.trim().parse().ok())
}

/// The skipped runs of a program, if it is loaded and the kernel counts them.
fn misses(prog: &Program) -> Option<u64> {
    let fd = prog.fd().ok()?;
    let path = format!("/proc/self/fdinfo/{}", fd.as_fd().as_raw_fd());
    parse_misses(&std::fs::read_to_string(path).ok()?)
}

/// Whether a program's skipped runs may have lost something of ours: not a second copy's
/// (see [`SECOND`]), and not, where programs run with preemption off, a lock contention
/// program's: those fire for every lock of the kernel, and one skipped there ran inside
/// an interrupt that came while the program ran, for a spinlock, never for an mmap_lock.
pub fn counts(name: &str, preemptible: bool) -> bool {
    !name.ends_with(SECOND) && (preemptible || !name.starts_with("contention_"))
}

/// Skipped runs of the programs that [`counts`], since the start: lock events (or a thread's
/// exit, exec, fork or rename notice) that no program saw, unless a second copy made up for
/// them (`rescued`). An upper bound for the profiled processes: the kernel does not say
/// whose event a skipped run was (in contention mode, where programs can be preempted, it
/// may even be another lock's).
pub fn skipped(ebpf: &Ebpf, preemptible: bool, rescued: u64) -> u64 {
    ebpf.programs()
        .filter(|(name, _)| counts(name, preemptible))
        .filter_map(|(_, p)| misses(p))
        .sum::<u64>()
        .saturating_sub(rescued)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_misses_of_a_recorded_fdinfo() {
        // A raw tracepoint program's fdinfo on Linux 7.3.
        let text = "pos:\t0\nflags:\t02000002\nmnt_id:\t16\nino:\t2075\nprog_type:\t17\n\
                    prog_jited:\t1\nprog_tag:\t2f2b9ca8e3c6b5d1\nmemlock:\t16384\n\
                    prog_id:\t8\nrun_time_ns:\t0\nrun_cnt:\t0\nrecursion_misses:\t1141\n\
                    verified_insns:\t2891\n";
        assert_eq!(parse_misses(text), Some(1141));
        assert_eq!(parse_misses("prog_type:\t17\nprog_id:\t8\n"), None);
    }

    #[test]
    fn second_copies_never_count_and_contention_programs_only_where_preemptible() {
        for p in [
            "mmap_lock_released",
            "sched_process_exit",
            "sched_process_exec",
        ] {
            assert!(counts(p, false) && counts(p, true));
        }
        for p in ["mmap_lock_released_second", "contention_end_second"] {
            assert!(!counts(p, false) && !counts(p, true));
        }
        for p in ["contention_begin", "contention_end", "contention_exit"] {
            assert!(!counts(p, false) && counts(p, true));
        }
    }
}
