//! Freed memory back to the system, now and then, for every kind of run (the one place that
//! does it). glibc's allocator returns memory only from the top of its heap; what a burst
//! freed below that (a first reading of ten thousand threads, a large report, the periodic
//! full reading of the kernel's map) stays resident for the rest of the run otherwise. A long-running profiler
//! is judged on its resident memory, so it trims the heap every so often: a walk of the free
//! lists, well under a millisecond at these sizes.

use std::time::{Duration, Instant};

/// How often at most.
const EVERY: Duration = Duration::from_secs(10);

pub struct Trim {
    last: Instant,
}

impl Default for Trim {
    fn default() -> Self {
        Trim {
            last: Instant::now(),
        }
    }
}

impl Trim {
    /// Trims if the last trim is old enough.
    pub fn now_and_then(&mut self) {
        if self.last.elapsed() < EVERY {
            return;
        }
        self.last = Instant::now();
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: no preconditions; it only releases free pages of the allocator's own.
        unsafe {
            libc::malloc_trim(0);
        }
    }
}
