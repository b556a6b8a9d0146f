//! How fast the machine running the suite is, and what follows from it: the speed factor the
//! tests derive their bounds from (tests/src/speed.rs), the per-test limit that catches a
//! real hang and names the test, and `--slow-host`, which takes a core for the whole run to
//! reproduce a machine half as fast.

use std::{
    io::Read as _,
    path::Path,
    process::{Child, Command, ExitStatus, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    time::Duration,
};

use anyhow::{Context as _, Result, bail};

/// The variable the tests read the factor from (tests/src/speed.rs: `SPEED_ENV`).
pub const SPEED_ENV: &str = "MMAPLOCK_PROF_TEST_SPEED";

/// The longest one test may run on the reference machine before the suite takes it for hung
/// (the slowest test takes about 2 minutes there); scaled by the factor.
const HANG_LIMIT_BASE: Duration = Duration::from_secs(10 * 60);

/// Runs the tests crate's `speed-factor` (built by `cargo xtask build`) and returns the
/// factor it measured; prints it with its explanation.
pub fn measure(target_dir: &Path) -> Result<f64> {
    let bin = target_dir.join("debug/speed-factor");
    let out = Command::new(&bin)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run {}", bin.display()))?;
    if !out.status.success() {
        bail!("{} failed: {}", bin.display(), out.status);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let f: f64 = text
        .trim()
        .parse()
        .with_context(|| format!("{} printed {text:?}, not a number", bin.display()))?;
    Ok(f.max(1.0))
}

/// The per-test limit on this host.
pub fn hang_limit(factor: f64) -> Duration {
    HANG_LIMIT_BASE.mul_f64(factor)
}

/// A busy loop on one core for as long as it is kept (`--slow-host`): the suite gets half of
/// a 2-core machine, as on the slower machines it must pass on.
pub struct CoreHog(Arc<AtomicBool>);

impl CoreHog {
    pub fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        std::thread::spawn(move || {
            let mut x = 0u64;
            while !s.load(Ordering::Relaxed) {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        });
        eprintln!("xtask: --slow-host: one core taken by a busy loop for the whole run");
        CoreHog(stop)
    }
}

impl Drop for CoreHog {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Runs `cmd` (`cargo test` with one test thread), echoing its output line by line to `each`;
/// if no line is completed for `limit`, the run is taken for hung: its process group is
/// killed and the error names what it was running (libtest's `test NAME ... ` without its
/// outcome).
pub fn run_watched(
    cmd: &mut Command,
    limit: Duration,
    mut each: impl FnMut(&str),
) -> Result<ExitStatus> {
    use std::os::unix::process::CommandExt as _;
    let mut child: Child = cmd
        .stdout(Stdio::piped())
        .process_group(0)
        .spawn()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    let mut stdout = child.stdout.take().expect("piped");
    let partial = Arc::new(Mutex::new(String::new()));
    let (tx, rx) = mpsc::channel::<String>();
    let p = partial.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        loop {
            let n = match stdout.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let mut part = p.lock().expect("not poisoned");
            part.push_str(&String::from_utf8_lossy(&buf[..n]));
            while let Some(i) = part.find('\n') {
                let line: String = part.drain(..=i).collect();
                if tx.send(line.trim_end_matches('\n').to_string()).is_err() {
                    return;
                }
            }
        }
    });
    loop {
        match rx.recv_timeout(limit) {
            Ok(line) => each(&line),
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let running = partial.lock().expect("not poisoned").trim().to_string();
                eprintln!("xtask: hung: {running:?}; what its processes are doing:");
                eprint!("{}", where_they_wait(child.id()));
                // SAFETY: kill has no preconditions; the group is the test run's alone.
                unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
                let _ = child.wait();
                bail!(
                    "hung: nothing finished for {limit:?} (the per-test limit at this speed); \
                     running: {running:?}"
                );
            }
        }
    }
    Ok(child.wait()?)
}

/// Every descendant of `root`, each thread's state, the kernel function it sleeps in and
/// its kernel stack (root reads them): what a hang was waiting for.
fn where_they_wait(root: u32) -> String {
    let parent_of = |pid: u32| -> Option<u32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // `pid (comm) state ppid ...`: the comm may hold spaces and parentheses.
        stat.rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    let pids: Vec<u32> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    let descends = |mut p: u32| {
        for _ in 0..64 {
            if p == root {
                return true;
            }
            match parent_of(p) {
                Some(pp) if pp > 1 => p = pp,
                _ => return false,
            }
        }
        false
    };
    let mut out = String::new();
    for pid in pids.into_iter().filter(|&p| descends(p)) {
        let read = |f: String| std::fs::read_to_string(f).unwrap_or_default();
        let cmd = read(format!("/proc/{pid}/cmdline")).replace('\0', " ");
        out.push_str(&format!("  {pid} {}\n", cmd.trim()));
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten()
            .flatten();
        for t in tasks {
            let tid = t.file_name().to_string_lossy().into_owned();
            let dir = format!("/proc/{pid}/task/{tid}");
            let comm = read(format!("{dir}/comm"));
            let state = read(format!("{dir}/stat"))
                .rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().next().map(str::to_string))
                .unwrap_or_default();
            let wchan = read(format!("{dir}/wchan"));
            out.push_str(&format!("    {tid} {} {state} {wchan}\n", comm.trim()));
            for frame in read(format!("{dir}/stack")).lines().take(12) {
                out.push_str(&format!("      {frame}\n"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_that_prints_is_followed_to_its_end() {
        let mut lines = Vec::new();
        let status = run_watched(
            Command::new("sh").args(["-c", "echo a; echo b; exit 3"]),
            Duration::from_secs(60),
            |l| lines.push(l.to_string()),
        )
        .unwrap();
        assert_eq!(lines, ["a", "b"]);
        assert_eq!(status.code(), Some(3));
    }

    #[test]
    fn a_hang_is_killed_and_named() {
        let e = run_watched(
            Command::new("sh").args([
                "-c",
                "echo 'running 1 test'; printf 'test slow ... '; sleep 30",
            ]),
            Duration::from_millis(500),
            |_| {},
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("hung") && e.contains("test slow ..."), "{e}");
    }
}
