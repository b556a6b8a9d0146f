//! Where a thread's CPU time and the clock of its life come from, in one place: the
//! aggregation asks [`thread_cpu_ns`] for threads it reports (those that took a lock since the
//! last reading, and every live one at the end of a run), never on a timer for all threads.
//!
//! The source is `/proc/PID/task/TID/schedstat`, whose first field is the thread's
//! `sum_exec_runtime` (ns). It cannot be read once the thread is gone, so a thread's CPU time
//! is known up to its last reading; a kernel-side reading at exit does better, and replaces
//! this function when it comes.

use crate::registry::ids::ThreadId;

/// The thread's CPU time since it started, ns; None when it cannot be read (it is gone).
pub fn thread_cpu_ns(tgid: u32, thread: ThreadId) -> Option<u64> {
    let text =
        std::fs::read_to_string(format!("/proc/{tgid}/task/{}/schedstat", thread.tid)).ok()?;
    text.split_ascii_whitespace().next()?.parse().ok()
}

/// Now, on the clock of the kernel's start times (`CLOCK_BOOTTIME`, ns).
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_threads_cpu_time_is_read_and_grows() {
        let pid = std::process::id();
        // SAFETY: gettid has no preconditions.
        let tid = ThreadId::new(unsafe { libc::gettid() } as u32, 0);
        let a = thread_cpu_ns(pid, tid).expect("schedstat");
        let t0 = std::time::Instant::now();
        let mut x = 0u64;
        while t0.elapsed().as_millis() < 20 {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        let b = thread_cpu_ns(pid, tid).unwrap();
        assert!(b > a && x > 0, "{a} -> {b}");
        assert_eq!(thread_cpu_ns(pid, ThreadId::new(u32::MAX - 1, 0)), None);
        let (n1, n2) = (now_ns(), now_ns());
        assert!(n1 > 0 && n2 >= n1);
    }
}
