//! Ground truth for the time share (the lock's wait as a share of a thread's time), measured
//! by the workload itself with clock_gettime:
//!
//!   time-share wait SECS   a holder thread holds the lock for write for milliseconds at a
//!                          time (mprotect of a populated 64 MiB region, back to back) for SECS,
//!                          while a waiter thread loops: mmap 64 KiB and munmap it (each waits
//!                          behind the holder), then sleeps as long as those two calls took, so
//!                          that it sleeps half of its time and waits most of the rest
//!   time-share spin SECS   one thread spins on the CPU for SECS, with one mmap and munmap of
//!                          its own every 10 ms: a CPU-bound thread that hardly waits
//!   time-share bystanders SECS N
//!                          `wait`'s two threads, and N threads named `libuv-worker` that spin
//!                          on the CPU without ever taking the lock (their stacks are the
//!                          process's own populated memory: no fault, no mmap, no munmap, not
//!                          even at their end, which is the process's exit) until SECS have
//!                          passed; once they run it prints `{"spinners":[TID, ...]}`
//!
//! The threads start after "go" (ready_then_wait_for_go), so their whole lives are in the
//! profile. Prints one JSON line: the threads' tids and, for the waiter, the time its calls
//! took (its wait, and the few microseconds of the calls themselves), its life from its first
//! instruction to its last, and its CPU time (CLOCK_THREAD_CPUTIME_ID).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};

use integration_tests::{RawThreads, map_anon, map_anon_populated};

const REGION: usize = 64 << 20;

fn clock(id: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(id, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn now() -> u64 {
    clock(libc::CLOCK_MONOTONIC)
}

fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}

fn sleep_ns(ns: u64) {
    let ts = libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: a relative sleep; the remainder is not wanted.
    unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
}

/// One mmap of 64 KiB and its munmap: two write acquisitions.
fn map_unmap() {
    let p = map_anon(65536);
    // SAFETY: unmapping the mapping just made.
    assert_eq!(unsafe { libc::munmap(p, 65536) }, 0);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(mode), Some(secs)) = (
        args.first(),
        args.get(1).and_then(|s| s.parse::<f64>().ok()),
    ) else {
        eprintln!("usage: time-share wait|spin SECS");
        std::process::exit(2);
    };
    let (wait_mode, spinners) = match mode.as_str() {
        "wait" => (true, 0),
        "spin" => (false, 0),
        "bystanders" => match args.get(2).and_then(|n| n.parse::<usize>().ok()) {
            Some(n) if n > 0 => (true, n),
            _ => {
                eprintln!("usage: time-share bystanders SECS N");
                std::process::exit(2);
            }
        },
        _ => {
            eprintln!("usage: time-share wait|spin|bystanders SECS [N]");
            std::process::exit(2);
        }
    };
    let span = (secs * 1e9) as u64;
    let (tids, done) = (
        [AtomicU32::new(0), AtomicU32::new(0)],
        AtomicBool::new(false),
    );
    let [calls, alive, cpu, sleeps, rounds] = std::array::from_fn(|_| AtomicU64::new(0));
    let holds = AtomicU64::new(0);
    let region = if wait_mode {
        map_anon_populated(REGION) as usize
    } else {
        0
    };
    let work = |i: usize| {
        tids[i].store(gettid(), Relaxed);
        let t0 = now();
        match (wait_mode, i) {
            // The holder.
            (true, 0) => {
                let mut k = 0u64;
                while now() - t0 < span {
                    let prot = if k.is_multiple_of(2) {
                        libc::PROT_READ
                    } else {
                        libc::PROT_READ | libc::PROT_WRITE
                    };
                    // SAFETY: changes the protection of our own mapping.
                    let rc = unsafe { libc::mprotect(region as *mut libc::c_void, REGION, prot) };
                    assert_eq!(rc, 0, "mprotect");
                    k += 1;
                }
                holds.store(k, Relaxed);
                done.store(true, Relaxed);
            }
            // The waiter: until the holder stops.
            (true, _) => {
                while !done.load(Relaxed) {
                    let a = now();
                    map_unmap();
                    let took = now() - a;
                    calls.fetch_add(took, Relaxed);
                    sleep_ns(took);
                    sleeps.fetch_add(now() - a - took, Relaxed);
                    rounds.fetch_add(1, Relaxed);
                }
                cpu.store(clock(libc::CLOCK_THREAD_CPUTIME_ID), Relaxed);
                alive.store(now() - t0, Relaxed);
            }
            // The spinner.
            (false, _) => {
                let mut next = t0;
                let mut x = 0u64;
                while now() - t0 < span {
                    if now() >= next {
                        map_unmap();
                        rounds.fetch_add(1, Relaxed);
                        next += 10_000_000;
                    }
                    x = x.wrapping_mul(31).wrapping_add(std::hint::black_box(7));
                }
                std::hint::black_box(x);
                cpu.store(clock(libc::CLOCK_THREAD_CPUTIME_ID), Relaxed);
                alive.store(now() - t0, Relaxed);
            }
        }
    };
    integration_tests::ready_then_wait_for_go();
    let threads = RawThreads::spawn(if wait_mode { 2 } else { 1 }, 256 * 1024, &work);
    let spun = (spinners > 0).then(|| bystanders::start(spinners));
    if let Some(tids) = &spun {
        println!("{}", serde_json::json!({ "spinners": tids }));
        use std::io::Write;
        std::io::stdout().flush().expect("stdout");
        sleep_ns(span);
    }
    threads.join();
    let out = if wait_mode {
        serde_json::json!({
            "spinners": spun,
            "holder_tid": tids[0].load(Relaxed),
            "holds": holds.load(Relaxed),
            "waiter_tid": tids[1].load(Relaxed),
            "waiter_rounds": rounds.load(Relaxed),
            "waiter_call_ns": calls.load(Relaxed),
            "waiter_sleep_ns": sleeps.load(Relaxed),
            "waiter_alive_ns": alive.load(Relaxed),
            "waiter_cpu_ns": cpu.load(Relaxed),
        })
    } else {
        serde_json::json!({
            "spinner_tid": tids[0].load(Relaxed),
            "spinner_rounds": rounds.load(Relaxed),
            "spinner_alive_ns": alive.load(Relaxed),
            "spinner_cpu_ns": cpu.load(Relaxed),
        })
    };
    println!("{out}");
    integration_tests::exit_now(0);
}

/// Threads that never take the process's lock: started with `pthread_create` on stacks of
/// memory the process populated beforehand (glibc then maps nothing, and unmaps and advises
/// nothing at their end), they name themselves and spin, touching nothing else, until the
/// process exits. On any kernel they fault no page: none of them takes the lock.
mod bystanders {
    use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

    const STACK: usize = 256 * 1024;
    const MAX: usize = 64;

    /// Their tids, written as they start (the page is touched before any starts).
    static TIDS: [AtomicU32; MAX] = [const { AtomicU32::new(0) }; MAX];

    extern "C" fn spin(arg: *mut libc::c_void) -> *mut libc::c_void {
        let i = arg as usize;
        // SAFETY: gettid and prctl(PR_SET_NAME) with a NUL-terminated name take no lock.
        unsafe {
            TIDS[i].store(libc::gettid() as u32, Relaxed);
            libc::prctl(libc::PR_SET_NAME, c"libuv-worker".as_ptr());
        }
        let mut x = 0u64;
        loop {
            x = x.wrapping_mul(31).wrapping_add(std::hint::black_box(7));
            std::hint::black_box(x);
        }
    }

    /// Starts `n` of them and returns their tids once all run.
    pub fn start(n: usize) -> Vec<u32> {
        assert!(n <= MAX);
        for t in &TIDS {
            t.store(0, Relaxed);
        }
        for i in 0..n {
            let stack = integration_tests::map_anon_populated(STACK);
            // SAFETY: a zeroed attribute object initialised first, given a stack of our own
            // populated memory that stays mapped until the process exits; the thread is
            // detached (it spins until then).
            unsafe {
                let mut attr: libc::pthread_attr_t = std::mem::zeroed();
                assert_eq!(libc::pthread_attr_init(&mut attr), 0);
                assert_eq!(libc::pthread_attr_setstack(&mut attr, stack, STACK), 0);
                let mut id: libc::pthread_t = 0;
                let rc = libc::pthread_create(&mut id, &attr, spin, i as *mut libc::c_void);
                assert_eq!(rc, 0, "pthread_create");
                libc::pthread_detach(id);
                libc::pthread_attr_destroy(&mut attr);
            }
        }
        loop {
            let tids: Vec<u32> = TIDS[..n].iter().map(|t| t.load(Relaxed)).collect();
            if tids.iter().all(|&t| t != 0) {
                return tids;
            }
            std::thread::yield_now();
        }
    }
}
