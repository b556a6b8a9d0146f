//! Ground truth for freeing exited threads' entries: WAVES waves of THREADS short-lived
//! threads, each doing exactly ITERATIONS x (mmap 64 KiB; munmap) and exiting, with PAUSE_MS
//! between waves (so that a profiler reading every second sees each wave exit).
//!
//!   thread-waves WAVES THREADS ITERATIONS PAUSE_MS
//!
//! Prints "ready PID", starts on a line on stdin.

fn main() {
    let a: Vec<u64> = std::env::args()
        .skip(1)
        .map(|x| x.parse().expect("numbers"))
        .collect();
    let [waves, threads, iterations, pause_ms] = a[..] else {
        eprintln!("usage: thread-waves WAVES THREADS ITERATIONS PAUSE_MS");
        std::process::exit(2);
    };
    integration_tests::ready_then_wait_for_go();
    for _ in 0..waves {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                std::thread::spawn(move || {
                    for _ in 0..iterations {
                        let p = integration_tests::map_anon(65536);
                        // SAFETY: unmapping the mapping just made, once.
                        unsafe { libc::munmap(p, 65536) };
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(pause_ms));
    }
}
