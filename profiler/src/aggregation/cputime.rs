//! Profiled threads' CPU time, as the kernel reports it: the flush iterator, at each reading,
//! for the threads that ran since the last one, and the exit notice, at a thread's end. No
//! /proc reads: the time share of a window is the thread's wait over the CPU time it used
//! between two of these reports.

use rustc_hash::FxHashMap as HashMap;

use crate::registry::ids::ThreadId;

/// One thread's CPU time when first and last reported.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuSeen {
    /// CPU time (ns) and when it was read (ns since boot) the first time in this run.
    pub first_ns: u64,
    pub first_at: u64,
    /// The same, the last time.
    pub last_ns: u64,
    pub last_at: u64,
}

// Read by the time share of each window (issue 18); the plumbing comes first.
#[allow(dead_code)]
impl CpuSeen {
    /// CPU time used between the first and the last report.
    pub fn used_ns(&self) -> u64 {
        self.last_ns.saturating_sub(self.first_ns)
    }
}

/// CPU times by thread; forgotten with the thread.
#[derive(Debug, Default)]
pub struct CpuTimes {
    threads: HashMap<ThreadId, CpuSeen>,
}

impl CpuTimes {
    /// A report: `cpu_ns` of CPU time by `at` (ns since boot).
    pub fn note(&mut self, thread: ThreadId, cpu_ns: u64, at: u64) {
        let seen = self.threads.entry(thread).or_insert(CpuSeen {
            first_ns: cpu_ns,
            first_at: at,
            last_ns: cpu_ns,
            last_at: at,
        });
        // Reports can arrive out of order (an exit notice and an iterator pass at once).
        if at >= seen.last_at {
            seen.last_ns = cpu_ns.max(seen.last_ns);
            seen.last_at = at;
        }
    }

    #[allow(dead_code)]
    pub fn get(&self, thread: ThreadId) -> Option<CpuSeen> {
        self.threads.get(&thread).copied()
    }

    pub fn forget(&mut self, thread: ThreadId) {
        self.threads.remove(&thread);
    }

    #[allow(dead_code)]
    pub fn len(&self) -> usize {
        self.threads.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_and_last_reports_bound_the_cpu_used() {
        let t = ThreadId::new(7, 100);
        let mut c = CpuTimes::default();
        c.note(t, 1_000, 10);
        c.note(t, 4_000, 30);
        // An older report arriving late changes nothing.
        c.note(t, 2_000, 20);
        let s = c.get(t).unwrap();
        assert_eq!((s.first_ns, s.last_ns, s.used_ns()), (1_000, 4_000, 3_000));
        c.forget(t);
        assert_eq!(c.len(), 0);
        assert!(c.get(t).is_none());
    }
}
