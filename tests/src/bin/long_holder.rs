//! Ground truth for blockers: one thread holds the process's mmap_lock for write for
//! milliseconds at a time (mprotect of a populated 256 MiB region: the kernel rewrites every
//! page table entry with the lock held) while CHURNERS threads churn (mmap 64 KiB; touch;
//! munmap), whose writes queue behind it.
//!
//!   long-holder HOLDS CHURNERS
//!
//! Prints "ready PID", starts on a line on stdin; the churners run until the holder has made
//! its HOLDS mprotect calls. Then prints one JSON line: the holder's tid, the churners' tids
//! and how long the holder's calls took in all (an upper bound of its hold time).

use std::{
    sync::{
        Barrier,
        atomic::{AtomicBool, AtomicU32, Ordering},
    },
    time::Instant,
};

use integration_tests::{RawThreads, map_touch_unmap};

const REGION: usize = 256 << 20;

fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}

/// The holder's lock-taking call, by a name its stack shows (the holder-stack tests look
/// for it).
#[inline(never)]
fn hold_write_lock(p: *mut libc::c_void, prot: i32) {
    // SAFETY: changes the protection of our own mapping.
    assert_eq!(unsafe { libc::mprotect(p, REGION, prot) }, 0, "mprotect");
    std::hint::black_box(p);
}

fn main() {
    let [holds, churners] = integration_tests::numeric_args::<u64, 2>("long-holder HOLDS CHURNERS");
    let n = churners as usize;
    let go = Barrier::new(n + 2);
    let done = AtomicBool::new(false);
    let tids: Vec<AtomicU32> = (0..=n).map(|_| AtomicU32::new(0)).collect();
    let ops: Vec<AtomicU32> = (0..=n).map(|_| AtomicU32::new(0)).collect();
    let call_ns = std::sync::atomic::AtomicU64::new(0);
    let work = |i: usize| {
        tids[i].store(gettid(), Ordering::Relaxed);
        if i == n {
            // The holder: a populated region whose protection flips back and forth.
            let p = integration_tests::map_anon_populated(REGION);
            go.wait();
            let t0 = Instant::now();
            for k in 0..holds {
                let prot = if k % 2 == 0 {
                    libc::PROT_READ
                } else {
                    libc::PROT_READ | libc::PROT_WRITE
                };
                hold_write_lock(p, prot);
            }
            call_ns.store(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
            done.store(true, Ordering::Release);
        } else {
            go.wait();
            while !done.load(Ordering::Acquire) {
                map_touch_unmap(1, 65536);
                ops[i].fetch_add(1, Ordering::Relaxed);
            }
        }
    };
    let threads = RawThreads::spawn(n + 1, 256 * 1024, &work);
    integration_tests::ready_then_wait_for_go();
    go.wait();
    threads.join();
    let churner_tids: Vec<u32> = tids[..n]
        .iter()
        .map(|t| t.load(Ordering::Relaxed))
        .collect();
    let churn_ops: Vec<u32> = ops[..n].iter().map(|t| t.load(Ordering::Relaxed)).collect();
    println!(
        "{}",
        serde_json::json!({
            "holder_tid": tids[n].load(Ordering::Relaxed),
            "holds": holds,
            "holder_call_ns": call_ns.load(Ordering::Relaxed),
            "churner_tids": churner_tids,
            "churn_ops": churn_ops,
        })
    );
    integration_tests::exit_now(0);
}
