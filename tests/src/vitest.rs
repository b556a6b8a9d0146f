//! Vitest, a real test runner, on a suite of known work (tests/tests/vitest.rs): the pinned
//! install `cargo xtask test` makes (tests/fixtures/vitest/), a generated suite of test files
//! that allocate, each telling which process and thread ran it, and `vitest run` behind a
//! shell that execs it when told, so that the runner's pid is known before it runs.

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::mpsc,
};

use serde_json::Value;

use crate::{Workload, installed_or_skip, profiler_bin};

/// Test files, tests in each, and per test the reads of a 64 KiB file and the 256 KiB
/// Buffers allocated.
pub const FILES: usize = 24;
pub const TESTS: usize = 3;
pub const READS: usize = 100;
pub const BUFFERS: usize = 50;

/// The installed runner, `~/.cache/mmaplock-prof/vitest/node_modules/vitest/vitest.mjs`; None
/// with the calling test recorded as skipped when it is not there.
pub fn installed() -> Option<PathBuf> {
    let home = std::env::var_os("HOME").map_or_else(|| "/root".into(), PathBuf::from);
    let mjs = home.join(".cache/mmaplock-prof/vitest/node_modules/vitest/vitest.mjs");
    installed_or_skip(mjs.exists().then_some(mjs), "Vitest")
}

/// One test file: it appends `PID THREADID` to `$MLP_RECORD` (threadId 0 in a process's main
/// thread), then each test reads `$MLP_DATA` and allocates Buffers, four kept at a time.
fn test_file(i: usize) -> String {
    format!(
        r#"import {{ readFileSync, appendFileSync }} from 'node:fs';
import {{ threadId }} from 'node:worker_threads';

appendFileSync(process.env.MLP_RECORD, `${{process.pid}} ${{threadId}}\n`);

describe('file {i}', () => {{
  for (let t = 0; t < {TESTS}; t++) {{
    test(`reads and allocates ${{t}}`, () => {{
      let bytes = 0;
      for (let r = 0; r < {READS}; r++) bytes += readFileSync(process.env.MLP_DATA).length;
      const kept = [];
      for (let b = 0; b < {BUFFERS}; b++) {{
        kept.push(Buffer.allocUnsafe(256 * 1024).fill(b));
        if (kept.length > 4) kept.shift();
      }}
      expect(bytes).toBe({READS} * 65536);
      expect(kept.at(-1)[0]).toBe({BUFFERS} - 1);
    }});
  }}
}});
"#
    )
}

/// The suite in `dir`: its files, its config (globals: the files import nothing of Vitest,
/// which is not installed beside them) and the file they read.
pub fn write_suite(dir: &Path) {
    std::fs::create_dir_all(dir.join("suite")).unwrap();
    for i in 0..FILES {
        std::fs::write(dir.join(format!("suite/f{i:02}.test.mjs")), test_file(i)).unwrap();
    }
    std::fs::write(
        dir.join("vitest.config.mjs"),
        "export default { test: { include: ['suite/*.test.mjs'], globals: true } };\n",
    )
    .unwrap();
    std::fs::write(dir.join("data.bin"), vec![7u8; 64 * 1024]).unwrap();
}

/// `vitest run --pool=POOL` of the suite in `dir`, by the runner `mjs`.
pub struct Run {
    /// A shell that prints "ready" and execs node under its own pid at the first line it
    /// reads ([`Workload::send`]).
    pub shell: Workload,
    pool: String,
    record: PathBuf,
    results: PathBuf,
    log: PathBuf,
}

impl Run {
    pub fn start(dir: &Path, mjs: &Path, pool: &str) -> Run {
        let file = |ext: &str| dir.join(format!("{pool}.{ext}"));
        let (record, results, log) = (file("files"), file("results.json"), file("log"));
        let mut cmd = Command::new("sh");
        cmd.args([
            "-c",
            "echo ready; read line; exec \"$@\" >\"$MLP_LOG\" 2>&1",
            "sh",
            "node",
        ])
        .arg(mjs)
        .args(["run", &format!("--pool={pool}")])
        .args([
            "--config",
            "vitest.config.mjs",
            "--reporter=json",
            "--outputFile",
        ])
        .arg(&results)
        .current_dir(dir)
        .env("MLP_RECORD", &record)
        .env("MLP_DATA", dir.join("data.bin"))
        .env("MLP_LOG", &log);
        Run {
            shell: Workload::spawn(cmd),
            pool: pool.into(),
            record,
            results,
            log,
        }
    }

    /// Vitest ended (`status`): every test passed, and each file said where it ran, as
    /// `(pid, threadId)`.
    pub fn files(&self, status: ExitStatus) -> Vec<(u32, u64)> {
        let said = || std::fs::read_to_string(&self.log).unwrap_or_default();
        assert!(
            status.success(),
            "vitest --pool={}: {status:?}\n{}",
            self.pool,
            said()
        );
        let r: Value =
            serde_json::from_str(&std::fs::read_to_string(&self.results).unwrap()).unwrap();
        let tests = (FILES * TESTS) as u64;
        assert_eq!(
            (r["numTotalTests"].as_u64(), r["numPassedTests"].as_u64()),
            (Some(tests), Some(tests)),
            "{}",
            said()
        );
        let files: Vec<(u32, u64)> = std::fs::read_to_string(&self.record)
            .unwrap()
            .lines()
            .map(|l| {
                let (p, t) = l.split_once(' ').expect("pid threadId");
                (p.parse().unwrap(), t.parse().unwrap())
            })
            .collect();
        assert_eq!(files.len(), FILES, "{files:?}");
        files
    }
}

/// The profiler, started by hand so that its peak memory can be read when it is reaped
/// (wait4's rusage); killed on drop unless stopped.
pub struct Prof {
    child: Child,
    reaped: bool,
    /// Its standard error's lines after "attached in", to its end.
    stderr: mpsc::Receiver<String>,
}

impl Prof {
    /// `mmaplock-prof --comm node -i 0 -o JSON`, attached.
    pub fn start(json: &Path) -> Prof {
        let mut child = Command::new(profiler_bin())
            .args(["--comm", "node", "-i", "0", "-f", "json", "-o"])
            .arg(json)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start mmaplock-prof");
        let (tx, rx) = mpsc::channel();
        let stderr = child.stderr.take().expect("stderr");
        std::thread::spawn(move || {
            for l in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("mmaplock-prof: {l}");
                let _ = tx.send(l);
            }
        });
        // It attaches or ends (stderr then closes): no bound on how long attaching takes.
        loop {
            match rx.recv() {
                Ok(l) if l.contains("attached in") => break,
                Ok(_) => {}
                Err(_) => panic!("mmaplock-prof did not attach"),
            }
        }
        Prof {
            child,
            reaped: false,
            stderr: rx,
        }
    }

    /// Stops it (SIGINT) and reaps it; it must have succeeded. Its peak resident memory, in
    /// bytes.
    pub fn stop(mut self) -> u64 {
        let pid = self.child.id() as i32;
        // SAFETY: signalling our own child, not yet reaped.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
        // It ends by itself once its summary is written (no bound: the suite's own limit
        // names a hang).
        let mut status = 0;
        // SAFETY: rusage is plain data, for wait4 to fill.
        let mut rusage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: reaping our own child, with valid pointers to fill.
        let reaped = unsafe { libc::wait4(pid, &mut status, 0, &mut rusage) };
        assert_eq!(reaped, pid, "wait4: {}", std::io::Error::last_os_error());
        self.reaped = true;
        // Its standard error closed as it ended: read to its end.
        let said: Vec<String> = self.stderr.iter().collect();
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "mmaplock-prof: wait status {status}: {said:#?}"
        );
        // ru_maxrss is in KiB.
        rusage.ru_maxrss as u64 * 1024
    }
}

impl Drop for Prof {
    fn drop(&mut self) {
        if !self.reaped {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
