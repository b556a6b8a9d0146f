//! Where reports go: a file or standard output, in one of the output formats.

use std::{
    fs::File,
    io::{self, BufWriter, Write},
    path::PathBuf,
};

use crate::{
    cli::Format,
    output::{JsonLines, Output, Text, html::HtmlRecorder, report::Report},
};

use crate::run::SessionError;

/// Where reports go, and in which format.
pub struct Sink {
    out: Box<dyn Write>,
    format: Format,
    output: Box<dyn Output>,
    /// The reader went away (e.g. `| head`): keep profiling quietly, write nothing more.
    closed: bool,
    /// `--html FILE`: every report is kept for the page written at the end.
    pub html: Option<HtmlRecorder>,
}

impl Sink {
    pub fn open(output: Option<&PathBuf>, format: Format) -> Result<Self, SessionError> {
        let out: Box<dyn Write> = match output {
            Some(p) => Box::new(BufWriter::new(
                File::create(p).map_err(|e| SessionError::OpenOutput(p.clone(), e))?,
            )),
            None => Box::new(io::stdout()),
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
            html: None,
        })
    }

    pub fn format(&self) -> Format {
        self.format
    }

    /// Writes a report, then frees it.
    pub fn write_report(&mut self, r: Report) -> Result<(), SessionError> {
        if let Some(h) = self.html.as_mut() {
            h.emit(&r, &mut io::sink()).map_err(SessionError::Write)?;
        }
        if self.closed {
            return Ok(());
        }
        let res = self
            .output
            .emit(&r, &mut self.out)
            .and_then(|()| self.out.flush());
        let threads: usize = r.processes.iter().map(|p| p.threads.len()).sum();
        drop(r);
        if threads > 1000 {
            // Building it took megabytes that glibc keeps for later otherwise; give them back
            // so that a long-running agent's footprint is its steady state.
            // SAFETY: malloc_trim only releases free memory.
            unsafe { libc::malloc_trim(0) };
        }
        match res {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(())
            }
            Err(e) => Err(SessionError::Write(e)),
        }
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

    pub fn write_str(&mut self, s: &str) -> Result<(), SessionError> {
        if self.closed {
            return Ok(());
        }
        match self
            .out
            .write_all(s.as_bytes())
            .and_then(|_| self.out.flush())
        {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(())
            }
            Err(e) => Err(SessionError::Write(e)),
        }
    }
}
