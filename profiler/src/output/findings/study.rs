//! The measured effect of each mitigation on this host, from a study's `results.json`
//! (`--study`): its ranking with Worker threads, per file size, with the spread over the
//! study's repeated runs.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::output::{
    compare::Spread,
    reading::{self, InputError, Line, StudyLine},
};

/// A study file that cannot be used: bad usage (exit 2), in one line.
#[derive(Debug, thiserror::Error)]
pub enum StudyFileError {
    #[error(transparent)]
    Input(#[from] InputError),
    #[error(
        "{0} is not a study's results.json (mmaplock-prof study --out DIR writes DIR/results.json): no \"type\":\"study\" line"
    )]
    NotStudy(String),
}

/// A ratio against `default` over the study's runs.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Ratio {
    pub mean: f64,
    pub min: f64,
    pub max: f64,
    /// Repeated runs behind it (1 for studies without repeats).
    pub runs: u64,
}

/// One scenario's measured effect with Worker threads at one file size.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Effect {
    pub scenario: String,
    pub file_kib: f64,
    pub throughput: Ratio,
    pub writes: Ratio,
    /// Against `default`: `changed`, `within noise` or `one run`, as `compare` judges.
    pub verdict: String,
}

/// What a study measured on its host.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StudyEffects {
    /// The host, as the study described it (kernel, Node.js, CPUs).
    pub machine: String,
    pub effects: Vec<Effect>,
}

impl StudyEffects {
    /// Reads a study's results.json, strictly as `report` reads it.
    pub fn load(path: &Path) -> Result<StudyEffects, StudyFileError> {
        let mut study = None;
        reading::read_file(path, |l| {
            if let Line::Study(s) = l {
                study.get_or_insert(s);
            }
        })?;
        study
            .map(|s| Self::from_study(&s))
            .ok_or_else(|| StudyFileError::NotStudy(path.display().to_string()))
    }

    /// From a study line.
    pub fn from_study(s: &StudyLine) -> StudyEffects {
        let m = &s.machine;
        let machine = format!(
            "Linux {}, Node.js {}, {} CPUs",
            or_unknown(&m.kernel),
            or_unknown(&m.node),
            m.cpus
        );
        // Studies without repeats have the mean ratio alone.
        let ratio = |spread: Option<&Spread>, mean: f64| match spread {
            Some(r) => Ratio {
                mean: r.mean,
                min: r.min,
                max: r.max,
                runs: r.runs as u64,
            },
            None => Ratio {
                mean,
                min: mean,
                max: mean,
                runs: 1,
            },
        };
        let effects = s
            .ranking
            .iter()
            .map(|r| {
                let throughput = ratio(r.throughput.as_ref(), r.throughput_ratio);
                Effect {
                    scenario: r.scenario.clone(),
                    file_kib: r.file_kib,
                    writes: ratio(r.writes.as_ref(), r.writes_ratio),
                    verdict: r.throughput_verdict.clone().unwrap_or_else(|| {
                        if throughput.runs > 1 {
                            "within noise"
                        } else {
                            "one run"
                        }
                        .to_string()
                    }),
                    throughput,
                }
            })
            .collect();
        StudyEffects { machine, effects }
    }

    /// The effects of these scenarios, in the order given, every file size.
    pub fn of(&self, scenarios: &[&str]) -> Vec<Effect> {
        let mut out = Vec::new();
        for s in scenarios {
            let mut rows: Vec<&Effect> = self.effects.iter().filter(|e| e.scenario == *s).collect();
            rows.sort_by(|a, b| a.file_kib.total_cmp(&b.file_kib));
            out.extend(rows.into_iter().cloned());
        }
        out
    }
}

fn or_unknown(s: &str) -> &str {
    if s.is_empty() { "?" } else { s }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A study line, read as a file's.
    pub(crate) fn study_line(v: serde_json::Value) -> StudyLine {
        let mut out = None;
        reading::read("results.json", v.to_string().as_bytes(), |l| {
            if let Line::Study(s) = l {
                out = Some(s);
            }
        })
        .unwrap();
        out.expect("a study line")
    }

    #[test]
    fn effects_with_and_without_spreads() {
        let v = serde_json::json!({"type":"study","schema_version":1,"runs":[],
            "machine":{"kernel":"6.18","node":"v20","cpus":2},
            "ranking":[
              {"file_kib":64.0,"scenario":"arena-1","throughput_ratio":1.2,"writes_ratio":0.5,
               "throughput":{"mean":1.2,"min":1.1,"max":1.3,"runs":3},
               "writes":{"mean":0.5,"min":0.4,"max":0.6,"runs":3},"throughput_verdict":"changed"},
              {"file_kib":1024.0,"scenario":"arena-1","throughput_ratio":1.4,"writes_ratio":1.0},
              {"file_kib":64.0,"scenario":"reuse","throughput_ratio":3.0,"writes_ratio":0.2}]});
        let s = StudyEffects::from_study(&study_line(v));
        assert_eq!(s.machine, "Linux 6.18, Node.js v20, 2 CPUs");
        let a = s.of(&["arena-1", "jemalloc"]);
        assert_eq!(a.len(), 2);
        assert_eq!((a[0].throughput.min, a[0].throughput.runs), (1.1, 3));
        assert_eq!(a[0].verdict, "changed");
        // An older study: one run, no spread.
        assert_eq!((a[1].throughput.min, a[1].throughput.max), (1.4, 1.4));
        assert_eq!(a[1].verdict, "one run");
    }

    #[test]
    fn a_file_that_is_not_a_study_is_refused_in_one_line() {
        let (dir, run) = crate::vocab::scratch::scratch("run.json");
        std::fs::write(&run, crate::output::fixtures::summary_line() + "\n").unwrap();
        let e = StudyEffects::load(&run).unwrap_err().to_string();
        assert!(e.contains("is not a study's results.json"), "{e}");
        let bad = dir.path().join("bad.json");
        std::fs::write(
            &bad,
            r#"{"type":"study","schema_version":1,"runs":[],"ranking":[{"scenario":"x"}]}"#,
        )
        .unwrap();
        let e = StudyEffects::load(&bad).unwrap_err().to_string();
        assert!(
            e.ends_with("bad.json:1: ranking[0].file_kib: missing"),
            "{e}"
        );
    }
}
