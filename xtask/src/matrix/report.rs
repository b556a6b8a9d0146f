//! A guest's results, read back from its shared directory, and how the suite shows them: one
//! block per kernel (its probes, each test, its wall time) and counts for the closing line.

use std::{fmt::Write as _, path::Path, time::Duration};

use super::{
    Kernel,
    guest::Accel,
    watch::{Killed, parse_factor},
};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Passed,
    Failed(String),
    /// The test recorded why it could not run (tests/src/skip.rs), or its kernel could not
    /// be had.
    Skipped(String),
    /// The guest ended (or was killed) before it.
    NotRun,
    /// Not run: it waits for a feature of the profiler on this kernel's architecture
    /// (`super::pending_of`), which the reason names. Counted as skipped.
    Pending(String),
}

#[derive(Clone, Debug)]
pub struct TestRun {
    /// `file::test`.
    pub name: String,
    pub outcome: Outcome,
    pub secs: u64,
}

/// One kernel's run.
#[derive(Clone, Debug)]
pub struct KernelRun {
    pub kernel: Kernel,
    pub release: String,
    pub accel: Option<Accel>,
    /// What `mmaplock-prof --probe-kernel` printed there.
    pub probe: String,
    pub tests: Vec<TestRun>,
    /// Fetching (when not cached), booting and testing.
    pub wall: Duration,
    /// Why the kernel could not be tested at all.
    pub skipped: Option<String>,
    /// What the suite should know about how its results were had (a guest kernel that
    /// crashed under emulation and was booted again).
    pub notes: Vec<String>,
    /// The guest's speed factor, as it measured it (`speed.txt`).
    pub speed: Option<f64>,
    /// The factor its limits took when it measured none.
    pub default_factor: f64,
    /// Why its watch killed the guest, and in which step.
    pub killed: Option<Killed>,
}

/// The test of the tarball a guest unpacked (`tarball.status`, `tarball.txt`): passed when
/// its binary ran and probed the kernel as the tests' binary did (`probe`).
pub fn tarball_probe(rwdir: &Path, probe: &str) -> TestRun {
    let status = std::fs::read_to_string(rwdir.join("tarball.status")).ok();
    let said = std::fs::read_to_string(rwdir.join("tarball.txt")).unwrap_or_default();
    let bar = |t: &str| {
        t.lines()
            .map(|l| format!("        | {l}"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let outcome = match status.as_deref().map(str::trim) {
        None => Outcome::NotRun,
        Some("0") if said == probe => Outcome::Passed,
        Some(s) => Outcome::Failed(format!(
            "        | exit status {s}; it printed:\n{}\n        | the tests' binary printed:\n{}",
            bar(&said),
            bar(probe)
        )),
    };
    TestRun {
        name: "tarball::probe_kernel".into(),
        outcome,
        secs: 0,
    }
}

impl KernelRun {
    /// Every test of the kernel skipped, for `why`.
    pub fn skipped(k: &Kernel, tests: &[(&str, &str)], why: String) -> Self {
        KernelRun {
            kernel: *k,
            release: String::new(),
            accel: None,
            probe: String::new(),
            tests: tests
                .iter()
                .map(|(f, t)| TestRun {
                    name: format!("{f}::{t}"),
                    outcome: Outcome::Skipped(why.clone()),
                    secs: 0,
                })
                .collect(),
            wall: Duration::ZERO,
            skipped: Some(why),
            notes: Vec::new(),
            speed: None,
            default_factor: 0.0,
            killed: None,
        }
    }

    /// What the guest wrote in `rwdir`: `results.tsv` (name, exit status, seconds), each
    /// test's log, the skips, the probes and its speed factor. The test a killed guest was
    /// running failed; a guest killed before its script began is a skip.
    pub fn read(
        k: &Kernel,
        tests: &[(&str, &str)],
        release: &str,
        accel: Accel,
        rwdir: &Path,
        killed: Option<Killed>,
    ) -> Self {
        if let Some(Killed { step: None, why }) = &killed {
            return KernelRun::skipped(k, tests, why.clone());
        }
        let results = std::fs::read_to_string(rwdir.join("results.tsv")).unwrap_or_default();
        let skips = std::fs::read_to_string(rwdir.join("skips.txt")).unwrap_or_default();
        let tests = tests
            .iter()
            .map(|(f, t)| {
                let name = format!("{f}::{t}");
                let line = results
                    .lines()
                    .find(|l| l.split('\t').next() == Some(name.as_str()));
                let Some(line) = line else {
                    let hung = killed.as_ref().filter(|k| k.step.as_ref() == Some(&name));
                    return TestRun {
                        name,
                        outcome: hung.map_or(Outcome::NotRun, |k| {
                            Outcome::Failed(format!(
                                "        | the guest was killed in it: {}",
                                k.why
                            ))
                        }),
                        secs: 0,
                    };
                };
                let mut cols = line.split('\t').skip(1);
                let status: i32 = cols.next().and_then(|s| s.parse().ok()).unwrap_or(-1);
                let secs = cols.next().and_then(|s| s.parse().ok()).unwrap_or(0);
                let log = std::fs::read_to_string(rwdir.join("logs").join(format!("{name}.log")))
                    .unwrap_or_default();
                let outcome = outcome(status, &log, skip_reason(&skips, t));
                TestRun {
                    name,
                    outcome,
                    secs,
                }
            })
            .collect();
        KernelRun {
            kernel: *k,
            release: release.to_string(),
            accel: Some(accel),
            probe: std::fs::read_to_string(rwdir.join("probe.txt")).unwrap_or_default(),
            tests,
            wall: Duration::ZERO,
            skipped: None,
            notes: Vec::new(),
            speed: std::fs::read_to_string(rwdir.join("speed.txt"))
                .ok()
                .and_then(|s| parse_factor(&s)),
            default_factor: 0.0,
            killed,
        }
    }

    /// The tests that wait for a feature of the profiler (test file, test, what it waits
    /// for), reported as such after the tests run.
    pub fn add_pending(&mut self, pending: &[(&str, &str, &str)]) {
        for (f, t, why) in pending {
            self.tests.push(TestRun {
                name: format!("{f}::{t}"),
                outcome: Outcome::Pending((*why).to_string()),
                secs: 0,
            });
        }
    }

    /// (passed, failed, skipped); a test the guest never reached is a failure.
    pub fn counts(&self) -> (u64, u64, u64) {
        let mut c = (0, 0, 0);
        for t in &self.tests {
            match t.outcome {
                Outcome::Passed => c.0 += 1,
                Outcome::Failed(_) | Outcome::NotRun => c.1 += 1,
                Outcome::Skipped(_) | Outcome::Pending(_) => c.2 += 1,
            }
        }
        c
    }

    /// The block the suite prints for this kernel.
    pub fn render(&self) -> String {
        let k = &self.kernel;
        let (p, f, s) = self.counts();
        let mut out = String::new();
        if let Some(why) = &self.skipped {
            let _ = writeln!(
                out,
                "kernel {} ({} {}): skipped: {why}",
                k.name,
                k.suite,
                k.arch.debian()
            );
            for n in &self.notes {
                let _ = writeln!(out, "    note   {n}");
            }
            return out;
        }
        let accel = self.accel.map(|a| a.to_string()).unwrap_or_default();
        let _ = writeln!(
            out,
            "kernel {} (Linux {}, Debian {} {}, {accel}): {p} passed, {f} failed, {s} skipped in {:.0} s",
            k.name,
            self.release.trim(),
            k.suite,
            k.arch.debian(),
            self.wall.as_secs_f64()
        );
        for n in &self.notes {
            let _ = writeln!(out, "    note   {n}");
        }
        let _ = match self.speed {
            Some(f) => writeln!(out, "    speed factor {f}"),
            None => writeln!(
                out,
                "    speed factor not measured (the limits took {})",
                self.default_factor
            ),
        };
        if let Some(k) = &self.killed {
            let _ = writeln!(out, "    killed by its watch: {}", k.why);
        }
        for line in self.probe.lines().filter(|l| !l.starts_with("kernel:")) {
            let _ = writeln!(out, "    probe  {line}");
        }
        for t in &self.tests {
            let (word, detail) = match &t.outcome {
                Outcome::Passed => ("ok", String::new()),
                Outcome::Failed(why) => ("FAILED", format!("\n{why}")),
                Outcome::Skipped(why) => ("skipped", format!(" ({why})")),
                Outcome::NotRun => ("NOT RUN", " (the guest ended before it)".into()),
                Outcome::Pending(why) => ("pending", format!(" (not run: {why})")),
            };
            let _ = match &t.outcome {
                Outcome::Pending(_) => writeln!(out, "    {word:7} {}{detail}", t.name),
                _ => writeln!(out, "    {word:7} {} ({} s){detail}", t.name, t.secs),
            };
        }
        out
    }
}

/// The reason the skip file gives for `test`, if it recorded one.
fn skip_reason(skips: &str, test: &str) -> Option<String> {
    skips.lines().find_map(|l| {
        let (name, why) = l.split_once('\t')?;
        (name.rsplit("::").next() == Some(test)).then(|| why.to_string())
    })
}

/// A test's outcome from its exit status and output (libtest's own words).
fn outcome(status: i32, log: &str, skipped: Option<String>) -> Outcome {
    let ran_one = log.contains("test result: ok. 1 passed");
    match (status, skipped) {
        (0, Some(why)) if ran_one => Outcome::Skipped(why),
        (0, None) if ran_one => Outcome::Passed,
        (0, _) => Outcome::Failed("no such test in its binary (0 run)".into()),
        (124, _) => Outcome::Failed(format!("timed out; its output ended:\n{}", tail(log, 15))),
        (_, _) => Outcome::Failed(tail(log, 40)),
    }
}

/// The last `n` lines of a log, indented.
fn tail(log: &str, n: usize) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| format!("        | {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_come_from_status_output_and_skips() {
        let ok = "running 1 test\ntest x ... ok\n\ntest result: ok. 1 passed; 0 failed; 0 ignored";
        assert_eq!(outcome(0, ok, None), Outcome::Passed);
        assert_eq!(
            outcome(0, ok, Some("no node".into())),
            Outcome::Skipped("no node".into())
        );
        let none = "running 0 tests\n\ntest result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 12 filtered out";
        assert!(matches!(outcome(0, none, None), Outcome::Failed(w) if w.contains("no such test")));
        assert!(
            matches!(outcome(124, "a\nb", None), Outcome::Failed(w) if w.contains("timed out"))
        );
        assert!(
            matches!(outcome(101, "panicked at x", None), Outcome::Failed(w) if w.contains("panicked at x"))
        );
    }

    #[test]
    fn skips_are_found_by_test_name() {
        let skips = "profiler::duration_ends_the_run\tno tracepoints\n";
        assert_eq!(
            skip_reason(skips, "duration_ends_the_run").as_deref(),
            Some("no tracepoints")
        );
        assert_eq!(skip_reason(skips, "other"), None);
    }

    #[test]
    fn a_kernel_not_had_skips_each_of_its_tests() {
        let k = super::super::KERNELS[0];
        let r = KernelRun::skipped(&k, &[("a", "b"), ("c", "d")], "no network".into());
        assert_eq!(r.counts(), (0, 0, 2));
        assert!(
            r.render()
                .contains("kernel 6.1 (bookworm amd64): skipped: no network")
        );
    }

    /// A test waiting for a feature of the profiler is not run, is said so with what it
    /// waits for, and counts as skipped.
    #[test]
    fn a_pending_test_is_said_and_counted_skipped() {
        let k = super::super::KERNELS[4];
        let mut r = KernelRun::skipped(&k, &[("a", "b")], "x".into());
        r.skipped = None;
        r.tests[0].outcome = Outcome::Passed;
        r.add_pending(&[("agent", "short", "causes are not read on arm64 yet")]);
        assert_eq!(r.counts(), (1, 0, 1));
        let text = r.render();
        assert!(
            text.contains("    pending agent::short (not run: causes are not read on arm64 yet)\n"),
            "{text}"
        );
    }

    #[test]
    fn a_reboot_after_a_crash_is_said_under_the_kernel() {
        let k = super::super::KERNELS[2];
        let mut r = KernelRun::skipped(&k, &[("a", "b")], "no network".into());
        r.skipped = None;
        r.tests[0].outcome = Outcome::Passed;
        r.notes = vec![
            "boot 1: the guest kernel crashed after 0 passed and 1 failed or not run: Oops: int3"
                .into(),
        ];
        let text = r.render();
        assert!(text.contains("1 passed, 0 failed"), "{text}");
        assert!(
            text.contains("    note   boot 1: the guest kernel crashed"),
            "{text}"
        );
    }

    /// A guest killed in a test: the tests before it have their results, it fails naming the
    /// limit, the rest were not run; the block says the factor and why the guest was killed.
    #[test]
    fn a_killed_guest_names_the_test_it_was_in() {
        let dir = std::env::temp_dir().join(format!("xtask-report-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("logs")).unwrap();
        std::fs::write(dir.join("results.tsv"), "a::one\t0\t12\n").unwrap();
        std::fs::write(
            dir.join("logs/a::one.log"),
            "test result: ok. 1 passed; 0 failed",
        )
        .unwrap();
        std::fs::write(dir.join("speed.txt"), "14.2\n").unwrap();
        let k = super::super::KERNELS[0];
        let tests = [("a", "one"), ("a", "two"), ("a", "three")];
        let killed = Killed {
            step: Some("a::two".into()),
            why: "a::two ran for 1000 s, past its limit of 852 s".into(),
        };
        let r = KernelRun::read(&k, &tests, "6.1.0", Accel::Tcg, &dir, Some(killed.clone()));
        let outcomes: Vec<&Outcome> = r.tests.iter().map(|t| &t.outcome).collect();
        assert_eq!(outcomes[0], &Outcome::Passed);
        assert!(
            matches!(outcomes[1], Outcome::Failed(w) if w.contains("killed in it: a::two ran for 1000 s")),
            "{outcomes:?}"
        );
        assert_eq!(outcomes[2], &Outcome::NotRun);
        let text = r.render();
        assert!(text.contains("    speed factor 14.2\n"), "{text}");
        assert!(
            text.contains(
                "    killed by its watch: a::two ran for 1000 s, past its limit of 852 s"
            ),
            "{text}"
        );
        // Killed before its script began: the kernel's tests are skipped, with the reason.
        let boot = Killed {
            step: None,
            why: "the guest had not started its script 300 s after its boot began".into(),
        };
        let r = KernelRun::read(&k, &tests, "6.1.0", Accel::Tcg, &dir, Some(boot));
        assert_eq!(r.counts(), (0, 0, 3));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
