//! Where attach time goes: each step of a load and each program's verification, timed (the
//! report's `overhead.load`, `-v`'s lines, and the bench's attach table).

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// One program's verification.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProgramLoad {
    pub name: String,
    /// Instructions the verifier processed (its own measure of the work; `None` before
    /// Linux 5.16).
    pub verified_insns: Option<u32>,
    /// From handing the program to the kernel to its attachment.
    pub ms: f64,
}

/// Where attach time went.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LoadReport {
    /// From the start of loading to every program attached.
    pub total_ms: f64,
    /// Steps in order: kernel facts (BTF), maps and object, then each program.
    pub steps: Vec<(String, f64)>,
    pub programs: Vec<ProgramLoad>,
}

/// Times the steps of a load.
pub(super) struct Stopwatch {
    t0: Instant,
    last: Instant,
    report: LoadReport,
}

pub(super) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl Stopwatch {
    pub(super) fn new() -> Self {
        let now = Instant::now();
        Stopwatch {
            t0: now,
            last: now,
            report: LoadReport::default(),
        }
    }

    pub(super) fn step(&mut self, name: &str) {
        let now = Instant::now();
        self.report
            .steps
            .push((name.to_string(), ms(now - self.last)));
        log::debug!("{name}: {:?}", now - self.last);
        self.last = now;
    }

    /// A program verified in `ms` (on a thread of its own: not a step of this one).
    pub(super) fn program(&mut self, name: &str, verified_insns: Option<u32>, ms: f64) {
        log::debug!("{name}: {ms:.1} ms, {verified_insns:?} instructions verified");
        self.report.programs.push(ProgramLoad {
            name: name.to_string(),
            verified_insns,
            ms,
        });
    }

    pub(super) fn finish(mut self) -> LoadReport {
        self.report.total_ms = ms(self.t0.elapsed());
        self.report
    }
}
