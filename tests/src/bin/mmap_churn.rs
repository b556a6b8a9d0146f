//! Ground truth for the integration tests: T threads, each doing exactly N times
//! (mmap SIZE bytes; touch one byte; munmap). That is 2*T*N write acquisitions of the
//! process's mmap_lock, plus the few the process itself adds (its exit_mmap, see the tests).
//!
//! The threads are created, and have allocated once (so glibc's per-thread arenas exist),
//! before "ready" is printed; the work starts when a line arrives on stdin, so a profiler
//! attached in between sees exactly the work.
//!
//!   mmap-churn THREADS ITERATIONS [SIZE] [NAME] [LINGER_SECS]
//!
//! NAME, if given (and not "-"), becomes the process's command name (for --comm tests).
//! LINGER_SECS keeps every thread alive that long after its work (the benchmark's many-threads
//! case); "done" is printed when all threads have finished their work.

use std::{
    io::Write,
    sync::{Arc, Barrier},
};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!("usage: mmap-churn THREADS ITERATIONS [SIZE] [NAME]");
        std::process::exit(2);
    }
    let threads: usize = args[1].parse().expect("THREADS");
    let iterations: u64 = args[2].parse().expect("ITERATIONS");
    let size: usize = args.get(3).map_or(65536, |s| s.parse().expect("SIZE"));
    let linger: f64 = args.get(5).map_or(0.0, |s| s.parse().expect("LINGER_SECS"));
    if let Some(name) = args.get(4).filter(|n| *n != "-") {
        let c = std::ffi::CString::new(name.as_str()).expect("NAME");
        // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
        unsafe { libc::prctl(libc::PR_SET_NAME, c.as_ptr(), 0, 0, 0) };
    }
    let ready = Arc::new(Barrier::new(threads + 1));
    let go = Arc::new(Barrier::new(threads + 1));
    let done = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (ready, go, done) = (ready.clone(), go.clone(), done.clone());
            std::thread::Builder::new()
                // Small stacks: the many-threads case starts thousands.
                .stack_size(256 * 1024)
                .spawn(move || {
                    // Create this thread's malloc arena now, not during the measured work.
                    std::hint::black_box(vec![0u8; 4096]);
                    ready.wait();
                    go.wait();
                    integration_tests::map_touch_unmap(iterations, size);
                    done.wait();
                    if linger > 0.0 {
                        std::thread::sleep(std::time::Duration::from_secs_f64(linger));
                    }
                })
                .expect("spawn thread")
        })
        .collect();
    ready.wait();
    integration_tests::ready_then_wait_for_go();
    go.wait();
    done.wait();
    // The reader may have stopped listening after "ready": that is fine.
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "done").and_then(|_| out.flush());
    drop(out);
    for h in handles {
        h.join().unwrap();
    }
}
