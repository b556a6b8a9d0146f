//! Where reports go: a file or standard output, in one of the output formats, or the agent's
//! rotating file. Each report is rendered whole by its [`Output`], then handed to the writer
//! thread ([`Writer`]), which writes it in one go ([`LineFile`], [`Rotating`]): a file never
//! holds half a report, and a reader that falls behind delays the output, not the run. What
//! the writer's bounded queue cannot take is dropped and counted (`lost.output`); a run's last
//! records wait for room, and the final one is written whatever it takes. A file named on the
//! command line is emptied only once the run has attached ([`Sink::begin`]); a write that
//! fails during the run (a full disk) is said once and tried again with the next report, the
//! run's totals staying in memory; only the final record's failure fails the run.

use std::{
    io::{self, Write},
    path::PathBuf,
};

use crate::{
    output::{
        JsonLines, Output, Text,
        html::HtmlRecorder,
        lines::{LineFile, Pending},
        report::{Kind, Lost, Report},
        rotate::Rotating,
    },
    run::{
        SessionError, lost,
        writer::{Destination, QUEUE_BYTES, Writer},
    },
    vocab::Format,
};

/// Where records go once the run has attached.
enum Dest {
    Stdout,
    /// A COMMAND's run without `-o`: the command's own output has standard output.
    Stderr,
    File(PathBuf, LineFile),
    /// The agent's NDJSON: appended to, rotated by size.
    Rotating(Rotating),
}

impl Destination for Dest {
    fn write_record(&mut self, record: &[u8]) -> io::Result<()> {
        match self {
            Dest::File(_, f) => f.write_record(record),
            Dest::Rotating(r) => r.write_record(record),
            Dest::Stdout => {
                let mut out = io::stdout().lock();
                out.write_all(record).and_then(|()| out.flush())
            }
            Dest::Stderr => {
                let mut out = io::stderr().lock();
                out.write_all(record).and_then(|()| out.flush())
            }
        }
    }

    fn name(&self) -> String {
        match self {
            Dest::File(p, _) => p.display().to_string(),
            Dest::Rotating(r) => r.path().display().to_string(),
            Dest::Stdout => "standard output".into(),
            Dest::Stderr => "standard error".into(),
        }
    }

    /// A long-running agent's reader may come back: its file is tried again.
    fn may_come_back(&self) -> bool {
        matches!(self, Dest::Rotating(_))
    }
}

enum Out {
    /// Opened, not yet emptied (before the run has attached).
    Pending(Pending),
    /// Ready, its writer not yet started.
    Ready(Dest),
    Writing(Writer),
}

/// Where reports go, and in which format.
pub struct Sink {
    out: Out,
    /// The file written, for errors (None: standard output).
    path: Option<PathBuf>,
    format: Format,
    output: Box<dyn Output>,
    /// What goes on when a write fails, said with the failure.
    going_on: &'static str,
    /// Interval reports handed to the sink: the summary's `intervals`.
    intervals: u64,
    /// Interval reports dropped at the writer's full queue: in all, and since the last one
    /// queued (which says so in its `lost.output`).
    dropped: u64,
    unsaid: u64,
    /// The run is ending: its last reports wait for room in the queue.
    ending: bool,
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
            None => Out::Ready(Dest::Stdout),
        };
        Ok(Sink::new(
            out,
            output.cloned(),
            format,
            "the run goes on (its totals are kept); the next reports and the summary are tried again",
        ))
    }

    /// Standard error (a COMMAND's run without `-o`).
    pub fn stderr(format: Format) -> Self {
        Sink::new(
            Out::Ready(Dest::Stderr),
            None,
            format,
            "the run goes on (its totals are kept); the next reports and the summary are tried again",
        )
    }

    /// The agent's rotating file, already open: it is appended to, never emptied.
    pub fn rotating(file: Rotating, format: Format, going_on: &'static str) -> Self {
        let path = file.path().to_path_buf();
        Sink::new(
            Out::Ready(Dest::Rotating(file)),
            Some(path),
            format,
            going_on,
        )
    }

    fn new(out: Out, path: Option<PathBuf>, format: Format, going_on: &'static str) -> Self {
        let output: Box<dyn Output> = match format {
            Format::Json => Box::new(JsonLines),
            Format::Text => Box::new(Text),
        };
        Sink {
            out,
            path,
            format,
            output,
            going_on,
            intervals: 0,
            dropped: 0,
            unsaid: 0,
            ending: false,
            html: None,
        }
    }

    /// The run has attached: an output file is emptied now.
    pub fn begin(&mut self) -> Result<(), SessionError> {
        if let Out::Pending(_) = &self.out {
            let Out::Pending(p) = std::mem::replace(&mut self.out, Out::Ready(Dest::Stdout)) else {
                unreachable!()
            };
            let path = p.path().to_path_buf();
            let file = p
                .commit()
                .and_then(LineFile::new)
                .map_err(|e| SessionError::OpenOutput(path.clone(), e))?;
            self.out = Out::Ready(Dest::File(path, file));
        }
        Ok(())
    }

    /// The writer, started at the first report.
    fn writer(&mut self) -> Result<&Writer, SessionError> {
        self.begin()?;
        if let Out::Ready(_) = &self.out {
            let Out::Ready(dest) = std::mem::replace(&mut self.out, Out::Ready(Dest::Stdout))
            else {
                unreachable!()
            };
            self.out = Out::Writing(
                Writer::start(dest, self.going_on, QUEUE_BYTES).map_err(SessionError::Write)?,
            );
        }
        match &self.out {
            Out::Writing(w) => Ok(w),
            _ => unreachable!("started above"),
        }
    }

    pub fn format(&self) -> Format {
        self.format
    }

    /// The run is ending: the reports that follow (its last interval) are never dropped.
    pub fn ending(&mut self) {
        self.ending = true;
    }

    /// Interval reports not written so far: dropped at the writer's full queue, or whose
    /// write failed (what the agent exports as lost output).
    pub fn lost_output(&self) -> u64 {
        self.dropped
            + match &self.out {
                Out::Writing(w) => w.failed(),
                _ => 0,
            }
    }

    fn error(&self, e: io::Error) -> SessionError {
        match &self.path {
            Some(p) => SessionError::OpenOutput(p.clone(), e),
            None => SessionError::Write(e),
        }
    }

    /// An interval report the writer could not take.
    fn drop_one(&mut self) {
        self.dropped += 1;
        self.unsaid += 1;
        let lost = Lost {
            output: self.dropped,
            ..Lost::default()
        };
        lost::check(&lost, lost::Advice::CommandLine);
    }

    /// Writes a report, then frees it. An interval report is dropped, and counted, when the
    /// writer's queue is full (but not once the run is [`ending`](Self::ending)); the summary
    /// waits for everything before it, says how many interval reports were made and lost,
    /// and is written whatever it takes.
    pub fn write_report(&mut self, mut r: Report) -> Result<(), SessionError> {
        let summary = matches!(r.kind, Kind::Summary);
        if summary {
            let failed = self.writer()?.flush();
            r.intervals = Some(self.intervals);
            r.lost.output = self.dropped + failed;
        } else {
            self.intervals += 1;
        }
        if let Some(h) = self.html.as_mut() {
            h.emit(&r, &mut io::sink()).map_err(SessionError::Write)?;
        }
        let (ending, unsaid) = (self.ending, self.unsaid);
        let w = self.writer()?;
        if w.closed() {
            return Ok(());
        }
        if !summary && !ending && w.full() {
            self.drop_one();
            return Ok(());
        }
        if !summary {
            r.lost.output = unsaid;
        }
        let record = render(&mut *self.output, &r)?;
        drop(r);
        // (What building it took goes back to the system with the run loop's next trim: see
        // run/heap.rs.)
        let w = self.writer()?;
        if summary {
            let done = w.finish(record);
            return done.map_err(|e| self.error(e));
        }
        if ending {
            w.put(record);
        } else if !w.offer(record) {
            self.drop_one();
            return Ok(());
        }
        self.unsaid = 0;
        Ok(())
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
    /// demo's result), after everything queued, whatever it takes.
    pub fn write_final<R: ?Sized>(
        &mut self,
        output: &mut dyn Output<R>,
        report: &R,
    ) -> Result<(), SessionError> {
        let record = render(output, report)?;
        let done = self.writer()?.finish(record);
        done.map_err(|e| self.error(e))
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
    use crate::output::fixtures::{interval, ndjson, summary};

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
        // Everything queued is written before the sink is gone.
        drop(sink);
        let read = |p: &std::path::Path| std::fs::read_to_string(p).unwrap();
        assert_eq!(read(&dir.path().join("agent.jsonl.1")), line(0) + &line(1));
        assert_eq!(read(&path), line(2));
    }

    /// Interval lines offered while nothing reads: what the queue cannot take is dropped and
    /// said on the next line written; the run's last lines wait, and the summary counts it all.
    #[test]
    fn a_reader_that_falls_behind_loses_interval_lines_counted_never_the_last_ones() {
        let reports: Vec<Report> = (1..=5)
            .map(|i| interval(&format!("2026-01-01T00:00:0{i}.000Z"), 100 * i))
            .collect();
        // Room for two lines and a half.
        let size = ndjson(&[&reports[0]]).len();
        let (writer, go, written) = crate::run::writer::tests::gated(size * 5 / 2, None);
        let mut sink = Sink::new(Out::Writing(writer), None, Format::Json, "going on");
        for r in &reports[..4] {
            sink.write_report(r.clone()).unwrap();
        }
        assert_eq!(sink.lost_output(), 2);
        // The reader resumes; the run ends.
        let reader = std::thread::spawn(move || {
            for _ in 0..4 {
                go.send(()).unwrap();
            }
        });
        sink.ending();
        sink.write_report(reports[4].clone()).unwrap();
        sink.write_report(summary(vec![])).unwrap();
        reader.join().unwrap();
        let lines: Vec<serde_json::Value> = written
            .try_iter()
            .map(|l| serde_json::from_slice(&l).unwrap())
            .collect();
        let ends: Vec<&str> = lines.iter().map(|l| l["end"].as_str().unwrap()).collect();
        assert_eq!(
            ends,
            [
                "2026-01-01T00:00:01.000Z",
                "2026-01-01T00:00:02.000Z",
                "2026-01-01T00:00:05.000Z",
                "2026-01-01T00:00:02.000Z",
            ]
        );
        let output: Vec<u64> = lines
            .iter()
            .map(|l| l["lost"]["output"].as_u64().unwrap())
            .collect();
        assert_eq!(output, [0, 0, 2, 2], "each line: the lines lost before it");
        assert_eq!(lines[3]["type"], "summary");
        assert_eq!(lines[3]["intervals"], 5);
    }
}
