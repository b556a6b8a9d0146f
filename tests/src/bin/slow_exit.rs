//! Ground truth for what a thread does after its exit notice: after "go", exactly READS
//! mincore(2) calls from the main thread (one read acquisition each), then the process ends
//! with SIZE_MIB MiB populated. The kernel frees them in the main thread's exit_mmap, after
//! the thread's sched_process_exit and its exit_mm's read acquisition: for a few hundred
//! milliseconds the thread has announced its exit and still takes the lock.
//!
//!   slow-exit READS SIZE_MIB

fn main() {
    let [reads, mib] = integration_tests::numeric_args::<usize, 2>("slow-exit READS SIZE_MIB");
    let small = integration_tests::map_anon(4096);
    let _big = integration_tests::map_anon_populated(mib << 20);
    let mut vec = [0u8; 1];
    integration_tests::ready_then_wait_for_go();
    for _ in 0..reads {
        // SAFETY: `small` is a live one-page mapping and `vec` has one byte per page.
        assert_eq!(unsafe { libc::mincore(small, 4096, vec.as_mut_ptr()) }, 0);
    }
    integration_tests::exit_now(0);
}
