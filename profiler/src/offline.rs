//! The commands that read files only (no kernel, no privilege): `report` renders a run as
//! HTML, `compare` sets two runs side by side.

use std::{io::Write as _, path::Path};

use crate::{
    cli::{CompareArgs, Format, ReportArgs},
    output::{
        compare,
        findings::{self, Finding, StudyEffects, StudyFileError},
        html::{self, InputError, RunLines},
    },
};

#[derive(Debug, thiserror::Error)]
pub enum OfflineError {
    #[error(transparent)]
    Input(#[from] InputError),
    #[error(transparent)]
    Study(#[from] StudyFileError),
    #[error("cannot write {0}: {1}")]
    Write(String, #[source] std::io::Error),
}

impl OfflineError {
    /// A file that cannot be read or is not a report is bad usage (2); a page that cannot be
    /// written too (the path given is wrong).
    pub fn exit_code(&self) -> u8 {
        2
    }
}

fn write(path: &Path, text: &str) -> Result<(), OfflineError> {
    std::fs::write(path, text).map_err(|e| OfflineError::Write(path.display().to_string(), e))
}

fn study(path: Option<&Path>) -> Result<Option<StudyEffects>, OfflineError> {
    Ok(path.map(StudyEffects::load).transpose()?)
}

/// Prints to standard output; a closed reader is not an error of ours.
fn print(text: &str) {
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}

/// `report`: the findings of the run, recomputed (with the study's effects, if given), printed
/// and put first on the page.
pub fn report(args: &ReportArgs) -> Result<(), OfflineError> {
    let study = study(args.study.as_deref())?;
    let mut run = RunLines::read(&args.input)?;
    let name = args
        .input
        .file_name()
        .map_or("run".into(), |n| n.to_string_lossy().into_owned());
    let mut all: Vec<Finding> = Vec::new();
    // A demo's line holds a summary per run, shown together; otherwise the last run's.
    let demo = run.other.iter().any(|v| v["type"] == "demo");
    let last = run.summaries.len().saturating_sub(1);
    for (i, s) in run.summaries.iter_mut().enumerate() {
        let f = findings::find(s, study.as_ref());
        if demo || i == last {
            all.extend(f.iter().cloned());
        }
        s["findings"] = serde_json::to_value(&f).expect("plain data");
    }
    if run.summaries.is_empty() && !run.intervals.is_empty() {
        all = findings::find(&run.run_summaries()[0], study.as_ref());
    }
    if let Some(path) = &args.html {
        write(path, &html::run_page(&name, &run))?;
    }
    print(&match Format::resolve(args.format, None) {
        Format::Json => {
            serde_json::json!({"type": "findings", "schema_version": crate::output::report::SCHEMA_VERSION,
                "file": args.input.display().to_string(), "findings": all})
            .to_string()
                + "\n"
        }
        Format::Text => {
            let t = findings::to_text(&all);
            if t.is_empty() {
                "no findings\n".to_string()
            } else {
                t.trim_start().to_string()
            }
        }
    });
    Ok(())
}

pub fn compare(args: &CompareArgs) -> Result<(), OfflineError> {
    let study = study(args.study.as_deref())?;
    let before = RunLines::read(&args.before)?;
    let after = RunLines::read(&args.after)?;
    let c = compare::compare(
        (&args.before.display().to_string(), &before),
        (&args.after.display().to_string(), &after),
        study.as_ref(),
    );
    if let Some(path) = &args.html {
        write(path, &html::compare::compare_page(&c))?;
    }
    let out = match Format::resolve(args.format, None) {
        Format::Json => serde_json::to_string(&c).expect("plain data") + "\n",
        Format::Text => compare::to_text(&c),
    };
    print(&out);
    Ok(())
}
