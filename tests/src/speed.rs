//! The one speed factor of the suite: how much slower this host (or emulated guest) is than
//! the reference machine, measured once and used to derive every wall-clock bound a test
//! keeps. A test waits without a bound for what will come or end by itself (a line a child
//! prints or its exit); a bound is kept only where a broken product would otherwise hang
//! the test (a value that never appears), and then it is `scaled(base)`, never a constant.
//!
//! `cargo xtask test` measures the factor once at its start (`speed-factor`, this module's
//! binary), prints it, and hands it to every test binary in [`SPEED_ENV`]; the kernel
//! matrix's guests measure their own. A test binary run by hand measures it on first use.

use std::{
    sync::OnceLock,
    time::{Duration, Instant},
};

/// The measured factor, as `cargo xtask test` and the matrix's guests pass it on.
pub const SPEED_ENV: &str = "MMAPLOCK_PROF_TEST_SPEED";

/// What the probe takes on the reference machine (2 cores of this machine kind, idle), its
/// median of [`ROUNDS`]: the factor is a measured time over this.
pub const REFERENCE_MS: u64 = 100;
const REFERENCE: Duration = Duration::from_millis(REFERENCE_MS);
const ROUNDS: usize = 3;

/// How much slower than the reference this machine is now (at least 1).
pub fn factor() -> f64 {
    static F: OnceLock<f64> = OnceLock::new();
    *F.get_or_init(|| {
        std::env::var(SPEED_ENV)
            .ok()
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|f| f.is_finite() && *f >= 1.0)
            .unwrap_or_else(|| {
                let f = measure();
                eprintln!("speed factor {f:.2} (measured: {SPEED_ENV} was not set)");
                f
            })
    })
}

/// `base`, a bound that holds on the reference machine with room to spare, on this one.
pub fn scaled(base: Duration) -> Duration {
    base.mul_f64(factor())
}

/// Runs the probe [`ROUNDS`] times and returns its median over [`REFERENCE`], at least 1.
pub fn measure() -> f64 {
    let mut took: Vec<Duration> = (0..ROUNDS).map(|_| probe()).collect();
    took.sort();
    (took[ROUNDS / 2].as_secs_f64() / REFERENCE.as_secs_f64()).max(1.0)
}

/// What the tests' waits are made of, on every core at once: short processes started and
/// reaped (a workload, a helper, the profiler), and threads that map, touch and unmap
/// memory (the kernel's mmap_lock paths and page faults) between bouts of plain computing.
/// On a loaded host every thread competes, as the tests' children do.
fn probe() -> Duration {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let start = Instant::now();
    let threads: Vec<_> = (0..cores)
        .map(|i| {
            std::thread::spawn(move || {
                let mut acc = i as u64;
                for _ in 0..400 {
                    acc = acc.wrapping_add(churn_once());
                    for k in 0..20_000u64 {
                        acc = acc.rotate_left(5) ^ k.wrapping_mul(0x9e37_79b9_7f4a_7c15);
                    }
                }
                std::hint::black_box(acc)
            })
        })
        .collect();
    for _ in 0..8 {
        let ok = std::process::Command::new("/bin/true")
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "cannot run /bin/true");
    }
    for t in threads {
        t.join().expect("probe thread");
    }
    start.elapsed()
}

/// One mmap of 64 KiB, every page touched, and its munmap.
fn churn_once() -> u64 {
    const LEN: usize = 64 * 1024;
    // SAFETY: an anonymous private mapping of our own, written within its length, unmapped
    // once.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            LEN,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED, "mmap");
        let bytes = p.cast::<u8>();
        for off in (0..LEN).step_by(4096) {
            *bytes.add(off) = 1;
        }
        let v = *bytes as u64;
        libc::munmap(p, LEN);
        v
    }
}
