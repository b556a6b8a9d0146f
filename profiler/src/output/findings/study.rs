//! The measured effect of each mitigation on this host, from a study's `results.json`
//! (`--study`): its ranking with Worker threads, per file size, with the spread over the
//! study's repeated runs.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A study file that cannot be used: bad usage (exit 2), in one line.
#[derive(Debug, thiserror::Error)]
pub enum StudyFileError {
    #[error("cannot read the study {0}: {1}")]
    Read(String, #[source] std::io::Error),
    #[error(
        "{0} is not a study's results.json (mmaplock-prof study --out DIR writes DIR/results.json): {1}"
    )]
    NotStudy(String, String),
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
    /// Reads a study's results.json.
    pub fn load(path: &Path) -> Result<StudyEffects, StudyFileError> {
        let name = path.display().to_string();
        let text =
            std::fs::read_to_string(path).map_err(|e| StudyFileError::Read(name.clone(), e))?;
        let v: Value = serde_json::from_str(text.trim())
            .map_err(|e| StudyFileError::NotStudy(name.clone(), e.to_string()))?;
        Self::from_study(&v).ok_or_else(|| {
            StudyFileError::NotStudy(name, "no \"type\":\"study\" line with a ranking".into())
        })
    }

    /// From a study line; None when it is not one.
    pub fn from_study(v: &Value) -> Option<StudyEffects> {
        if v["type"] != "study" {
            return None;
        }
        let m = &v["machine"];
        let machine = format!(
            "Linux {}, Node.js {}, {} CPUs",
            m["kernel"].as_str().unwrap_or("?"),
            m["node"].as_str().unwrap_or("?"),
            m["cpus"].as_u64().unwrap_or(0)
        );
        let ratio = |r: &Value, spread: &str, mean: &str| {
            let mean = r[spread]["mean"].as_f64().or(r[mean].as_f64())?;
            Some(Ratio {
                mean,
                min: r[spread]["min"].as_f64().unwrap_or(mean),
                max: r[spread]["max"].as_f64().unwrap_or(mean),
                runs: r[spread]["runs"].as_u64().unwrap_or(1),
            })
        };
        let effects = v["ranking"]
            .as_array()?
            .iter()
            .filter_map(|r| {
                let throughput = ratio(r, "throughput", "throughput_ratio")?;
                Some(Effect {
                    scenario: r["scenario"].as_str()?.to_string(),
                    file_kib: r["file_kib"].as_f64()?,
                    writes: ratio(r, "writes", "writes_ratio")?,
                    verdict: r["throughput_verdict"]
                        .as_str()
                        .unwrap_or(if throughput.runs > 1 {
                            "within noise"
                        } else {
                            "one run"
                        })
                        .to_string(),
                    throughput,
                })
            })
            .collect();
        Some(StudyEffects { machine, effects })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn effects_with_and_without_spreads() {
        let v = serde_json::json!({"type":"study","machine":{"kernel":"6.18","node":"v20","cpus":2},
            "ranking":[
              {"file_kib":64.0,"scenario":"arena-1","throughput_ratio":1.2,"writes_ratio":0.5,
               "throughput":{"mean":1.2,"min":1.1,"max":1.3,"runs":3},
               "writes":{"mean":0.5,"min":0.4,"max":0.6,"runs":3},"throughput_verdict":"changed"},
              {"file_kib":1024.0,"scenario":"arena-1","throughput_ratio":1.4,"writes_ratio":1.0},
              {"file_kib":64.0,"scenario":"reuse","throughput_ratio":3.0,"writes_ratio":0.2}]});
        let s = StudyEffects::from_study(&v).unwrap();
        assert_eq!(s.machine, "Linux 6.18, Node.js v20, 2 CPUs");
        let a = s.of(&["arena-1", "jemalloc"]);
        assert_eq!(a.len(), 2);
        assert_eq!((a[0].throughput.min, a[0].throughput.runs), (1.1, 3));
        assert_eq!(a[0].verdict, "changed");
        // An older study: one run, no spread.
        assert_eq!((a[1].throughput.min, a[1].throughput.max), (1.4, 1.4));
        assert_eq!(a[1].verdict, "one run");
        assert!(StudyEffects::from_study(&serde_json::json!({"type":"summary"})).is_none());
    }
}
