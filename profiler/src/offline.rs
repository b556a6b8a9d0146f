//! The commands that read files only (no kernel, no privilege): `report` renders a run as
//! HTML, `compare` sets two runs side by side.

use std::{io::Write as _, path::Path};

use crate::{
    cli::{CompareArgs, Format, ReportArgs},
    output::{
        compare::{self, Runs},
        findings::{self, StudyEffects, StudyFileError},
        html::{self, RunLines},
        reading::{InputError, Keep},
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
    let run = RunLines::read_file(&args.input)?;
    let name = args
        .input
        .file_name()
        .map_or("run".into(), |n| n.to_string_lossy().into_owned());
    // A demo's line holds a summary per run, shown together; otherwise the last run's.
    let all = run.findings(study.as_ref());
    if let Some(path) = &args.html {
        write(path, &html::run_page_with_findings(&name, &run, &all))?;
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
    let before = Runs::read_file(&args.before)?;
    let after = Runs::read_file(&args.after)?;
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
