//! The commands that read files only (no kernel, no privilege): `report` renders a run as
//! HTML, `compare` sets two runs side by side.

use std::{io::Write as _, path::Path};

use crate::{
    cli::{CompareArgs, Format, ReportArgs},
    output::{
        compare::{self, Runs},
        html::{self, RunLines},
        reading::{InputError, Keep},
    },
};

#[derive(Debug, thiserror::Error)]
pub enum OfflineError {
    #[error(transparent)]
    Input(#[from] InputError),
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

pub fn report(args: &ReportArgs) -> Result<(), OfflineError> {
    let run = RunLines::read_file(&args.input)?;
    let name = args
        .input
        .file_name()
        .map_or("run".into(), |n| n.to_string_lossy().into_owned());
    write(&args.html, &html::run_page(&name, &run))
}

pub fn compare(args: &CompareArgs) -> Result<(), OfflineError> {
    let before = Runs::read_file(&args.before)?;
    let after = Runs::read_file(&args.after)?;
    let c = compare::compare(
        (&args.before.display().to_string(), &before),
        (&args.after.display().to_string(), &after),
    );
    if let Some(path) = &args.html {
        write(path, &html::compare::compare_page(&c))?;
    }
    let out = match Format::resolve(args.format, None) {
        Format::Json => serde_json::to_string(&c).expect("plain data") + "\n",
        Format::Text => compare::to_text(&c),
    };
    let mut stdout = std::io::stdout().lock();
    // A closed reader is not an error of ours.
    let _ = stdout.write_all(out.as_bytes());
    Ok(())
}
