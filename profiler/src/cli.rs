//! The command line (docs/cli.md). Defaults live in [`Config`], so help text, code and docs
//! agree.

use std::{io::IsTerminal, path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Default settings.
pub struct Config;

impl Config {
    pub const INTERVAL_S: f64 = 1.0;
    /// Capacity of the kernel's per-(process, thread) stats map.
    pub const MAX_THREADS: u32 = 16_384;
    /// `--stacks FILE` without `--stack-sample`: every write's stack.
    pub const STACK_SAMPLE_WITH_STACKS_FILE: u32 = 1;
    /// Code attribution by default: one write in this many per thread has its stack taken
    /// (cost in docs/benchmark.md); `--stack-sample 0` turns it off.
    pub const STACK_SAMPLE: u32 = 64;
    pub const DEMO_WORKERS: u32 = 4;
    pub const DEMO_FILE_KIB: u32 = 64;
    pub const DEMO_ITERATIONS: u32 = 2_000;
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Newline-delimited JSON, one report per line.
    Json,
    /// Tables and histograms for people.
    Text,
}

impl Format {
    /// `text` on a terminal, `json` otherwise (a pipe or a file).
    pub fn resolve(choice: Option<Format>, output: Option<&PathBuf>) -> Format {
        choice.unwrap_or(if output.is_none() && std::io::stdout().is_terminal() {
            Format::Text
        } else {
            Format::Json
        })
    }
}

/// Profile where processes wait on, and hold, the Linux kernel's per-process mmap_lock.
///
/// System-wide unless filtered with --pid or --comm. Needs root (or CAP_BPF and CAP_PERFMON).
#[derive(Debug, Parser)]
#[command(
    name = "mmaplock-prof",
    version,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub profile: ProfileArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Profile a bundled Node.js workload (Worker threads against processes) and show the
    /// difference: the first thing to run.
    Demo(DemoArgs),
    /// Profile continuously and serve Prometheus metrics (docs/agent.md).
    Agent(AgentArgs),
    /// Render a run's NDJSON (or a study's results.json) as a self-contained HTML page.
    Report(ReportArgs),
    /// Compare two runs (before and after a fix): writes and write wait per process name,
    /// thread role and cause, with ratios; several runs per file are judged for noise.
    Compare(CompareArgs),
    /// The investigation's mitigation study on this machine: every scenario as Worker
    /// threads and as processes, profiled; results.json, results.md and report.html.
    Study(StudyArgs),
}

/// `mmaplock-prof study`.
#[derive(Debug, Args)]
pub struct StudyArgs {
    /// Where results.json, results.md and report.html go.
    #[arg(long, value_name = "DIR", default_value = "study-out", value_parser = parse_path)]
    pub out: PathBuf,
    /// Every scenario at 64 KiB with k = 2 and 4 (about a minute); -k and --size still apply.
    #[arg(long)]
    pub quick: bool,
    /// Worker threads / processes per run; repeatable or a list, `-k 2,4` (default 1, 2, 4).
    #[arg(short = 'k', value_name = "K", value_delimiter = ',',
          value_parser = clap::value_parser!(u32).range(1..=64))]
    pub ks: Vec<u32>,
    /// File sizes, repeatable or a list: KiB, or with a unit, `--sizes 128B,64KiB,1MiB`
    /// (default 128 B, 64 KiB, 1 MiB).
    #[arg(long = "size", visible_alias = "sizes", value_name = "SIZE", value_delimiter = ',',
          value_parser = parse_kib)]
    pub sizes: Vec<f64>,
    /// Only these scenarios, repeatable or a list: default, pool-256k, reuse, async, arena-1,
    /// finalization-pool, slab, dispose.
    #[arg(long = "scenario", visible_alias = "scenarios", value_name = "ID",
          value_delimiter = ',', value_parser = parse_scenario)]
    pub scenarios: Vec<String>,
    /// The Node.js binary.
    #[arg(long, value_name = "PATH", default_value = "node", value_parser = parse_path)]
    pub node: PathBuf,
    /// Reads per thread or process (default: by file size, about 0.25 s of `default`).
    #[arg(short = 'n', value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub iterations: Option<u32>,
}

/// A scenario id of the study's (the message lists them: the error is shown on one line).
fn parse_scenario(s: &str) -> Result<String, String> {
    let ids = crate::study::SCENARIOS;
    if ids.contains(&s) {
        Ok(s.to_string())
    } else {
        Err(format!("unknown scenario (one of: {})", ids.join(", ")))
    }
}

/// A file size in KiB: a plain number is KiB; `B`, `K`/`KiB` and `M`/`MiB` name the unit.
fn parse_kib(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let scale = match unit.to_ascii_lowercase().as_str() {
        "" | "k" | "kib" | "kb" => 1.0,
        "b" => 1.0 / 1024.0,
        "m" | "mib" | "mb" => 1024.0,
        _ => f64::NAN,
    };
    match num.trim().parse::<f64>().map(|v| v * scale) {
        Ok(v) if (0.0625..=65536.0).contains(&v) => Ok(v),
        _ => Err(format!(
            "{s:?} is not a file size from 64B to 64MiB (KiB, or 128B, 64KiB, 1MiB)"
        )),
    }
}

/// `mmaplock-prof report RUN.json --html OUT.html`.
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// The NDJSON of a run (`-f json -o RUN.json`), a demo's line, or a study's results.json.
    #[arg(value_name = "RUN.json", value_parser = parse_path)]
    pub input: PathBuf,
    /// Where the page goes.
    #[arg(long, value_name = "OUT.html", value_parser = parse_path)]
    pub html: PathBuf,
}

/// `mmaplock-prof compare BEFORE.json AFTER.json`.
#[derive(Debug, Args)]
pub struct CompareArgs {
    /// The run(s) before: NDJSON, several runs one after the other allowed.
    #[arg(value_name = "BEFORE.json", value_parser = parse_path)]
    pub before: PathBuf,
    /// The run(s) after.
    #[arg(value_name = "AFTER.json", value_parser = parse_path)]
    pub after: PathBuf,
    /// text (a table) or json; default text on a terminal, json otherwise.
    #[arg(short, long, value_enum)]
    pub format: Option<Format>,
    /// Also write the comparison as an HTML page.
    #[arg(long, value_name = "OUT.html", value_parser = parse_path)]
    pub html: Option<PathBuf>,
}

/// `mmaplock-prof agent`: the contract is shared/design/agent-and-metrics.md.
#[derive(Debug, Args)]
pub struct AgentArgs {
    /// Where /metrics is served (never all interfaces unless asked, e.g. 0.0.0.0:9464).
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:9464")]
    pub listen: std::net::SocketAddr,
    /// Select processes by command name; repeatable.
    #[arg(long = "comm", value_name = "NAME", value_parser = parse_comm)]
    pub comms: Vec<String>,
    /// Select processes by executable path or basename, a glob (e.g. node, */bin/node).
    #[arg(long = "exe", value_name = "GLOB", value_parser = parse_glob)]
    pub exes: Vec<String>,
    /// Select processes in a cgroup v2 subtree (a systemd unit, a container); repeatable.
    #[arg(long = "cgroup", value_name = "PATH", value_parser = parse_cgroup)]
    pub cgroups: Vec<String>,
    /// Select these processes; repeatable. (No selector: every process whose executable is
    /// node.)
    #[arg(short = 'p', long = "pid", value_name = "PID", value_parser = parse_pid)]
    pub pids: Vec<u32>,
    /// A file of selectors, one per line (`comm NAME`, `exe GLOB`, `cgroup PATH`, `pid PID`;
    /// `#` comments), re-read on SIGHUP; adds to the command line's.
    #[arg(long, value_name = "FILE", value_parser = parse_path)]
    pub config: Option<PathBuf>,
    /// Add a `pid` label (off by default: it is unbounded over time).
    #[arg(long)]
    pub pid_label: bool,
    /// Also write the NDJSON interval reports to FILE (rotated by size).
    #[arg(short, long, value_name = "FILE", value_parser = parse_path)]
    pub output: Option<PathBuf>,
    /// Rotate --output when it reaches this many MiB (keeping FILE.1 .. FILE.N).
    #[arg(long, value_name = "MIB", default_value_t = 64)]
    pub rotate_mib: u64,
    /// How many rotated files to keep.
    #[arg(long, value_name = "N", default_value_t = 4)]
    pub rotate_keep: u32,
    /// How often the kernel's maps are read, and the selection refreshed.
    #[arg(short, long, value_name = "SECS", default_value = "1", value_parser = parse_positive_secs)]
    pub interval: Duration,
    /// Capacity of the kernel's statistics map, in threads.
    #[arg(long, value_name = "N", default_value_t = Config::MAX_THREADS)]
    pub max_threads: u32,
    /// Turn on the kernel's BPF run-time statistics, for mmaplock_bpf_run_seconds_total.
    #[arg(long)]
    pub bpf_stats: bool,
    /// Charge each wait to the threads whose holds made it wait, for
    /// mmaplock_blocked_seconds_total (costs a few stores per hold, with the lock held).
    #[arg(long)]
    pub blockers: bool,
    /// Export the sampled writes of up to N JavaScript functions per process
    /// (mmaplock_js_function_sampled_writes_total{process,cgroup,function}; past N, "(other)").
    /// Samples one write's stack in --stack-sample per thread; 0: off.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub js_functions: usize,
    /// With --js-functions: take one write's stack in N per thread.
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub stack_sample: u32,
    /// No status messages on standard error.
    #[arg(short, long)]
    pub quiet: bool,
}

#[derive(Debug, Args)]
pub struct OutputArgs {
    /// json (newline-delimited JSON) or text; default text on a terminal, json otherwise.
    #[arg(short, long, value_enum)]
    pub format: Option<Format>,
    /// Write reports to FILE instead of standard output.
    #[arg(short, long, value_name = "FILE", value_parser = parse_path)]
    pub output: Option<PathBuf>,
    /// Also explain what was detected and loaded (on standard error).
    #[arg(short, long)]
    pub verbose: bool,
}

#[derive(Debug, Args)]
pub struct ProfileArgs {
    /// A process to profile, all its threads; repeatable. The run ends, with a summary, when
    /// every such process has exited.
    #[arg(short, long = "pid", value_name = "PID", value_parser = parse_pid)]
    pub pids: Vec<u32>,
    /// Processes whose command name is NAME; repeatable.
    #[arg(long = "comm", value_name = "NAME", value_parser = parse_comm)]
    pub comms: Vec<String>,
    /// Stop after SECS (default: until Ctrl-C, SIGTERM, or the targets exit).
    #[arg(short, long, value_name = "SECS", value_parser = parse_positive_secs)]
    pub duration: Option<Duration>,
    /// An interval report every SECS; 0 = the summary only.
    #[arg(short, long, value_name = "SECS", default_value_t = Config::INTERVAL_S, value_parser = parse_interval)]
    pub interval: f64,
    /// Threads the kernel's statistics map has room for (4 entries each: reads and write
    /// causes); beyond it, acquisitions are counted in `lost.map_full`. Allocated as used.
    #[arg(long, value_name = "N", default_value_t = Config::MAX_THREADS, value_parser = clap::value_parser!(u32).range(1..=4_194_304))]
    pub max_threads: u32,
    /// Capture the user stack of one in N write acquisitions (per thread), to charge writes
    /// to code (`dsos`, `js_functions`, `stacks` in the summary); 0 turns it off. Default 64
    /// (1 with --stacks): a 16 KiB stack copy per sampled write, before the lock is taken.
    /// Reads are never stack-walked.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32))]
    pub stack_sample: Option<u32>,
    /// Write folded stacks of sampled writes to FILE at the end (for flame graph tools);
    /// samples every write unless --stack-sample says otherwise.
    #[arg(long, value_name = "FILE", value_parser = parse_path)]
    pub stacks: Option<PathBuf>,
    /// Also write the run as a self-contained HTML page at the end (histograms, wait over
    /// time, roles, causes, the flame graph of the sampled writes).
    #[arg(long, value_name = "FILE", value_parser = parse_path)]
    pub html: Option<PathBuf>,
    /// Profile write acquisitions only: reads (most mmap_lock traffic: page faults) then cost
    /// a few instructions each, for hosts with extreme fault rates. Reports have no read
    /// statistics, and a downgraded write (munmap) counts as held until its final release.
    #[arg(long)]
    pub writes_only: bool,
    /// Turn on the kernel's BPF run-time statistics while profiling, to report the profiler's
    /// own cost (`overhead` in each report). They cost two clock reads per tracepoint hit and
    /// go back off when the run ends.
    #[arg(long)]
    pub bpf_stats: bool,
    /// Charge each wait to the threads whose holds made it wait (`blockers` per process,
    /// `blocked_by` per thread): every write hold, and read holds released while a thread
    /// sleeps on the lock, are logged at release (a few stores with the lock held).
    #[arg(long)]
    pub blockers: bool,
    /// Benchmark only (`cargo xtask bench`): attach empty programs to the same tracepoints
    /// instead of the profiler's, to measure the floor cost of any BPF program there.
    /// Also profile every descendant of the --pid targets (followed in the kernel at fork,
    /// from its first acquisition); the run ends when they have all exited too.
    #[arg(long, requires = "pids")]
    pub children: bool,
    #[arg(long, hide = true, conflicts_with = "floor_clock")]
    pub floor: bool,
    /// Benchmark only: attach programs that read the clock once and do nothing else, the least
    /// a program timing each acquisition does while the lock is held.
    #[arg(long, hide = true)]
    pub floor_clock: bool,
    /// No status messages on standard error.
    #[arg(short, long)]
    pub quiet: bool,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Worker threads in the first run, processes in the second.
    #[arg(short = 'k', long, default_value_t = Config::DEMO_WORKERS, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub workers: u32,
    /// Size of the file each thread or process reads, in KiB.
    #[arg(long, value_name = "KIB", default_value_t = Config::DEMO_FILE_KIB, value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub file_kib: u32,
    /// fs.readFileSync calls per thread or process.
    #[arg(short = 'n', long, default_value_t = Config::DEMO_ITERATIONS, value_parser = clap::value_parser!(u32).range(1..))]
    pub iterations: u32,
    /// The Node.js binary to run.
    #[arg(long, value_name = "PATH", default_value = "node", value_parser = parse_path)]
    pub node: PathBuf,
    #[command(flatten)]
    pub output: OutputArgs,
}

fn parse_pid(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(0) | Err(_) => Err(format!("{s:?} is not a process id (a positive integer)")),
        Ok(p) => Ok(p),
    }
}

fn parse_secs(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..1e9).contains(&v) => Ok(v),
        _ => Err(format!("{s:?} is not a number of seconds")),
    }
}

/// The shortest `--duration` or non-zero `--interval`: anything shorter is a typo, and an
/// interval of nanoseconds would only spin.
pub const MIN_SECS: f64 = 0.001;

fn parse_positive_secs(s: &str) -> Result<Duration, String> {
    match parse_secs(s)? {
        v if v >= MIN_SECS => Ok(Duration::from_secs_f64(v)),
        _ => Err(format!("{s:?} must be at least {MIN_SECS} seconds")),
    }
}

fn parse_interval(s: &str) -> Result<f64, String> {
    match parse_secs(s)? {
        v if v == 0.0 || v >= MIN_SECS => Ok(v),
        _ => Err(format!(
            "{s:?} must be 0 (summary only) or at least {MIN_SECS} seconds"
        )),
    }
}

/// A command name: matching nothing, an empty one would profile nothing until killed.
fn parse_comm(s: &str) -> Result<String, String> {
    if s.is_empty() {
        return Err("a command name cannot be empty".into());
    }
    Ok(s.to_string())
}

fn parse_glob(s: &str) -> Result<String, String> {
    if s.is_empty() {
        return Err("must not be empty".into());
    }
    glob::Pattern::new(s)
        .map(|_| s.to_string())
        .map_err(|e| format!("not a glob: {e}"))
}

fn parse_cgroup(s: &str) -> Result<String, String> {
    if !s.starts_with('/') {
        return Err("a cgroup v2 path starts with / (e.g. /system.slice/api.service)".into());
    }
    Ok(s.trim_end_matches('/').to_string())
}

fn parse_path(s: &str) -> Result<PathBuf, String> {
    if s.is_empty() {
        return Err("a path cannot be empty".into());
    }
    Ok(PathBuf::from(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("mmaplock-prof").chain(args.iter().copied()))
    }

    #[test]
    fn defaults() {
        let c = parse(&[]).unwrap();
        assert!(c.command.is_none());
        assert_eq!(c.profile.interval, Config::INTERVAL_S);
        assert_eq!(c.profile.max_threads, Config::MAX_THREADS);
        assert!(c.profile.pids.is_empty() && c.profile.duration.is_none());
    }

    #[test]
    fn repeatable_filters_and_durations() {
        let c = parse(&[
            "-p", "12", "--pid", "13", "--comm", "node", "-d", "1.5", "-i", "0",
        ])
        .unwrap();
        assert_eq!(c.profile.pids, vec![12, 13]);
        assert_eq!(c.profile.comms, vec!["node"]);
        assert_eq!(c.profile.duration, Some(Duration::from_millis(1500)));
        assert_eq!(c.profile.interval, 0.0);
    }

    #[test]
    fn bad_values_are_usage_errors() {
        for args in [
            &["--pid", "abc"][..],
            &["--pid", "0"],
            &["--pid", "-3"],
            &["-d", "0"],
            &["-i", "-1"],
            &["-f", "xml"],
            &["--bogus"],
            &["--comm", ""],
            &["--comm", "node", "--comm", ""],
            &["-o", ""],
            &["--stacks", ""],
            &["-i", "0.0000001"],
            &["-d", "1e-12"],
            &["-i", "nan"],
            &["demo", "--node", ""],
        ] {
            let e = parse(args).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{args:?}");
        }
    }

    #[test]
    fn empty_values_name_the_option() {
        for (args, needle) in [
            (
                &["--comm", ""][..],
                "--comm <NAME>': a command name cannot be empty",
            ),
            (&["-o", ""], "--output <FILE>': a path cannot be empty"),
            (&["--stacks", ""], "--stacks <FILE>'"),
            (&["-i", "1e-9"], "at least 0.001 seconds"),
        ] {
            let e = parse(args).unwrap_err().to_string();
            let first = e.lines().next().unwrap();
            assert!(first.contains(needle), "{args:?}: {first}");
        }
    }

    #[test]
    fn floor_is_hidden_but_accepted() {
        assert!(parse(&["--floor", "-d", "1"]).unwrap().profile.floor);
        assert!(!parse(&[]).unwrap().profile.floor);
        use clap::CommandFactory as _;
        let help = Cli::command().render_long_help().to_string();
        assert!(!help.contains("--floor"), "{help}");
        assert!(
            parse(&["--floor-clock", "-d", "1"])
                .unwrap()
                .profile
                .floor_clock
        );
        assert!(parse(&["--floor", "--floor-clock"]).is_err());
    }

    #[test]
    fn study_takes_lists_and_sizes_with_units() {
        let c = parse(&[
            "study",
            "-k",
            "2,4",
            "-k",
            "8",
            "--sizes",
            "128B,64KiB",
            "--size",
            "1MiB",
            "--size",
            "16",
            "--scenarios",
            "reuse,default",
            "--scenario",
            "dispose",
        ])
        .unwrap();
        let Some(Command::Study(s)) = c.command else {
            panic!("expected study");
        };
        assert_eq!(s.ks, [2, 4, 8]);
        assert_eq!(s.sizes, [0.125, 64.0, 1024.0, 16.0]);
        assert_eq!(s.scenarios, ["reuse", "default", "dispose"]);
        assert_eq!(s.out, PathBuf::from("study-out"));
        assert!(!s.quick && s.iterations.is_none());
    }

    #[test]
    fn study_bad_values_are_usage_errors() {
        for (args, needle) in [
            (
                &["study", "--scenario", "pool"][..],
                "'pool' for '--scenario <ID>'",
            ),
            (&["study", "--scenarios", "reuse,bogus"], "'bogus'"),
            (&["study", "-k", "0"], "'0' for '-k <K>'"),
            (&["study", "-k", "2,x"], "'x' for '-k <K>'"),
            (&["study", "--size", "10B"], "\"10B\" is not a file size"),
            (&["study", "--size", "2GiB"], "not a file size"),
            (&["study", "--size", "64parsecs"], "not a file size"),
            (&["study", "-n", "0"], "'0' for '-n <N>'"),
            (&["study", "--out", ""], "a path cannot be empty"),
        ] {
            let e = parse(args).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{args:?}");
            let msg = e.to_string();
            assert!(
                msg.lines().next().unwrap().contains(needle),
                "{args:?}: {msg}"
            );
        }
    }

    #[test]
    fn demo_subcommand() {
        let c = parse(&["demo", "-k", "2", "-n", "10"]).unwrap();
        match c.command {
            Some(Command::Demo(d)) => {
                assert_eq!((d.workers, d.iterations, d.file_kib), (2, 10, 64));
            }
            _ => panic!("expected demo"),
        }
    }
}
