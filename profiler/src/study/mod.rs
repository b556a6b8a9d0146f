//! `mmaplock-prof study`: the investigation's mitigation matrix on this machine. Every
//! scenario (one idea each, written in `profiler/study/study.js`, the `dispose` addon in
//! `profiler/study/dispose.c`) runs as k Worker threads and as k processes, each run profiled
//! through the same runner as the demo; the results, a markdown table with the ranking this
//! machine gives (and where it disagrees with the investigation's), and an HTML page go to
//! `--out DIR`: the study's report ([`Results`]) in three [`Output`]s, one file each.

mod rank;

use std::{
    io,
    path::{Path, PathBuf},
};

use serde::Serialize;

use crate::{
    nodework::{NodeRun, NodeRunError, NodeSpec, WORKLOAD_JS, run_node},
    output::{
        JsonLines, Output,
        html::study::study_page_of,
        report::{Report, Stats},
        text::size_name,
    },
};

const STUDY_JS: &str = include_str!("../../study/study.js");
const DISPOSE_C: &str = include_str!("../../study/dispose.c");

/// The scenarios, named as results and tests use them.
pub use crate::cli::SCENARIOS;

/// Where Debian's libjemalloc2 (and other distributions' jemalloc) put the library.
const JEMALLOC: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
    "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2",
    "/usr/lib64/libjemalloc.so.2",
    "/usr/lib/libjemalloc.so.2",
    "/usr/local/lib/libjemalloc.so.2",
];

#[derive(Debug, thiserror::Error)]
pub enum StudyError {
    #[error(transparent)]
    Run(#[from] NodeRunError),
    #[error("cannot prepare the study's files in {0}: {1}")]
    Files(PathBuf, #[source] io::Error),
    #[error(
        "cannot build the dispose addon ({0}): install gcc and Node.js's headers (/usr/include/node), or leave dispose out with --scenarios"
    )]
    Addon(String),
    #[error("unknown scenario {0:?} (one of: {list})", list = SCENARIOS.join(", "))]
    UnknownScenario(String),
    #[error("cannot draw the study's {0}: {1}")]
    Render(&'static str, String),
    #[error(
        "no libjemalloc.so.2 for the jemalloc scenario: install it (Debian: apt-get install libjemalloc2), or leave jemalloc out with --scenarios"
    )]
    NoJemalloc,
}

impl StudyError {
    pub fn exit_code(&self) -> u8 {
        match self {
            StudyError::UnknownScenario(_) => 2,
            StudyError::Run(NodeRunError::Session(e)) => e.exit_code(),
            _ => 1,
        }
    }
}

pub struct StudyConfig {
    pub out: PathBuf,
    pub quick: bool,
    pub ks: Vec<u32>,
    /// File sizes in KiB (0.125 = 128 B).
    pub sizes: Vec<f64>,
    pub scenarios: Vec<String>,
    pub node: PathBuf,
    /// Reads per thread or process (default: by file size).
    pub iterations: Option<u32>,
    /// Runs of every cell, interleaved.
    pub repeat: u32,
}

impl StudyConfig {
    /// The matrix to run: file sizes 128 B, 64 KiB and 1 MiB with k = 1, 2 and 4, or with
    /// `--quick` 64 KiB with k = 4; `-k` and `--size` replace either default.
    fn matrix(&self) -> (Vec<f64>, Vec<u32>) {
        let (sizes, ks) = if self.quick {
            (vec![64.0], vec![4])
        } else {
            (vec![0.125, 64.0, 1024.0], vec![1, 2, 4])
        };
        (or(&self.sizes, sizes), or(&self.ks, ks))
    }

    /// The scenarios to run, in the study's order; an unknown id is a usage error.
    fn scenarios(&self) -> Result<Vec<&'static str>, StudyError> {
        if let Some(bad) = self
            .scenarios
            .iter()
            .find(|s| !SCENARIOS.contains(&s.as_str()))
        {
            return Err(StudyError::UnknownScenario(bad.clone()));
        }
        Ok(SCENARIOS
            .iter()
            .copied()
            .filter(|s| self.scenarios.is_empty() || self.scenarios.iter().any(|c| c == s))
            .collect())
    }
}

/// Reads per thread for a file size: about a quarter of a second of `default` with one
/// thread on a 2-vCPU machine (measured: 5 us a read plus 0.32 us a KiB; runs shorter than
/// this were dominated by noise), so a run takes 0.25 to 2 s; at most 40,000, as `async`
/// reads of small files are some 30 times slower.
fn iterations_for(kib: f64) -> u32 {
    let n = 0.25 / (5e-6 + 0.32e-6 * kib);
    ((n / 50.0).round() as u32 * 50).clamp(100, 40_000)
}

/// One run of the matrix, as results.json has it.
#[derive(Debug, Serialize)]
pub struct StudyRun {
    pub scenario: String,
    pub mode: &'static str,
    pub k: u32,
    pub file_kib: f64,
    /// Which of the `--repeat` runs of this cell (from 0).
    pub repeat: u32,
    pub ops_per_s: f64,
    /// Write acquisitions pooled over the run's processes.
    pub write: Stats,
    /// The profiler's summary of the run.
    pub report: Report,
}

/// The study's report: results.json, as one JSON line.
#[derive(Debug, Serialize)]
struct Results<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    schema_version: u32,
    machine: serde_json::Value,
    /// Runs of every cell.
    repeat: u32,
    runs: &'a [StudyRun],
    ranking: &'a [rank::Ranked],
    /// The investigation's claims, judged on this machine's runs.
    claims: &'a [rank::ClaimVerdict],
    ranking_text: String,
}

/// results.md: the study's tables, ranking and claims for people.
struct Markdown;

impl Output<Results<'_>> for Markdown {
    fn emit(&mut self, r: &Results<'_>, out: &mut dyn io::Write) -> io::Result<()> {
        out.write_all(rank::markdown(r.runs, r.ranking, r.claims).as_bytes())
    }
}

/// report.html: drawn from the study's JSON line as `report results.json --html` draws it,
/// so that both pages are one.
struct Page;

impl Output<Results<'_>> for Page {
    fn emit(&mut self, r: &Results<'_>, out: &mut dyn io::Write) -> io::Result<()> {
        let json = serde_json::to_string(r)?;
        let page = study_page_of("results.json", &json).map_err(io::Error::other)?;
        out.write_all(page.as_bytes())
    }
}

/// Renders the results with `output` into `dir/name` (written once whole); returns the bytes.
fn put<'a>(
    dir: &Path,
    name: &'static str,
    output: &mut dyn Output<Results<'a>>,
    results: &Results<'a>,
) -> Result<Vec<u8>, StudyError> {
    let mut bytes = Vec::new();
    output
        .emit(results, &mut bytes)
        .map_err(|e| StudyError::Render(name, e.to_string()))?;
    std::fs::write(dir.join(name), &bytes).map_err(files_err(dir))?;
    Ok(bytes)
}

/// The values given, or the default when none were.
fn or<T: Clone>(given: &[T], default: Vec<T>) -> Vec<T> {
    if given.is_empty() {
        default
    } else {
        given.to_vec()
    }
}

/// Node.js's C headers, which the `dispose` addon is compiled against.
const NODE_HEADERS: &str = "/usr/include/node";

/// Builds the `dispose` addon into `dir` with the system's C compiler.
async fn build_addon(dir: &Path) -> Result<PathBuf, StudyError> {
    if !Path::new(NODE_HEADERS).join("node_api.h").is_file() {
        return Err(StudyError::Addon(format!("no {NODE_HEADERS}/node_api.h")));
    }
    let src = dir.join("dispose.c");
    let out = dir.join("dispose.node");
    std::fs::write(&src, DISPOSE_C).map_err(|e| StudyError::Files(dir.to_path_buf(), e))?;
    let r = tokio::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-O2"])
        .arg(format!("-I{NODE_HEADERS}"))
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .output()
        .await
        .map_err(|e| StudyError::Addon(format!("cannot run cc: {e}")))?;
    if !r.status.success() {
        let err = String::from_utf8_lossy(&r.stderr);
        return Err(StudyError::Addon(
            err.lines().next().unwrap_or("cc failed").to_string(),
        ));
    }
    Ok(out)
}

/// A file error in `dir`.
fn files_err(dir: &Path) -> impl Fn(io::Error) -> StudyError + '_ {
    move |e| StudyError::Files(dir.to_path_buf(), e)
}

pub async fn run(cfg: StudyConfig) -> Result<(), StudyError> {
    let scenarios = cfg.scenarios()?;
    let files = files_err(&cfg.out);
    std::fs::create_dir_all(&cfg.out).map_err(&files)?;
    let work = tempfile::tempdir().map_err(&files)?;
    // The demo's workload runs the study's scenarios, from the module beside it.
    let script = work.path().join("workload.js");
    std::fs::write(&script, WORKLOAD_JS).map_err(&files)?;
    let study = work.path().join("study.js");
    std::fs::write(&study, STUDY_JS).map_err(&files)?;
    let addon = if scenarios.contains(&"dispose") {
        Some(build_addon(work.path()).await?)
    } else {
        None
    };
    let jemalloc = if scenarios.contains(&"jemalloc") {
        Some(
            JEMALLOC
                .iter()
                .find(|p| Path::new(p).is_file())
                .ok_or(StudyError::NoJemalloc)?,
        )
    } else {
        None
    };
    let (sizes, ks) = cfg.matrix();
    let repeat = cfg.repeat.max(1);
    let total = sizes.len() * ks.len() * scenarios.len() * 2 * repeat as usize;
    let mut runs = Vec::new();
    let mut data_files = Vec::new();
    for &kib in &sizes {
        let file = work.path().join(format!("data-{kib}.bin"));
        let data: Vec<u8> = (0..(kib * 1024.0) as usize)
            .map(|i| (i % 251) as u8)
            .collect();
        std::fs::write(&file, data).map_err(&files)?;
        data_files.push((kib, file));
    }
    // The repeats interleaved: a slow minute of the machine touches every scenario alike,
    // not the runs of one.
    for r in 0..repeat {
        for (kib, file) in &data_files {
            let kib = *kib;
            let iterations = cfg.iterations.unwrap_or_else(|| iterations_for(kib));
            for &k in &ks {
                for &scenario in &scenarios {
                    for mode in ["workers", "processes"] {
                        let mut args = vec![
                            file.to_string_lossy().into_owned(),
                            iterations.to_string(),
                            study.to_string_lossy().into_owned(),
                            scenario.to_string(),
                        ];
                        if let Some(a) = &addon {
                            args.push(a.to_string_lossy().into_owned());
                        }
                        let env = match scenario {
                            "arena-1" => vec![("MALLOC_ARENA_MAX".to_string(), "1".to_string())],
                            "arena-2" => vec![("MALLOC_ARENA_MAX".to_string(), "2".to_string())],
                            "jemalloc" => vec![(
                                "LD_PRELOAD".to_string(),
                                jemalloc.map_or(String::new(), |p| p.to_string()),
                            )],
                            _ => vec![],
                        };
                        let mut run: NodeRun = run_node(&NodeSpec {
                            node: &cfg.node,
                            script: &script,
                            mode,
                            k,
                            args,
                            env,
                            stack_sample: 0,
                            blockers: false,
                        })
                        .await?;
                        // A measurement cut short is not one: the study stops there.
                        if let Some(e) = run.failure.take() {
                            return Err(NodeRunError::Session(e).into());
                        }
                        eprintln!(
                            "[{:>3}/{total}] {:<18} {:<9} k={k} {:>8} #{}: {:>9.0} reads/s, {:>6} writes, write wait {}",
                            runs.len() + 1,
                            scenario,
                            mode,
                            size_name(kib),
                            r + 1,
                            run.reads_per_s,
                            run.write.count,
                            crate::output::text::fmt_ns(run.write.wait.sum),
                        );
                        runs.push(StudyRun {
                            scenario: scenario.to_string(),
                            mode,
                            k,
                            file_kib: kib,
                            repeat: r,
                            ops_per_s: run.reads_per_s,
                            write: Stats::new(&run.write),
                            report: run.report,
                        });
                    }
                }
            }
        }
    }
    let ranking = rank::rank(&runs);
    let claims = rank::claims(&ranking);
    let results = Results {
        kind: "study",
        schema_version: crate::output::report::SCHEMA_VERSION,
        machine: machine(&cfg.node).await,
        repeat,
        runs: &runs,
        ranking: &ranking,
        claims: &claims,
        ranking_text: rank::ranking_text(&ranking, &claims),
    };
    put(&cfg.out, "results.json", &mut JsonLines, &results)?;
    let markdown = put(&cfg.out, "results.md", &mut Markdown, &results)?;
    put(&cfg.out, "report.html", &mut Page, &results)?;
    println!("{}", String::from_utf8_lossy(&markdown));
    eprintln!(
        "mmaplock-prof study: results.json, results.md and report.html in {}",
        cfg.out.display()
    );
    Ok(())
}

/// What the results were measured on.
async fn machine(node: &Path) -> serde_json::Value {
    let node_version = tokio::process::Command::new(node)
        .arg("--version")
        .output()
        .await
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    serde_json::json!({
        "kernel": crate::kernel::features::running_release().unwrap_or_default(),
        "node": node_version,
        "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
    })
}

#[cfg(test)]
mod tests;
