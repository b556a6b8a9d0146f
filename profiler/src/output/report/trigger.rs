//! Why an agent's capture was taken (`trigger` on a capture's summary,
//! shared/design/agent-and-metrics.md): the window of the agent's intervals in which the
//! process's threads' wait crossed `--escalate-at`, what it was made of (the functions the
//! agent's own samples of it name: what `before.pb.gz` holds), its findings, and how the
//! capture's own time compared, in one line.

use serde::{Deserialize, Serialize};

use crate::output::findings::Finding;

/// A function of the window's samples: waiting for the lock, or holding it while others
/// waited.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TriggerFunction {
    /// `name (script:line:column)` for JavaScript, `function (file)` for native code: the
    /// innermost frame of the application on the sampled stack (the innermost JavaScript
    /// function of the application, else the innermost frame outside the C runtime).
    pub function: String,
    /// What the lock was taken for there (a write cause, or `read`).
    pub cause: String,
    /// Sampled waits: a waiter's own, or the waits charged to a holder.
    pub waits: u64,
    /// Their wait, ns.
    pub wait_ns: u64,
}

/// The process's measure over a span of the agent's intervals: its own threads' wait for its
/// lock over their time alive, as `time_share` counts them, in the agent's mode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TriggerMeasure {
    pub share: f64,
    pub wait_ns: u64,
    pub alive_ns: u64,
    pub waits: u64,
    /// The time it was measured over: the agent's intervals in which the process had a
    /// reading, summed.
    pub window_s: f64,
}

/// `trigger`: see the module's doc and docs/agent.md.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Trigger {
    /// The process captured.
    pub pid: u32,
    pub comm: String,
    /// The process's share over the window that crossed (fraction of its threads' time).
    pub share: f64,
    /// `--escalate-at`, as a fraction.
    pub threshold: f64,
    /// The time the share was measured over, s.
    pub window_s: f64,
    /// Waits in that window.
    pub waits: u64,
    /// When it crossed (RFC 3339): the end of the agent's interval that decided it.
    pub at: String,
    pub wait_ns: u64,
    pub alive_ns: u64,
    /// The window's first interval's start and last interval's end (RFC 3339).
    pub from: String,
    pub to: String,
    /// The agent's mode, in which the window was measured (`contention`: contended waits).
    pub mode: crate::vocab::Mode,
    /// The functions that waited longest in the window's samples (waiters' stacks).
    #[serde(default)]
    pub waiting: Vec<TriggerFunction>,
    /// The functions the window's sampled waits were charged to, holding the lock (holders'
    /// stacks).
    #[serde(default)]
    pub holding: Vec<TriggerFunction>,
    /// Samples of the window (in `before.pb.gz`): the waiters' stacks and the holders'.
    pub sampled: u64,
    /// The window's findings (each `"window": "crossing"`).
    #[serde(default)]
    pub findings: Vec<Finding>,
    /// The same measure during the capture (the agent's intervals while it ran).
    pub capture: Option<TriggerMeasure>,
    /// The capture found the share under the threshold: the contention had passed.
    pub passed: Option<bool>,
    /// What the two windows say, in one line (the page and the text begin with it).
    pub verdict: Option<String>,
}

/// The value of a finding's `window` for the crossing window's findings.
pub const CROSSING: &str = "crossing";
/// The value of a finding's `window` for the capture's own.
pub const CAPTURE: &str = "capture";

/// The trigger as the text report begins with it, and (the same lines) the page.
pub fn lines(t: &Trigger) -> Vec<String> {
    use crate::output::text::{fmt_ns, fmt_share};
    let mut out = vec![format!(
        "why this capture: {} (pid {}) waited {} of its threads' time over {:.1} s ({} waits, {} of {:.1} s of its threads' time; {} mode; threshold {}), crossing at {}",
        t.comm,
        t.pid,
        fmt_share(t.share),
        t.window_s,
        t.waits,
        fmt_ns(t.wait_ns),
        t.alive_ns as f64 / 1e9,
        t.mode,
        fmt_share(t.threshold),
        t.at
    )];
    if let Some(v) = &t.verdict {
        out.push(v.clone());
    }
    let functions = |fs: &[TriggerFunction]| {
        (fs.iter().take(3))
            .map(|f| {
                format!(
                    "{} [{}] {} in {} sampled",
                    f.function,
                    f.cause,
                    fmt_ns(f.wait_ns),
                    f.waits
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    };
    if !t.waiting.is_empty() {
        out.push(format!("waiting in the window: {}", functions(&t.waiting)));
    }
    if !t.holding.is_empty() {
        out.push(format!(
            "holding the lock in the window: {}",
            functions(&t.holding)
        ));
    }
    out.push(format!(
        "the window ({} to {}): {} sampled stacks in before.pb.gz, {} findings (below, \"in the window that crossed\")",
        t.from,
        t.to,
        t.sampled,
        t.findings.len()
    ));
    out
}

/// The verdict's line: the share during the capture against the share when it crossed.
pub fn verdict_line(t: &Trigger) -> Option<String> {
    let c = t.capture.as_ref()?;
    let pct = |x: f64| crate::output::text::fmt_share(x);
    let during = format!(
        "{} during the capture ({:.1} s) against {} when it crossed (over {:.1} s; threshold {})",
        pct(c.share),
        c.window_s,
        pct(t.share),
        t.window_s,
        pct(t.threshold)
    );
    Some(if c.share < t.threshold {
        format!(
            "the contention had passed: {during}; the findings of the window that crossed say what it was"
        )
    } else {
        format!("the contention went on: {during}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trigger(share: f64, capture: Option<f64>) -> Trigger {
        Trigger {
            pid: 42,
            comm: "node".into(),
            share,
            threshold: 0.02,
            window_s: 5.0,
            waits: 120,
            at: "2026-12-01T10:00:05.000Z".into(),
            wait_ns: 0,
            alive_ns: 0,
            from: String::new(),
            to: String::new(),
            mode: crate::vocab::Mode::Contention,
            waiting: Vec::new(),
            holding: Vec::new(),
            sampled: 0,
            findings: Vec::new(),
            capture: capture.map(|s| TriggerMeasure {
                share: s,
                window_s: 15.0,
                ..TriggerMeasure::default()
            }),
            passed: None,
            verdict: None,
        }
    }

    #[test]
    fn the_verdict_says_whether_the_contention_had_passed() {
        let passed = verdict_line(&trigger(0.023, Some(0.004))).unwrap();
        assert!(
            passed.starts_with("the contention had passed: 0.4% during the capture (15.0 s) against 2.3% when it crossed (over 5.0 s; threshold 2.0%)"),
            "{passed}"
        );
        let went_on = verdict_line(&trigger(0.31, Some(0.27))).unwrap();
        assert!(
            went_on.starts_with("the contention went on: 27.0% during"),
            "{went_on}"
        );
        assert!(verdict_line(&trigger(0.31, None)).is_none());
    }
}
