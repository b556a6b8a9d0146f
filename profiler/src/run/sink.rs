//! Where reports go: a file or standard output, in one of the output formats. Each report is
//! rendered whole, then written in one go ([`LineFile`]): a file never holds half a report. A
//! file named on the command line is emptied only once the run has attached
//! ([`Sink::begin`]); a write that fails during the run (a full disk) is said once and tried
//! again with the next report, the run's totals staying in memory; only the summary's failure
//! fails the run.

use std::{
    io::{self, Write},
    path::PathBuf,
};

use crate::{
    output::{
        JsonLines, Output, Text,
        html::HtmlRecorder,
        lines::{LineFile, Pending, Trouble},
        report::{Kind, Report},
    },
    run::SessionError,
    vocab::Format,
};

enum Out {
    Stdout,
    /// Opened, not yet emptied (before the run has attached).
    Pending(Pending),
    File(PathBuf, LineFile),
}

/// Where reports go, and in which format.
pub struct Sink {
    out: Out,
    format: Format,
    output: Box<dyn Output>,
    /// The reader went away (e.g. `| head`): keep profiling quietly, write nothing more.
    closed: bool,
    trouble: Trouble,
    /// `--html FILE`: every report is kept for the page written at the end.
    pub html: Option<HtmlRecorder>,
}

impl Sink {
    /// Opens the output (failing now if it cannot be written) without changing it yet.
    pub fn open(output: Option<&PathBuf>, format: Format) -> Result<Self, SessionError> {
        let out = match output {
            Some(p) => {
                Out::Pending(Pending::open(p).map_err(|e| SessionError::OpenOutput(p.clone(), e))?)
            }
            None => Out::Stdout,
        };
        let output: Box<dyn Output> = match format {
            Format::Json => Box::new(JsonLines),
            Format::Text => Box::new(Text),
        };
        Ok(Sink {
            out,
            format,
            output,
            closed: false,
            trouble: Trouble::default(),
            html: None,
        })
    }

    /// The run has attached: an output file is emptied now.
    pub fn begin(&mut self) -> Result<(), SessionError> {
        if let Out::Pending(_) = &self.out {
            let Out::Pending(p) = std::mem::replace(&mut self.out, Out::Stdout) else {
                unreachable!()
            };
            let path = p.path().to_path_buf();
            let file = p
                .commit()
                .and_then(LineFile::new)
                .map_err(|e| SessionError::OpenOutput(path.clone(), e))?;
            self.out = Out::File(path, file);
        }
        Ok(())
    }

    pub fn format(&self) -> Format {
        self.format
    }

    fn name(&self) -> String {
        match &self.out {
            Out::File(p, _) => p.display().to_string(),
            Out::Pending(p) => p.path().display().to_string(),
            Out::Stdout => "standard output".into(),
        }
    }

    /// Writes one whole record; `last`: the run's final record (its failure is an error).
    fn write_record(&mut self, record: &[u8], last: bool) -> Result<(), SessionError> {
        if self.closed {
            return Ok(());
        }
        self.begin()?;
        let res = match &mut self.out {
            Out::File(_, f) => f.write_record(record),
            _ => {
                let mut out = io::stdout().lock();
                out.write_all(record).and_then(|()| out.flush())
            }
        };
        match res {
            Ok(()) => {
                self.trouble.worked(&self.name());
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(())
            }
            Err(e) if !last => {
                self.trouble.failed(
                    &self.name(),
                    &e,
                    "the run goes on (its totals are kept); the next reports and the summary are tried again",
                );
                Ok(())
            }
            Err(e) => Err(match &self.out {
                Out::File(p, _) => SessionError::OpenOutput(p.clone(), e),
                _ => SessionError::Write(e),
            }),
        }
    }

    /// Writes a report, then frees it.
    pub fn write_report(&mut self, r: Report) -> Result<(), SessionError> {
        if let Some(h) = self.html.as_mut() {
            h.emit(&r, &mut io::sink()).map_err(SessionError::Write)?;
        }
        if self.closed {
            return Ok(());
        }
        let mut record = Vec::new();
        self.output
            .emit(&r, &mut record)
            .map_err(SessionError::Write)?;
        let last = matches!(r.kind, Kind::Summary);
        let threads: usize = r.processes.iter().map(|p| p.threads.len()).sum();
        drop(r);
        let res = self.write_record(&record, last);
        drop(record);
        if threads > 1000 {
            // Building it took megabytes that glibc keeps for later otherwise; give them back
            // so that a long-running agent's footprint is its steady state.
            // SAFETY: malloc_trim only releases free memory.
            unsafe { libc::malloc_trim(0) };
        }
        res
    }

    /// Writes the `--html` page, if asked (at the end of a run, after the summary).
    pub fn finish_html(&self) -> Result<(), SessionError> {
        match &self.html {
            Some(h) => h
                .finish()
                .map_err(|e| SessionError::OpenOutput(h.path.clone(), e)),
            None => Ok(()),
        }
    }

    /// Writes a whole final text (the demo's result).
    pub fn write_str(&mut self, s: &str) -> Result<(), SessionError> {
        self.write_record(s.as_bytes(), true)
    }
}
