//! Ground truth for page-fault writes: the main thread grows its stack PAGES pages, touching
//! it page by page downward. The main thread's stack is the one mapping that grows on demand
//! (VM_GROWSDOWN; pthread stacks are mapped whole): each touch of a page below the stack's
//! mapping is a user page fault that takes mmap_lock for write (`lock_mm_and_find_vma`
//! upgrading to expand the stack), then downgrades it to read. Pages inside the mapping the
//! kernel set up at exec (128 KiB below the initial stack pointer, partly used) need no growth,
//! so the writes are a few dozen fewer than PAGES.
//!
//!   stack-grow PAGES
//!
//! Prints "ready PID", starts on a line on stdin; when done, prints one JSON line with what
//! it did (`grown_bytes`: how far below its starting frame the stack was touched), and exits
//! at once (`_exit`).

use std::hint::black_box;

const PAGE: usize = 4096;

/// One frame of a page or more per call, each touched from its top down, every 256 bytes,
/// so that every page below the start is first touched in order, top down. Returns the
/// lowest address touched.
#[inline(never)]
fn grow(lowest: usize) -> usize {
    let mut buf = [0u8; PAGE];
    for i in (0..PAGE).step_by(256).rev() {
        // SAFETY: writing within a local array.
        unsafe { std::ptr::write_volatile(buf.as_mut_ptr().add(i), 1) };
    }
    let here = buf.as_ptr() as usize;
    let low = if here > lowest { grow(lowest) } else { here };
    // Keeps the frame, and the recursion, from being optimised away.
    black_box(&mut buf);
    low
}

fn main() {
    let [pages] = integration_tests::numeric_args::<usize, 1>("stack-grow PAGES");
    // Room to grow: the default 8 MiB limit holds about 2000 pages; raise the soft limit if
    // more are asked for (before "ready": setrlimit takes no mmap_lock anyway).
    let need = (pages * PAGE + (8 << 20)) as libc::rlim_t;
    // SAFETY: getrlimit/setrlimit on a local struct.
    unsafe {
        let mut rl: libc::rlimit = std::mem::zeroed();
        assert_eq!(libc::getrlimit(libc::RLIMIT_STACK, &mut rl), 0);
        if rl.rlim_cur != libc::RLIM_INFINITY && rl.rlim_cur < need {
            rl.rlim_cur = if rl.rlim_max == libc::RLIM_INFINITY {
                need
            } else {
                need.min(rl.rlim_max)
            };
            assert_eq!(libc::setrlimit(libc::RLIMIT_STACK, &rl), 0, "setrlimit");
        }
    }
    integration_tests::ready_then_wait_for_go();
    let start = black_box(0u8);
    let top = &start as *const u8 as usize;
    let low = grow(top - pages * PAGE);
    println!(
        "{}",
        serde_json::json!({ "pages": pages, "grown_bytes": top - low })
    );
    integration_tests::exit_now(0);
}
