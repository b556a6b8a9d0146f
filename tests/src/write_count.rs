//! An independent count of one process's successful write acquisitions of its own
//! mmap_lock, by thread: a bpftrace script on `mmap_lock:mmap_lock_acquire_returned`, started
//! before the process execs and read once it has exited. The ground truth of full mode for a
//! process whose threads the test cannot name in advance (a test runner's Workers).
//!
//! The process is a shell that execs the program under test (`echo ready; read line; exec
//! ...`), so that its pid is known before the program runs: the shell's own writes, and
//! exec's before the program is named, are not counted (their thread is still `sh`).
//! tests/tests/selection.rs keeps a copy of its own.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Read},
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::Duration,
};

use crate::{installed_or_skip, wait_until};

/// Writes by tid.
pub type Writes = BTreeMap<u64, u64>;

/// The pid the script is asked about when it is to say what it counted: above any `pid_max`
/// (2^22), so no process's.
pub(crate) const STOP: i32 = 0x7fff_0000;

/// bpftrace counting, by tid, the writes process `pid`'s threads made on its own mm (or on
/// none: the last thread's exit_mmap, after exit_mm), once their name is no longer `sh`;
/// killed on drop. Told to say what it counted by a `getpgid` of a pid that cannot exist,
/// not by a signal (bpftrace 0.17 now and then did not end after SIGINT).
pub struct WriteCount {
    child: Child,
    out: mpsc::Receiver<String>,
}

impl WriteCount {
    /// Started and attached; None when bpftrace is missing (the test is then skipped).
    pub fn start(pid: u32) -> Option<Self> {
        let bin = installed_or_skip(
            ["/usr/bin/bpftrace", "/usr/local/bin/bpftrace"]
                .into_iter()
                .map(PathBuf::from)
                .find(|p| p.exists()),
            "bpftrace",
        )?;
        // It says "counting" at the first write of ours it sees: the probe is attached then
        // ("Attaching" comes before it is).
        let script = format!(
            r#"tracepoint:mmap_lock:mmap_lock_acquire_returned
{{
  if (pid == {me} && @ready == 0) {{ @ready = 1; printf("counting\n"); }}
  if (pid == {pid} && args->write && args->success && comm != "sh" &&
      ((uint64)args->mm == (uint64)curtask->mm || (uint64)curtask->mm == 0)) {{
    @w[tid] = count();
  }}
}}
tracepoint:syscalls:sys_enter_getpgid / pid == {me} && args->pid == {STOP} && @said == 0 /
{{ @said = 1; print(@w); printf("counted\n"); }}
"#,
            me = std::process::id()
        );
        let mut child = Command::new(bin)
            .args(["-e", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start bpftrace");
        let (tx, out) = mpsc::channel();
        let stdout = child.stdout.take().expect("stdout");
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let mut stderr = child.stderr.take().expect("stderr");
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s);
            if !s.trim().is_empty() {
                eprintln!("bpftrace: {}", s.trim());
            }
        });
        // Poked with a write of ours (an mmap) until it says it counts; one that fails
        // closes its output. (It compiles with LLVM first: the bound, scaled, is only on a
        // bpftrace that neither counts nor ends.)
        let mut said = Vec::new();
        wait_until(Duration::from_secs(120), Duration::from_millis(20), || {
            let p = crate::map_anon(4096);
            // SAFETY: the mapping just made, unmapped once.
            unsafe { libc::munmap(p, 4096) };
            loop {
                match out.try_recv() {
                    Ok(l) if l == "counting" => return Ok(()),
                    Ok(l) => said.push(l),
                    Err(mpsc::TryRecvError::Empty) => {
                        return Err(format!("bpftrace is not counting: {said:?}"));
                    }
                    Err(mpsc::TryRecvError::Disconnected) => panic!("bpftrace ended: {said:?}"),
                }
            }
        });
        Some(WriteCount { child, out })
    }

    /// What it counted, by tid (the process has exited: nothing is to come).
    pub fn counted(self) -> Writes {
        let mut said = Vec::new();
        wait_until(Duration::from_secs(120), Duration::from_millis(50), || {
            // SAFETY: a plain system call; the pid cannot exist (ESRCH).
            unsafe { libc::getpgid(STOP) };
            loop {
                match self.out.try_recv() {
                    Ok(l) if l == "counted" => return Ok(()),
                    Ok(l) => said.push(l),
                    Err(mpsc::TryRecvError::Empty) => {
                        return Err(format!("bpftrace did not say what it counted: {said:?}"));
                    }
                    Err(mpsc::TryRecvError::Disconnected) => panic!("bpftrace ended: {said:?}"),
                }
            }
        });
        // `@w[4242]: 17`
        said.iter()
            .filter_map(|l| {
                let (tid, n) = l.strip_prefix("@w[")?.split_once("]:")?;
                Some((tid.trim().parse().ok()?, n.trim().parse().ok()?))
            })
            .collect()
    }
}

impl Drop for WriteCount {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
