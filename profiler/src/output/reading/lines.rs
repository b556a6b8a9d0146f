//! The lines other than reports that `report` and `compare` read: a demo's summaries and a
//! study's results, as far as their pages draw them and the findings quote them.

use serde::Deserialize;

use crate::output::{
    compare::Spread,
    report::{Report, Stats},
};

/// `mmaplock-prof demo --format json`: a summary per run.
#[derive(Deserialize)]
pub struct DemoLine {
    pub runs: Vec<DemoRun>,
}

#[derive(Deserialize)]
pub struct DemoRun {
    pub report: Report,
}

/// A study's `results.json`, as far as its page draws it and the findings quote it.
#[derive(Deserialize)]
pub struct StudyLine {
    pub runs: Vec<StudyRun>,
    pub ranking_text: Option<String>,
    /// The study's host.
    #[serde(default)]
    pub machine: StudyMachine,
    /// Runs of every cell (absent before repeats: one).
    pub repeat: Option<u32>,
    /// Each scenario against `default`, with Worker threads, per file size.
    #[serde(default)]
    pub ranking: Vec<StudyRanked>,
    /// The investigation's claims judged (absent from studies without repeats).
    pub claims: Option<Vec<StudyClaim>>,
}

#[derive(Default, Deserialize)]
#[serde(default)]
pub struct StudyMachine {
    pub kernel: String,
    pub node: String,
    pub cpus: u64,
}

/// One row of a study's ranking. Studies without repeats have the ratios alone.
#[derive(Deserialize)]
pub struct StudyRanked {
    pub file_kib: f64,
    pub scenario: String,
    pub throughput_ratio: f64,
    pub writes_ratio: f64,
    pub throughput: Option<Spread>,
    pub writes: Option<Spread>,
    pub throughput_verdict: Option<String>,
    pub writes_verdict: Option<String>,
}

/// One of the investigation's claims, judged on the study's runs.
#[derive(Deserialize)]
pub struct StudyClaim {
    pub scenario: String,
    pub claim: String,
    pub verdict: String,
    pub throughput: Option<Spread>,
    pub writes: Option<Spread>,
}

#[derive(Deserialize)]
pub struct StudyRun {
    pub scenario: String,
    pub mode: String,
    pub k: u32,
    pub file_kib: f64,
    pub ops_per_s: f64,
    /// Write acquisitions pooled over the run's processes.
    pub write: Stats,
}
