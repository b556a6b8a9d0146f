//! How long a guest may take, and the watch that kills a hung one and names what hung. The
//! limits are per step (the boot, the speed measurement, the probes, each test, the
//! power-off), scaled by the guest's own speed factor: they catch a hang, never a slow run.
//! The guest script (`super::guest_script`) writes the step it starts, with its limit, to
//! `current` in the shared directory; the host reads it and times the step on its own clock.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use super::guest::Accel;

/// The variable in which xtask gives the tests this machine's speed factor (how many times
/// slower than the reference machine it is, >= 1); inside a guest, the guest's own
/// measurement replaces it.
pub const SPEED_ENV: &str = "MMAPLOCK_PROF_TEST_SPEED";

/// A test's limit at speed factor 1, in seconds. Under TCG on this machine kind (two or
/// four guests at once on two loaded cores) the guests measured factors of 15-56 and the
/// subset's tests took 10-80 s: about 2 s each at factor 1. On a real CPU a test's fixed
/// costs (Node's start, an attach) weigh more than the factor says; 60 s leaves room for
/// them and still ends a hung test.
pub const TEST_BASE_S: u32 = 60;
/// The longest a test's limit may be at host factor 1, in seconds, whatever the guest's
/// factor: the guests' factors (15-72 here) say how much slower process starts and syscalls
/// are under TCG, not how much longer a test takes (10-80 s at every factor), and a hung test
/// must end in a fraction of the suite's budget (at factor 72, 60 s scaled is 72 minutes).
pub const TEST_MOST_S: u32 = 600;

/// [`TEST_MOST_S`] on this host.
pub fn test_most_s(host: f64) -> u64 {
    (f64::from(TEST_MOST_S) * host).round() as u64
}

/// The probes', the speed measurement's and the power-off's limit at factor 1 (each took
/// under a second's worth in the guests).
pub const STEP_BASE_S: u32 = 20;
/// After its limit a test has this long to end on SIGTERM before `timeout` kills it.
pub const KILL_AFTER_S: u32 = 30;

/// The guest's factor when it could not measure one (no `speed-factor` binary, or it
/// failed), times the host's: above the 40-56 the TCG guests measured here, and a few times
/// a real CPU's under KVM.
pub fn default_factor(accel: Accel, host: f64) -> f64 {
    host * match accel {
        Accel::Tcg => 60.0,
        Accel::Kvm => 4.0,
    }
}

/// This machine's own factor, as xtask exported it (1 when it did not).
pub fn host_factor() -> f64 {
    std::env::var(SPEED_ENV)
        .ok()
        .and_then(|v| parse_factor(&v))
        .unwrap_or(1.0)
}

/// A speed factor as `speed-factor` prints it (`2.37`), at least 1.
pub fn parse_factor(text: &str) -> Option<f64> {
    let f: f64 = text.trim().parse().ok()?;
    f.is_finite().then_some(f.max(1.0))
}

/// Until the guest script starts its first step: booting (15-35 s under TCG here, with
/// every guest at once on two cores).
fn boot_limit(host: f64) -> Duration {
    Duration::from_secs_f64(300.0 * host)
}

/// Beyond a step's own limit, the host gives the guest this long (its `timeout` kills the
/// test first, and the script goes on to the next step).
fn grace(host: f64) -> Duration {
    Duration::from_secs_f64(f64::from(KILL_AFTER_S) + 60.0 * host)
}

/// What the guest has begun, as the host saw it.
#[derive(Debug)]
struct Step {
    name: String,
    limit: Duration,
    since: Instant,
}

/// The watch over one guest run.
#[derive(Debug)]
pub struct Watch {
    current: PathBuf,
    host: f64,
    started: Instant,
    step: Option<Step>,
}

impl Watch {
    pub fn new(rwdir: &Path, host: f64) -> Self {
        Watch {
            current: rwdir.join("current"),
            host,
            started: Instant::now(),
            step: None,
        }
    }

    /// Why the guest must be killed now, if it must: the step it is stuck in and for how
    /// long.
    pub fn check(&mut self, now: Instant) -> Option<Killed> {
        if let Some((name, limit)) = std::fs::read_to_string(&self.current)
            .ok()
            .and_then(|c| parse_current(&c))
            && self.step.as_ref().is_none_or(|s| s.name != name)
        {
            self.step = Some(Step {
                name,
                limit,
                since: now,
            });
        }
        match &self.step {
            None => {
                let limit = boot_limit(self.host);
                (now - self.started > limit).then(|| Killed {
                    step: None,
                    why: format!(
                        "the guest had not started its script {:.0} s after its boot began",
                        limit.as_secs_f64()
                    ),
                })
            }
            Some(s) => {
                let ran = now - s.since;
                (ran > s.limit + grace(self.host)).then(|| Killed {
                    step: Some(s.name.clone()),
                    why: format!(
                        "{} ran for {:.0} s, past its limit of {:.0} s",
                        s.name,
                        ran.as_secs_f64(),
                        s.limit.as_secs_f64()
                    ),
                })
            }
        }
    }
}

/// A guest killed by its watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Killed {
    /// The step it was in (`file::test`, `probe-kernel`, `power-off`...), None while booting.
    pub step: Option<String>,
    pub why: String,
}

/// `current` is `STEP\tLIMIT_S\n`.
fn parse_current(text: &str) -> Option<(String, Duration)> {
    let (name, limit) = text.trim().split_once('\t')?;
    let limit: u64 = limit.trim().parse().ok()?;
    Some((name.to_string(), Duration::from_secs(limit)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn factors_are_read_as_printed() {
        assert_eq!(parse_factor("2.37\n"), Some(2.37));
        assert_eq!(parse_factor("0.8"), Some(1.0));
        assert_eq!(parse_factor("fast"), None);
        assert_eq!(parse_factor("NaN"), None);
        assert_eq!(default_factor(Accel::Tcg, 2.0), 120.0);
    }

    /// The watch names the step that overran, timed from when the host saw it begin.
    #[test]
    fn a_step_past_its_limit_is_named() {
        let dir = std::env::temp_dir().join(format!("xtask-watch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut w = Watch::new(&dir, 1.0);
        let t0 = w.started;
        assert_eq!(w.check(t0 + Duration::from_secs(299)), None);
        let boot = w.check(t0 + Duration::from_secs(301)).unwrap();
        assert_eq!(boot.step, None);
        assert!(boot.why.contains("300 s after its boot"), "{}", boot.why);

        let mut w = Watch::new(&dir, 1.0);
        std::fs::write(dir.join("current"), "fidelity::fork\t600\n").unwrap();
        let seen = t0 + Duration::from_secs(50);
        assert_eq!(w.check(seen), None);
        // 600 s, and the grace: 30 s for `timeout -k`, 60 s more.
        assert_eq!(w.check(seen + Duration::from_secs(690)), None);
        let k = w.check(seen + Duration::from_secs(691)).unwrap();
        assert_eq!(k.step.as_deref(), Some("fidelity::fork"));
        assert!(
            k.why
                .contains("fidelity::fork ran for 691 s, past its limit of 600 s"),
            "{}",
            k.why
        );
        // A new step restarts the clock.
        std::fs::write(dir.join("current"), "fidelity::munmap\t600\n").unwrap();
        assert_eq!(w.check(seen + Duration::from_secs(700)), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn current_is_a_step_and_its_limit() {
        assert_eq!(
            parse_current("kernel::x\t1200\n"),
            Some(("kernel::x".into(), Duration::from_secs(1200)))
        );
        assert_eq!(parse_current(""), None);
        assert_eq!(parse_current("kernel::x\t\n"), None);
    }
}
