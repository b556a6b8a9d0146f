//! A real-time priority (`SCHED_FIFO` 1) for the profiler's short passes that must not be
//! preempted, because what they hold makes others wait. Ordinary tasks cannot preempt a
//! `SCHED_FIFO` thread; where the profiler may not raise its priority (no `CAP_SYS_NICE`),
//! the passes run as before.
//! - The flush iterator's pass holds each thread's claim while it flushes that thread's
//!   ring. Preempted holding one (for a scheduler slice, on a busy host or a kernel with
//!   lazy preemption, Linux 7.x's default), a thread that completes sixteen acquisitions
//!   meanwhile adds the next to a spill entry with the lock held (`uncounted.spilled`), which
//!   costs more than its ring. The pass is short (microseconds a thread).
//! - Naming a batch's JavaScript frames (`registry::v8`) and reading a memory map whole
//!   (`registry::procmaps`) take the process's own `mmap_lock` for each read. Measured on
//!   the Vitest threads shape on a 2-CPU host (docs/benchmark.md): preempted inside a read,
//!   the profiler's longest hold of a run was up to 4.1 ms (median of its holds over the
//!   process's wait 8.9%); unpreempted, 9-220 microseconds (5.7%). The passes take
//!   milliseconds.

/// Holds the calling thread at `SCHED_FIFO` priority 1 until dropped, then restores its
/// policy and priority.
pub struct Unpreempted {
    old: Option<(libc::c_int, libc::sched_param)>,
}

impl Unpreempted {
    pub fn new() -> Self {
        // SAFETY: plain syscalls on the calling thread (pid 0), with a param we own.
        let old = unsafe {
            let policy = libc::sched_getscheduler(0);
            let mut param: libc::sched_param = std::mem::zeroed();
            if policy < 0 || policy == libc::SCHED_FIFO || libc::sched_getparam(0, &mut param) != 0
            {
                None
            } else {
                let fifo = libc::sched_param { sched_priority: 1 };
                (libc::sched_setscheduler(0, libc::SCHED_FIFO, &fifo) == 0)
                    .then_some((policy, param))
            }
        };
        Unpreempted { old }
    }

    /// Whether the priority was raised.
    #[cfg(test)]
    pub fn raised(&self) -> bool {
        self.old.is_some()
    }
}

impl Drop for Unpreempted {
    fn drop(&mut self) {
        if let Some((policy, param)) = self.old {
            // SAFETY: as above; the policy and param are the thread's own from before.
            unsafe { libc::sched_setscheduler(0, policy, &param) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Raised when allowed (root), never left raised.
    #[test]
    fn the_priority_is_restored() {
        // SAFETY: a plain syscall on the calling thread.
        let before = unsafe { libc::sched_getscheduler(0) };
        {
            let g = Unpreempted::new();
            // SAFETY: as above.
            let during = unsafe { libc::sched_getscheduler(0) };
            assert_eq!(during == libc::SCHED_FIFO, g.raised());
        }
        // SAFETY: as above.
        assert_eq!(unsafe { libc::sched_getscheduler(0) }, before);
    }
}
