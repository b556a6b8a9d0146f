//! Where reports go: a file or standard output, in one of the output formats, or the agent's
//! rotating file. Each report is rendered whole by its [`Output`], then written in one go
//! ([`LineFile`], [`Rotating`]): a file never holds half a report. A file named on the command
//! line is emptied only once the run has attached ([`Sink::begin`]); a write that fails
//! during the run (a full disk) is said once and tried again with the next report, the run's
//! totals staying in memory; only the final record's failure fails the run.

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
        rotate::Rotating,
    },
    run::SessionError,
    vocab::Format,
};

enum Out {
    Stdout,
    /// Opened, not yet emptied (before the run has attached).
    Pending(Pending),
    File(PathBuf, LineFile),
    /// The agent's NDJSON: appended to, rotated by size.
    Rotating(Rotating),
}

/// Where reports go, and in which format.
pub struct Sink {
    out: Out,
    format: Format,
    output: Box<dyn Output>,
    /// The reader went away (e.g. `| head`): keep profiling quietly, write nothing more.
    closed: bool,
    trouble: Trouble,
    /// What goes on when a write fails, said with the failure.
    going_on: &'static str,
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
        Ok(Sink::new(
            out,
            format,
            "the run goes on (its totals are kept); the next reports and the summary are tried again",
        ))
    }

    /// The agent's rotating file, already open: it is appended to, never emptied.
    pub fn rotating(file: Rotating, format: Format, going_on: &'static str) -> Self {
        Sink::new(Out::Rotating(file), format, going_on)
    }

    fn new(out: Out, format: Format, going_on: &'static str) -> Self {
        let output: Box<dyn Output> = match format {
            Format::Json => Box::new(JsonLines),
            Format::Text => Box::new(Text),
        };
        Sink {
            out,
            format,
            output,
            closed: false,
            trouble: Trouble::default(),
            going_on,
            html: None,
        }
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
            Out::Rotating(r) => r.path().display().to_string(),
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
            Out::Rotating(r) => r.write_record(record),
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
            // A long-running agent's reader may come back: its file is tried again.
            Err(e)
                if e.kind() == io::ErrorKind::BrokenPipe
                    && !matches!(self.out, Out::Rotating(_)) =>
            {
                self.closed = true;
                Ok(())
            }
            Err(e) if !last => {
                self.trouble.failed(&self.name(), &e, self.going_on);
                Ok(())
            }
            Err(e) => Err(match &self.out {
                Out::File(p, _) => SessionError::OpenOutput(p.clone(), e),
                Out::Rotating(r) => SessionError::OpenOutput(r.path().to_path_buf(), e),
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
        let record = render(&mut *self.output, &r)?;
        let last = matches!(r.kind, Kind::Summary);
        drop(r);
        // (What building it took goes back to the system with the run loop's next trim: see
        // run/heap.rs.)
        self.write_record(&record, last)
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

    /// Writes the run's final record, a report of another type in its own rendering (the
    /// demo's result).
    pub fn write_final<R: ?Sized>(
        &mut self,
        output: &mut dyn Output<R>,
        report: &R,
    ) -> Result<(), SessionError> {
        let record = render(output, report)?;
        self.write_record(&record, true)
    }
}

/// A report's whole record, before anything of it is written.
fn render<R: ?Sized>(output: &mut dyn Output<R>, report: &R) -> Result<Vec<u8>, SessionError> {
    let mut record = Vec::new();
    output
        .emit(report, &mut record)
        .map_err(SessionError::Write)?;
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::fixtures::{interval, ndjson};

    #[test]
    fn the_agents_rotating_file_gets_each_report_as_its_json_line() {
        let (dir, path) = crate::vocab::scratch::scratch("agent.jsonl");
        let reports = [
            interval("2026-01-01T00:00:01.000Z", 100),
            interval("2026-01-01T00:00:02.000Z", 200),
            interval("2026-01-01T00:00:03.000Z", 300),
        ];
        let line = |i: usize| ndjson(&[&reports[i]]);
        // Room for two lines a file, one older file kept.
        let limit = (line(0).len() + line(1).len()) as u64;
        let file = Rotating::open(&path, limit, 1).unwrap();
        let mut sink = Sink::rotating(file, Format::Json, "going on");
        for r in &reports {
            sink.write_report(r.clone()).unwrap();
        }
        let read = |p: &std::path::Path| std::fs::read_to_string(p).unwrap();
        assert_eq!(read(&dir.path().join("agent.jsonl.1")), line(0) + &line(1));
        assert_eq!(read(&path), line(2));
    }
}
