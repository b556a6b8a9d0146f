//! The commands that read files only (no kernel, no privilege): `report` renders a run as
//! text (what the live run printed) and HTML, `compare` sets two runs side by side.

use std::{io::Write as _, path::Path};

use crate::{
    cli::{CompareArgs, Format, ReportArgs},
    output::{
        JsonLines, Output,
        compare::{self, CompareText, Comparison, Runs},
        findings::{self, FindingsText, StudyEffects, StudyFileError},
        html::{RunLines, RunPage, compare::ComparePage},
        pprof::{Pprof, Samples, Summaries},
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
    #[error(transparent)]
    Compare(#[from] compare::CompareError),
    #[error(
        "{0} has no sampled stacks for a pprof profile (a summary's `samples`): profile with stack sampling on (the default; not --stack-sample 0), with a build that writes them"
    )]
    NoSamples(String),
    #[error("{0}: {1}")]
    Trigger(String, String),
}

impl OfflineError {
    /// A file that cannot be read or is not a report is bad usage (2); a page that cannot be
    /// written too (the path given is wrong), and files `compare` cannot set side by side
    /// (modes, a grouping they do not record).
    pub fn exit_code(&self) -> u8 {
        2
    }
}

/// Renders `report` with `output` into the file at `path`, written once whole.
fn write<R: ?Sized>(
    path: &Path,
    output: &mut dyn Output<R>,
    report: &R,
) -> Result<(), OfflineError> {
    let mut bytes = Vec::new();
    output
        .emit(report, &mut bytes)
        .and_then(|()| std::fs::write(path, bytes))
        .map_err(|e| OfflineError::Write(path.display().to_string(), e))
}

fn study(path: Option<&Path>) -> Result<Option<StudyEffects>, OfflineError> {
    Ok(path.map(StudyEffects::load).transpose()?)
}

/// Renders `report` with `output` to standard output; a closed reader is not an error of ours.
fn print<R: ?Sized>(output: &mut dyn Output<R>, report: &R) {
    let mut bytes = Vec::new();
    if output.emit(report, &mut bytes).is_ok() {
        let _ = std::io::stdout().lock().write_all(&bytes);
    }
}

/// The text of a run as the live run printed its summary (tables, histograms, findings): each
/// summary shown (a demo's runs, else the last summary, else the interval lines summed), its
/// findings recomputed with `study`; a file with none (a study's results) has its findings.
/// Its processes grouped as the live run groups them (a file of an earlier build lists all),
/// unless `every` (`--all-processes`).
fn run_text(
    run: &RunLines,
    study: Option<&StudyEffects>,
    all: &[findings::Finding],
    every: bool,
) -> Vec<u8> {
    let mut bytes = Vec::new();
    let shown = run.shown();
    if shown.is_empty() {
        let _ = FindingsText.emit(all, &mut bytes);
    }
    for s in shown {
        let mut s = s.into_owned();
        if s.findings.is_none() {
            findings::attach(&mut s, study);
        }
        if every {
            s.show_all = true;
        } else {
            findings::group_minor(&mut s);
        }
        // With the processes' waits over time, from the file's interval lines.
        let text = crate::output::text::to_text_with(&s, &|pid, start| run.series(pid, start));
        bytes.extend_from_slice(text.as_bytes());
    }
    bytes
}

/// `report`: the run's text report as the live run printed it (or, `-f json`, its findings),
/// the findings recomputed (with the study's effects, if given) and put first on the page.
pub fn report(args: &ReportArgs) -> Result<(), OfflineError> {
    if let Some(t) = &args.trigger {
        add_trigger(&args.input, t)?;
    }
    let study = study(args.study.as_deref())?;
    let run = RunLines::read_file(&args.input)?;
    let name = args
        .input
        .file_name()
        .map_or("run".into(), |n| n.to_string_lossy().into_owned());
    // A demo's line holds a summary per run, shown together; otherwise the last run's.
    let all = run.findings(study.as_ref());
    if let Some(path) = &args.html {
        let mut page = RunPage {
            name: &name,
            findings: &all,
            all: args.all_processes,
        };
        write(path, &mut page, &run)?;
    }
    if let Some(path) = &args.pprof {
        let shown = run.shown();
        let summaries = Summaries(shown.iter().map(|s| s.as_ref()).collect());
        // A run without stack sampling, or of a build that kept no `samples` of what it
        // sampled: no profile rather than an empty one.
        let processes = || summaries.0.iter().flat_map(|s| &s.processes);
        let sampled: u64 = processes()
            .flat_map(|p| p.dsos.iter().flatten())
            .map(|d| d.write.count)
            .sum();
        let kept = processes().any(|p| p.samples.is_some());
        if !summaries.0.iter().any(|s| s.stack_sample.is_some()) || (sampled > 0 && !kept) {
            return Err(OfflineError::NoSamples(args.input.display().to_string()));
        }
        write(path, &mut Pprof, &summaries as &dyn Samples)?;
    }
    match Format::resolve(args.format, None) {
        Format::Json => print(
            &mut JsonLines,
            &serde_json::json!({"type": "findings", "schema_version": crate::output::report::SCHEMA_VERSION,
                "file": args.input.display().to_string(), "findings": all}),
        ),
        Format::Text => {
            let _ = std::io::stdout().lock().write_all(&run_text(
                &run,
                study.as_ref(),
                &all,
                args.all_processes,
            ));
        }
    }
    Ok(())
}

/// An agent's capture: its `trigger` (read from `trigger`) put into the summary of `input`,
/// its last line, and the summary's findings recomputed with those of the window that
/// crossed; the file is replaced whole (a sibling written, then renamed over it), its other
/// lines copied as they are.
fn add_trigger(input: &Path, trigger: &Path) -> Result<(), OfflineError> {
    use std::io::{BufRead as _, BufWriter};
    let bad = |p: &Path, e: &dyn std::fmt::Display| {
        OfflineError::Trigger(p.display().to_string(), e.to_string())
    };
    let t: crate::output::report::Trigger = std::fs::read(trigger)
        .map_err(|e| bad(trigger, &e))
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| bad(trigger, &e)))?;
    let dir = input.parent().unwrap_or(Path::new("."));
    let f = std::fs::File::open(input).map_err(|e| bad(input, &e))?;
    let mut out = tempfile::NamedTempFile::new_in(dir).map_err(|e| bad(input, &e))?;
    let mut last: Option<Vec<u8>> = None;
    {
        let mut w = BufWriter::new(out.as_file_mut());
        let mut r = std::io::BufReader::with_capacity(1 << 16, f);
        loop {
            let mut line = Vec::new();
            let n = r.read_until(b'\n', &mut line).map_err(|e| bad(input, &e))?;
            if n == 0 {
                break;
            }
            if let Some(prev) = last.replace(line) {
                w.write_all(&prev).map_err(|e| bad(input, &e))?;
            }
        }
        let last = last.ok_or_else(|| bad(input, &"empty"))?;
        let mut summary: crate::output::report::Report =
            serde_json::from_slice(&last).map_err(|e| bad(input, &e))?;
        if summary.kind != crate::output::report::Kind::Summary {
            return Err(bad(input, &"its last line is not a summary"));
        }
        summary.trigger = Some(Box::new(t));
        findings::attach(&mut summary, None);
        serde_json::to_writer(&mut w, &summary).map_err(|e| bad(input, &e))?;
        w.write_all(b"\n")
            .and_then(|()| w.flush())
            .map_err(|e| bad(input, &e))?;
    }
    out.persist(input).map_err(|e| bad(input, &e.error))?;
    Ok(())
}

pub fn compare(args: &CompareArgs) -> Result<(), OfflineError> {
    let study = study(args.study.as_deref())?;
    let before = Runs::read(&args.before, args.by)?;
    let after = Runs::read(&args.after, args.by)?;
    let c = compare::compare(
        (&args.before.display().to_string(), &before),
        (&args.after.display().to_string(), &after),
        study.as_ref(),
    )?;
    if let Some(path) = &args.html {
        write(path, &mut ComparePage, &c)?;
    }
    let mut output: Box<dyn Output<Comparison>> = match Format::resolve(args.format, None) {
        Format::Json => Box::new(JsonLines),
        Format::Text => Box::new(CompareText),
    };
    print(&mut *output, &c);
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;
    use crate::{
        cli::{Cli, Command, one_line},
        output::{Text, compare::By, fixtures, reading::Keep, report::Report},
    };

    /// `compare`'s `--by`: `run` unless given, and a value it does not take is bad usage, in
    /// one line that lists the ones it takes.
    #[test]
    fn compare_groups_by_run_unless_told() {
        let by = |extra: &[&str]| -> Result<By, clap::Error> {
            let args = ["mmaplock-prof", "compare", "a.json", "b.json"];
            match Cli::try_parse_from(args.iter().chain(extra))?.command {
                Some(Command::Compare(c)) => Ok(c.by),
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(by(&[]).unwrap(), By::Run);
        assert_eq!(by(&["--by", "comm"]).unwrap(), By::Comm);
        assert_eq!(by(&["--by", "cgroup"]).unwrap(), By::Cgroup);
        let e = by(&["--by", "name"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert_eq!(
            one_line(&e),
            "invalid value 'name' for '--by <BY>' [possible values: exe, comm, cgroup, run]"
        );
    }

    /// `report RUN.json` prints what the live run printed: the summary's text, findings,
    /// tables and histograms included, not the findings alone.
    #[test]
    fn report_prints_the_text_of_the_live_run() {
        let summary = fixtures::summary(vec![fixtures::process(1, "node", 5_000_000, true)]);
        let mut live: Report = summary.clone();
        findings::attach(&mut live, None);
        let mut expected = Vec::new();
        Text.emit(&live, &mut expected).unwrap();
        let run = RunLines::parse("run.json", &fixtures::ndjson(&[&summary])).unwrap();
        let all = run.findings(None);
        let got = String::from_utf8(run_text(&run, None, &all, false)).unwrap();
        assert_eq!(got, String::from_utf8(expected).unwrap());
        for part in [
            "lock        acquired",
            "writes by cause:",
            "top threads by write wait:",
            "write wait (log2 buckets)",
        ] {
            assert!(got.contains(part), "{part:?} missing from:\n{got}");
        }
    }

    /// `report --trigger`: the agent's trigger goes into the summary, in place; the other
    /// lines stay as they were; the findings are the capture's and the window's, each saying
    /// its window, the window's first when the contention had passed; the page and the text
    /// begin with the verdict.
    #[test]
    fn a_captures_trigger_is_written_into_its_summary() {
        use crate::output::report::{CROSSING, Trigger, TriggerMeasure};
        let d = tempfile::tempdir().unwrap();
        let interval = fixtures::interval("2026-01-01T00:00:01.000Z", 100);
        let mut summary = fixtures::summary(vec![fixtures::process(1, "node", 5_000_000, true)]);
        findings::attach(&mut summary, None);
        let run = d.path().join("report.ndjson");
        std::fs::write(&run, fixtures::ndjson(&[&interval, &summary])).unwrap();
        let before: Vec<String> = std::fs::read_to_string(&run)
            .unwrap()
            .lines()
            .map(String::from)
            .collect();
        let crossing = findings::Finding {
            id: "mmap-threshold".into(),
            pid: 1,
            comm: "node".into(),
            severity: findings::Severity::High,
            title: "what crossed".into(),
            writes: None,
            wait_ns: 31,
            share_of_wait: 1.0,
            time_share: Some(0.31),
            time_share_bound: None,
            evidence: Default::default(),
            advice: Vec::new(),
            measured: Vec::new(),
            measured_on: None,
            source: String::new(),
            impact: None,
            window: None,
        };
        let t = Trigger {
            pid: 1,
            comm: "node".into(),
            share: 0.31,
            threshold: 0.05,
            window_s: 30.0,
            waits: 3582,
            at: "2026-01-01T00:00:00.000Z".into(),
            wait_ns: 31,
            alive_ns: 100,
            from: String::new(),
            to: String::new(),
            mode: crate::vocab::Mode::Contention,
            waiting: Vec::new(),
            holding: Vec::new(),
            sampled: 12,
            findings: vec![crossing],
            capture: Some(TriggerMeasure {
                share: 0.001,
                window_s: 15.0,
                ..Default::default()
            }),
            passed: Some(true),
            verdict: Some("the contention had passed: this".into()),
        };
        let file = d.path().join("trigger.json");
        std::fs::write(&file, serde_json::to_vec(&t).unwrap()).unwrap();
        add_trigger(&run, &file).unwrap();
        let after: Vec<String> = std::fs::read_to_string(&run)
            .unwrap()
            .lines()
            .map(String::from)
            .collect();
        assert_eq!(after.len(), 2);
        assert_eq!(after[0], before[0], "the interval line is as it was");
        let s: serde_json::Value = serde_json::from_str(&after[1]).unwrap();
        assert_eq!(s["trigger"]["verdict"], "the contention had passed: this");
        let f = s["findings"].as_array().unwrap();
        assert_eq!(f[0]["window"], CROSSING);
        assert_eq!(f[0]["title"], "what crossed");
        assert!(f[1..].iter().all(|f| f["window"] == "capture"), "{f:?}");
        // Read back, the page and the text begin with it.
        let run_lines = RunLines::read_file(&run).unwrap();
        let all = run_lines.findings(None);
        assert_eq!(all[0].window.as_deref(), Some(CROSSING));
        let text = String::from_utf8(run_text(&run_lines, None, &all, false)).unwrap();
        let second = text.lines().nth(1).unwrap();
        assert!(
            second.starts_with("why this capture: node (pid 1) waited 31.0%"),
            "{text}"
        );
        assert!(text.contains("the contention had passed: this"));
        assert!(
            text.contains("(pid 1, in the window that crossed): what crossed"),
            "{text}"
        );
        // A file whose last line is no summary is refused, untouched.
        std::fs::write(&run, fixtures::ndjson(&[&interval])).unwrap();
        assert!(add_trigger(&run, &file).is_err());
    }
}
