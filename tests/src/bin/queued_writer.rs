//! Ground truth for waits queued behind a writer: one thread holds the process's mmap_lock
//! for read for milliseconds at a time (madvise(MADV_COLD) of a populated 256 MiB region: the
//! kernel walks every page table entry under the read lock), one for write
//! (`hold_write_lock`: mprotect of another populated 256 MiB region), and CHURNERS threads
//! churn (mmap 64 KiB; touch; munmap). A churner's write that arrives while the reader holds
//! the lock and the writer waits begins behind readers, as the rwsem's owner word says, but
//! then waits behind the writer, whom the rwsem lets in first.
//!
//!   queued-writer HOLDS CHURNERS
//!
//! Prints "ready PID", starts on a line on stdin; the others run until the writer has made
//! its HOLDS mprotect calls. Then prints one JSON line: the writer's, the reader's and the
//! churners' tids.

use std::sync::{
    Barrier,
    atomic::{AtomicBool, AtomicU32, Ordering},
};

use integration_tests::{RawThreads, map_touch_unmap};

const REGION: usize = 256 << 20;

fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}

/// The writer's lock-taking call, by a name its stack shows.
#[inline(never)]
fn hold_write_lock(p: *mut libc::c_void, prot: i32) {
    // SAFETY: changes the protection of our own mapping.
    assert_eq!(unsafe { libc::mprotect(p, REGION, prot) }, 0, "mprotect");
    std::hint::black_box(p);
}

/// The reader's: a read hold of milliseconds.
#[inline(never)]
fn hold_read_lock(p: *mut libc::c_void) {
    // SAFETY: advice on our own mapping; its contents stay.
    assert_eq!(
        unsafe { libc::madvise(p, REGION, libc::MADV_COLD) },
        0,
        "madvise"
    );
    std::hint::black_box(p);
}

fn main() {
    let [holds, churners] =
        integration_tests::numeric_args::<u64, 2>("queued-writer HOLDS CHURNERS");
    let n = churners as usize;
    let go = Barrier::new(n + 3);
    let done = AtomicBool::new(false);
    // Churners, then the reader (n), then the writer (n + 1).
    let tids: Vec<AtomicU32> = (0..n + 2).map(|_| AtomicU32::new(0)).collect();
    let work = |i: usize| {
        tids[i].store(gettid(), Ordering::Relaxed);
        if i == n + 1 {
            let p = integration_tests::map_anon_populated(REGION);
            go.wait();
            for k in 0..holds {
                let prot = if k % 2 == 0 {
                    libc::PROT_READ
                } else {
                    libc::PROT_READ | libc::PROT_WRITE
                };
                hold_write_lock(p, prot);
            }
            done.store(true, Ordering::Release);
        } else if i == n {
            let p = integration_tests::map_anon_populated(REGION);
            go.wait();
            while !done.load(Ordering::Acquire) {
                hold_read_lock(p);
            }
        } else {
            go.wait();
            while !done.load(Ordering::Acquire) {
                map_touch_unmap(1, 65536);
            }
        }
    };
    let threads = RawThreads::spawn(n + 2, 256 * 1024, &work);
    integration_tests::ready_then_wait_for_go();
    go.wait();
    threads.join();
    let tid = |i: usize| tids[i].load(Ordering::Relaxed);
    println!(
        "{}",
        serde_json::json!({
            "writer_tid": tid(n + 1),
            "reader_tid": tid(n),
            "churner_tids": (0..n).map(tid).collect::<Vec<u32>>(),
        })
    );
    integration_tests::exit_now(0);
}
