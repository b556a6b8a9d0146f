//! Ground truth for thread churn: WAVES waves of THREADS short-lived threads, each doing
//! exactly ITERATIONS x (mmap 64 KiB; touch; munmap) and exiting, with PAUSE_MS between waves
//! (so that a profiler reading every second sees each wave exit).
//!
//!   thread-waves WAVES THREADS ITERATIONS PAUSE_MS
//!
//! Prints "ready PID", starts on a line on stdin; when done, prints one JSON line with what
//! it did, and exits at once (`_exit`).
//!
//! Exactly WAVES x THREADS x ITERATIONS mmap and as many munmap write acquisitions happen
//! after "go", and nothing else takes the lock for write but the process's exit (exit_mmap):
//! the threads are plain pthreads (no Rust signal stack mapped and unmapped per thread) that
//! never allocate (no malloc arena), and a first wave before "ready" puts THREADS stacks in
//! glibc's stack cache, which every later wave reuses (no stack mmap/mprotect per thread).

use integration_tests::{RawThreads, map_touch_unmap};

/// Small stacks: the threads only make syscalls. glibc reuses a cached stack of this size.
const STACK: usize = 256 * 1024;

fn main() {
    let [waves, threads, iterations, pause_ms] =
        integration_tests::numeric_args::<u64, 4>("thread-waves WAVES THREADS ITERATIONS PAUSE_MS");
    // The warm-up wave: stacks for the cache.
    RawThreads::spawn(threads as usize, STACK, &|_| ()).join();
    integration_tests::ready_then_wait_for_go();
    let work = move |_| map_touch_unmap(iterations, 65536);
    for _ in 0..waves {
        RawThreads::spawn(threads as usize, STACK, &work).join();
        if pause_ms > 0 {
            std::thread::sleep(std::time::Duration::from_millis(pause_ms));
        }
    }
    println!(
        "{}",
        serde_json::json!({
            "waves": waves, "threads": threads, "iterations": iterations,
            "mmap": waves * threads * iterations, "munmap": waves * threads * iterations,
        })
    );
    integration_tests::exit_now(0);
}
