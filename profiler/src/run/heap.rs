//! Freed memory back to the system, now and then, for every kind of run (the one place that
//! does it). glibc's allocator returns memory only from the top of its heap; what a burst
//! freed below that (a first reading of ten thousand threads, a large report, the periodic
//! full reading of the kernel's map) stays resident for the rest of the run otherwise. A
//! long-running profiler is judged on its resident memory, so it trims the heap every so
//! often, and at the next reading after a burst freed a lot: a walk of the free lists, well
//! under a millisecond at these sizes.

use std::time::{Duration, Instant};

/// How often at most when little was freed.
const EVERY: Duration = Duration::from_secs(10);
/// How often at most after a burst.
const SOON: Duration = Duration::from_secs(1);
/// Resident memory over what was resident right after the last trim that makes a burst (a
/// first report of ten thousand threads leaves about 10 MiB freed but resident). The
/// allocator's own statistics cannot tell: a trim releases free chunks' pages but keeps the
/// chunks, and a burst reuses them before it frees them again.
const BURST: u64 = 4 << 20;

pub struct Trim {
    last: Instant,
    /// Resident bytes right after the last trim (or the start).
    resident_after: u64,
}

impl Default for Trim {
    fn default() -> Self {
        Trim {
            last: Instant::now(),
            resident_after: resident().unwrap_or(0),
        }
    }
}

impl Trim {
    /// Trims if the last trim is old enough, or sooner after a burst of frees.
    pub fn now_and_then(&mut self) {
        let since = self.last.elapsed();
        if since < SOON {
            return;
        }
        if since < EVERY && resident().is_none_or(|r| r < self.resident_after.saturating_add(BURST))
        {
            return;
        }
        self.last = Instant::now();
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: no preconditions; it only releases free pages of the allocator's own.
        unsafe {
            libc::malloc_trim(0);
        }
        self.resident_after = resident().unwrap_or(0);
    }
}

/// This process's resident memory in bytes (`/proc/self/statm`, a one-line file).
fn resident() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok()?)
}
