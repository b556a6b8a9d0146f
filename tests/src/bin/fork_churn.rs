//! Ground truth for fork under contention: THREADS threads each doing ITERATIONS x (mmap
//! 64 KiB; touch; munmap) while the main thread forks FORKS times (each child `_exit`s at
//! once, the parent waits for it).
//!
//!   fork-churn FORKS THREADS ITERATIONS
//!
//! Prints "ready PID", starts on a line on stdin; when done, prints one JSON line with what
//! it did, and exits at once (`_exit`).
//!
//! The parent's lock is taken for write exactly FORKS times by fork (dup_mmap, which also
//! takes each child's new lock, nested, while the child still has the parent's tgid), and
//! THREADS x ITERATIONS times each by mmap and munmap. The threads are plain pthreads made
//! before "ready" (no Rust signal stack mapped or unmapped), and the process ends with
//! `_exit`: nothing else takes the lock for write but exit_mmap at the very end. The
//! children's own locks (their page faults, their exit) are theirs: other processes.

use std::sync::Barrier;

use integration_tests::{RawThreads, map_touch_unmap};

fn main() {
    let [forks, threads, iterations] =
        integration_tests::numeric_args::<u64, 3>("fork-churn FORKS THREADS ITERATIONS");
    let go = Barrier::new(threads as usize + 1);
    let work = |_| {
        go.wait();
        map_touch_unmap(iterations, 65536);
    };
    let churners = RawThreads::spawn(threads as usize, 256 * 1024, &work);
    integration_tests::ready_then_wait_for_go();
    go.wait();
    for _ in 0..forks {
        // SAFETY: the child calls only _exit (async-signal-safe) before it ends.
        let child = unsafe { libc::fork() };
        assert!(child >= 0, "fork failed");
        if child == 0 {
            // SAFETY: ends the child at once.
            unsafe { libc::_exit(0) };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        let r = unsafe { libc::waitpid(child, &mut status, 0) };
        assert!(r == child && libc::WIFEXITED(status), "waitpid");
    }
    churners.join();
    println!(
        "{}",
        serde_json::json!({
            "forks": forks, "threads": threads, "iterations": iterations,
            "mmap": threads * iterations, "munmap": threads * iterations,
        })
    );
    integration_tests::exit_now(0);
}
