//! Building blocks of the ground-truth helpers (`src/bin/`): mappings made with exactly one
//! mmap(2) each, threads that do nothing but the work asked of them, and the ready/go handshake
//! that lets a profiler attach before the measured work starts.

/// One anonymous private read-write mapping of `size` bytes: exactly one mmap(2), so one
/// write acquisition of the process's mmap_lock (the ground-truth helpers' building block).
pub fn map_anon(size: usize) -> *mut libc::c_void {
    mmap_anon(size, 0)
}

/// One anonymous private read-write mapping of `size` bytes with every page populated (one
/// mmap(2); the pages are faulted in by the kernel, not by touches).
pub fn map_anon_populated(size: usize) -> *mut libc::c_void {
    mmap_anon(size, libc::MAP_POPULATE)
}

fn mmap_anon(size: usize, flags: libc::c_int) -> *mut libc::c_void {
    // SAFETY: a fresh anonymous mapping; the caller owns it (and unmaps it).
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | flags,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED, "mmap failed");
    p
}

/// `n` x (mmap `size` bytes; touch one byte; munmap): exactly `n` mmap and `n` munmap write
/// acquisitions (each munmap then downgrades its write lock to read once); the touch is a
/// page fault that per-VMA locking serves without mmap_lock.
pub fn map_touch_unmap(n: u64, size: usize) {
    for _ in 0..n {
        let p = map_anon(size);
        // SAFETY: touching one byte of the fresh mapping, then unmapping it once.
        unsafe {
            std::ptr::write_volatile(p.cast::<u8>(), 1);
            assert_eq!(libc::munmap(p, size), 0, "munmap failed");
        }
    }
}

/// For the ground-truth helpers: their `N` numeric arguments; otherwise the usage line
/// (`usage`, the command and its arguments' names) on standard error, and exit status 2.
pub fn numeric_args<T: std::str::FromStr, const N: usize>(usage: &str) -> [T; N] {
    let args: Option<Vec<T>> = std::env::args().skip(1).map(|a| a.parse().ok()).collect();
    args.and_then(|a| a.try_into().ok()).unwrap_or_else(|| {
        eprintln!("usage: {usage}");
        std::process::exit(2)
    })
}

/// For the ground-truth helpers: flush standard output and end the process at once with
/// `_exit`, skipping the Rust runtime's clean-up, which would unmap the main thread's
/// signal stack (one more munmap after the measured work).
pub fn exit_now(code: i32) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().lock().flush();
    // SAFETY: _exit ends the process; nothing runs after it.
    unsafe { libc::_exit(code) }
}

struct RawStart<'a> {
    f: &'a (dyn Fn(usize) + Sync),
    index: usize,
}

extern "C" fn raw_start(arg: *mut libc::c_void) -> *mut libc::c_void {
    // SAFETY: `arg` points into the `starts` of the RawThreads that created this thread, which
    // joins it before they are dropped.
    let s = unsafe { &*arg.cast::<RawStart>() };
    (s.f)(s.index);
    std::ptr::null_mut()
}

/// Threads made with `pthread_create` itself, for ground truth: a `std::thread` maps a
/// signal stack of its own as it starts (mmap + mprotect) and unmaps it as it ends (munmap),
/// writes that the workload did not ask for. These threads run `f(index)` and nothing else:
/// no allocation by the Rust runtime, no arena of their own unless `f` allocates, and stacks
/// that glibc caches and reuses (no mmap for a thread of a later wave of the same size).
/// Joined on `join` or drop.
pub struct RawThreads<'a> {
    ids: Vec<libc::pthread_t>,
    // Boxed: each thread holds a pointer to its own element.
    _starts: Box<[RawStart<'a>]>,
}

impl<'a> RawThreads<'a> {
    pub fn spawn(n: usize, stack_size: usize, f: &'a (dyn Fn(usize) + Sync)) -> Self {
        let starts: Box<[RawStart<'a>]> = (0..n).map(|index| RawStart { f, index }).collect();
        let mut ids = Vec::with_capacity(n);
        // SAFETY: plain pthread calls on a zeroed attribute object initialised first; each
        // thread's argument outlives it (joined before `starts` is dropped).
        unsafe {
            let mut attr: libc::pthread_attr_t = std::mem::zeroed();
            assert_eq!(libc::pthread_attr_init(&mut attr), 0);
            assert_eq!(libc::pthread_attr_setstacksize(&mut attr, stack_size), 0);
            for s in starts.iter() {
                let mut id: libc::pthread_t = 0;
                let arg = (s as *const RawStart).cast_mut().cast::<libc::c_void>();
                let rc = libc::pthread_create(&mut id, &attr, raw_start, arg);
                assert_eq!(rc, 0, "pthread_create failed");
                ids.push(id);
            }
            libc::pthread_attr_destroy(&mut attr);
        }
        RawThreads {
            ids,
            _starts: starts,
        }
    }

    pub fn join(self) {}
}

impl Drop for RawThreads<'_> {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            // SAFETY: each id is a joinable thread created above, joined once.
            unsafe { libc::pthread_join(id, std::ptr::null_mut()) };
        }
    }
}

/// For the ground-truth helpers: print "ready PID", then block until a line arrives on stdin,
/// so that a profiler attached in between sees exactly the work that follows.
pub fn ready_then_wait_for_go() {
    use std::io::{BufRead, Write};
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready {}", std::process::id()).expect("stdout");
    out.flush().expect("stdout");
    drop(out);
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).expect("stdin");
}
