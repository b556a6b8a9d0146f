//! The command line (docs/cli.md). Defaults live in [`Config`], so help text, code and docs
//! agree.

use std::{path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand};

pub use crate::vocab::Format;

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
    /// Three runs per cell: two ranges of three runs of one distribution fail to overlap 1
    /// time in 10 (of two runs, 1 in 3), and `--quick` stays around two minutes.
    pub const STUDY_REPEAT: u32 = 3;
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
    /// mmaplock-prof's diagnostics on standard error at LEVEL, its eBPF programs' rare ones
    /// included (a loss's first occurrence, a write in a syscall of unknown cause). Default:
    /// warnings, the programs' off; RUST_LOG (env_logger's syntax) is read first.
    #[arg(long, global = true, value_name = "LEVEL", value_parser = log_levels())]
    pub log_level: Option<log::LevelFilter>,
}

/// `--log-level`'s values (listed in its help and errors).
fn log_levels() -> impl clap::builder::TypedValueParser<Value = log::LevelFilter> {
    use clap::builder::{PossibleValuesParser, TypedValueParser as _};
    PossibleValuesParser::new(["off", "error", "warn", "info", "debug", "trace"])
        .map(|s| s.parse().expect("one of the possible values"))
}

impl Cli {
    /// What clap cannot check by itself: combinations of values.
    pub fn check(self) -> Result<Self, clap::Error> {
        use clap::CommandFactory as _;
        let p = &self.profile;
        if self.command.is_none() && p.stacks.is_some() && p.stack_sample == Some(0) {
            return Err(Cli::command().error(
                clap::error::ErrorKind::ArgumentConflict,
                "--stacks FILE writes sampled stacks, and --stack-sample 0 takes none: leave --stack-sample out (every write is sampled) or give it 1 or more",
            ));
        }
        Ok(self)
    }
}

/// A clap error as the one line every bad input gets: its first line, with the arguments a
/// "required arguments were not provided:" lists on the following lines.
pub fn one_line(e: &clap::Error) -> String {
    let msg = e.to_string();
    let mut lines = msg.lines();
    let first = lines.next().unwrap_or("bad usage");
    let first = first.strip_prefix("error: ").unwrap_or(first);
    if !first.ends_with(':') {
        return first.to_string();
    }
    let listed: Vec<&str> = lines
        .take_while(|l| l.starts_with("  "))
        .map(str::trim)
        .collect();
    format!("{first} {}", listed.join(", "))
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
    /// Every scenario at 64 KiB with k = 4, three times (about two minutes); -k, --size and
    /// --repeat still apply.
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
    /// arena-2, jemalloc, finalization-pool, slab, dispose.
    #[arg(long = "scenario", visible_alias = "scenarios", value_name = "ID",
          value_delimiter = ',', value_parser = parse_scenario)]
    pub scenarios: Vec<String>,
    /// The Node.js binary.
    #[arg(long, value_name = "PATH", default_value = "node", value_parser = parse_path)]
    pub node: PathBuf,
    /// Reads per thread or process (default: by file size, about 0.25 s of `default`).
    #[arg(short = 'n', value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub iterations: Option<u32>,
    /// Runs of every cell of the matrix, interleaved: each verdict and ranking rests on their
    /// spread, and a difference within it is called within noise.
    #[arg(long, value_name = "N", default_value_t = Config::STUDY_REPEAT,
          value_parser = clap::value_parser!(u32).range(1..=100))]
    pub repeat: u32,
}

/// The study's scenarios, in the order it runs them (`--scenarios` accepts these ids).
pub const SCENARIOS: [&str; 10] = [
    "default",
    "pool-256k",
    "reuse",
    "async",
    "arena-1",
    "arena-2",
    "jemalloc",
    "finalization-pool",
    "slab",
    "dispose",
];

/// A scenario id of the study's (the message lists them: the error is shown on one line).
fn parse_scenario(s: &str) -> Result<String, String> {
    let ids = SCENARIOS;
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
    /// Where the page goes (without it, only the findings are printed).
    #[arg(long, value_name = "OUT.html", value_parser = parse_path)]
    pub html: Option<PathBuf>,
    /// The findings printed: text (default on a terminal) or a JSON line.
    #[arg(short, long, value_enum)]
    pub format: Option<Format>,
    /// A study of this host (`mmaplock-prof study`'s results.json): each finding quotes what
    /// its mitigation measured there.
    #[arg(long, value_name = "results.json", value_parser = parse_path)]
    pub study: Option<PathBuf>,
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
    /// A study of this host (results.json): the findings quote its measured effects.
    #[arg(long, value_name = "results.json", value_parser = parse_path)]
    pub study: Option<PathBuf>,
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
    /// TLS and basic auth for /metrics, from a web configuration file in the format
    /// Prometheus exporters share (tls_server_config, basic_auth_users); re-read on SIGHUP.
    #[arg(long = "web.config.file", visible_alias = "web-config-file", value_name = "FILE", value_parser = parse_path)]
    pub web_config: Option<PathBuf>,
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
    #[arg(long, value_name = "N", default_value_t = Config::MAX_THREADS, value_parser = parse_max_threads)]
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
    #[arg(long, value_name = "N", default_value_t = Config::MAX_THREADS, value_parser = parse_max_threads)]
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
    /// A study of this host (`mmaplock-prof study`'s results.json): the summary's findings
    /// quote what each mitigation measured there.
    #[arg(long, value_name = "results.json", value_parser = parse_path)]
    pub study: Option<PathBuf>,
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
    /// Also profile every descendant of the --pid targets (followed in the kernel at fork,
    /// from its first acquisition); the run ends when they have all exited too.
    #[arg(long, requires = "pids")]
    pub children: bool,
    /// Benchmark only (`cargo xtask bench`): attach empty programs to the same tracepoints
    /// instead of the profiler's, to measure the floor cost of any BPF program there.
    #[arg(long, hide = true, conflicts_with_all = ["floor_clock", "floor_storage"])]
    pub floor: bool,
    /// Benchmark only: attach programs that read the clock once and do nothing else, the least
    /// a program timing each acquisition does while the lock is held.
    #[arg(long, hide = true, conflicts_with = "floor_storage")]
    pub floor_clock: bool,
    /// Benchmark only: attach programs that store one clock read in the thread's task storage,
    /// the least a program timing each acquisition per thread does.
    #[arg(long, hide = true)]
    pub floor_storage: bool,
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

/// The validation of every value the CLI and the agent take, on the command line and in
/// `--config` lines alike: one function per kind of value.
pub fn parse_pid(s: &str) -> Result<u32, String> {
    let pid = match s.parse::<u32>() {
        Ok(0) | Err(_) => return Err(format!("{s:?} is not a process id (a positive integer)")),
        Ok(p) => p,
    };
    if is_kernel_thread(pid) {
        return Err(format!(
            "pid {pid} is a kernel thread: kernel threads have no memory map, hence no mmap_lock of their own (their work on others' locks is counted in those processes)"
        ));
    }
    Ok(pid)
}

/// Whether a live pid is a kernel thread (PF_KTHREAD in `/proc/PID/stat`'s flags).
fn is_kernel_thread(pid: u32) -> bool {
    const PF_KTHREAD: u64 = 0x0020_0000;
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // Field 9, counted after the command name's last ')': fields 3, 4, ... so the 7th.
    stat.rfind(')')
        .and_then(|i| {
            stat[i + 1..]
                .split_ascii_whitespace()
                .nth(6)?
                .parse::<u64>()
                .ok()
        })
        .is_some_and(|flags| flags & PF_KTHREAD != 0)
}

/// The most threads `--max-threads` may ask for (the map then takes a few hundred MiB).
pub const MAX_MAX_THREADS: u32 = 4_194_304;

pub fn parse_max_threads(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(n) if (1..=MAX_MAX_THREADS).contains(&n) => Ok(n),
        _ => Err(format!(
            "{s:?} is not a number of threads from 1 to {MAX_MAX_THREADS}"
        )),
    }
}

fn parse_secs(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        // A non-zero number too small for a double (1e-400) parses as 0: it is not 0.
        Ok(v) if v == 0.0 && has_nonzero_digit(s) => Err(format!(
            "{s:?} is too small to be a number of seconds (it would be taken as 0)"
        )),
        Ok(v) if (0.0..1e9).contains(&v) => Ok(v),
        _ => Err(format!("{s:?} is not a number of seconds")),
    }
}

/// Whether the digits of a number's mantissa are not all 0.
fn has_nonzero_digit(s: &str) -> bool {
    let mantissa = s.split(['e', 'E']).next().unwrap_or(s);
    mantissa.bytes().any(|b| (b'1'..=b'9').contains(&b))
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

/// A command name: matching nothing, an empty one would profile nothing until killed, and so
/// would one longer than the kernel keeps (it cuts names to 15 bytes).
pub fn parse_comm(s: &str) -> Result<String, String> {
    if s.is_empty() {
        return Err("a command name cannot be empty".into());
    }
    let max = profiler_common::COMM_LEN - 1;
    if s.len() > max {
        return Err(format!(
            "{s:?} is {} bytes, longer than the {max} the kernel keeps of a command name: it would match nothing (write its first {max} bytes, as /proc/PID/comm shows it)",
            s.len()
        ));
    }
    Ok(s.to_string())
}

pub fn parse_glob(s: &str) -> Result<String, String> {
    if s.is_empty() {
        return Err("must not be empty".into());
    }
    glob::Pattern::new(s)
        .map(|_| s.to_string())
        .map_err(|e| format!("not a glob: {e}"))
}

pub fn parse_cgroup(s: &str) -> Result<String, String> {
    if !s.starts_with('/') {
        return Err(format!(
            "{s:?}: a cgroup v2 path is absolute, as /proc/PID/cgroup shows it (e.g. /system.slice/api.service)"
        ));
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
        assert_eq!(c.log_level, None);
    }

    /// `--log-level` goes anywhere on a profiling line, and after a command's name.
    #[test]
    fn log_level_is_global() {
        use log::LevelFilter::{Debug, Off, Trace};
        assert_eq!(
            parse(&["--log-level", "debug", "-d", "1"])
                .unwrap()
                .log_level,
            Some(Debug)
        );
        assert_eq!(
            parse(&["-d", "1", "--log-level", "off"]).unwrap().log_level,
            Some(Off)
        );
        let agent = parse(&["agent", "--log-level", "trace"]).unwrap();
        assert!(matches!(agent.command, Some(Command::Agent(_))));
        assert_eq!(agent.log_level, Some(Trace));
        let demo = parse(&["demo", "--log-level", "debug"]).unwrap();
        assert!(matches!(demo.command, Some(Command::Demo(_))));
        assert_eq!(demo.log_level, Some(Debug));
        let e = parse(&["--log-level", "loud"]).unwrap_err().to_string();
        assert!(
            e.contains("possible values: off, error, warn, info, debug, trace"),
            "{e}"
        );
    }

    #[test]
    fn repeatable_filters_and_durations() {
        let c = parse(&[
            // Above any pid_max: no process has them now (a kernel thread would be refused).
            "-p", "4194312", "--pid", "4194313", "--comm", "node", "-d", "1.5", "-i", "0",
        ])
        .unwrap();
        assert_eq!(c.profile.pids, vec![4194312, 4194313]);
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
    fn the_agent_and_the_profiler_refuse_the_same_values() {
        for (args, needle) in [
            (&["--max-threads", "0"][..], "'0' for '--max-threads <N>'"),
            (
                &["agent", "--max-threads", "0"],
                "'0' for '--max-threads <N>'",
            ),
            (
                &["--comm", "sixteen-bytes-xx"],
                "is 16 bytes, longer than the 15 the kernel keeps",
            ),
            (&["agent", "--comm", "sixteen-bytes-xx"], "is 16 bytes"),
            (&["-i", "1e-400"], "too small to be a number of seconds"),
            (&["agent", "-i", "1e-400"], "too small"),
            (&["-d", "1e400"], "not a number of seconds"),
            (
                &["agent", "--cgroup", "system.slice"],
                "a cgroup v2 path is absolute",
            ),
            (&["--pid", "2"], "pid 2 is a kernel thread"),
            (&["agent", "--pid", "2"], "kernel thread"),
            (
                &["--stacks", "f", "--stack-sample", "0"],
                "--stack-sample 0 takes none",
            ),
            (&["compare", "a.json"], "were not provided: <AFTER.json>"),
            (&["--children"], "were not provided: --pid <PID>"),
        ] {
            let e = parse(args).and_then(Cli::check).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{args:?}");
            let line = one_line(&e);
            assert!(line.contains(needle), "{args:?}: {line}");
            assert!(!line.contains('\n'), "{line}");
        }
        // Zero is zero, and a comm of exactly 15 bytes is fine.
        assert_eq!(parse(&["-i", "0e5"]).unwrap().profile.interval, 0.0);
        assert!(parse(&["--comm", "fifteen-bytes-x"]).is_ok());
        assert!(
            parse(&["--stacks", "f", "--stack-sample", "1"])
                .and_then(Cli::check)
                .is_ok()
        );
    }

    #[test]
    fn children_has_its_own_help() {
        use clap::CommandFactory as _;
        let help = Cli::command().render_long_help().to_string();
        let children = help
            .split("--children")
            .nth(1)
            .and_then(|s| s.lines().nth(1))
            .unwrap()
            .trim()
            .to_string();
        assert!(
            children.starts_with("Also profile every descendant"),
            "{children}"
        );
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
        assert!(parse(&["--floor-storage"]).unwrap().profile.floor_storage);
        assert!(parse(&["--floor-clock", "--floor-storage"]).is_err());
        assert!(parse(&["--floor", "--floor-storage"]).is_err());
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
        assert_eq!(s.repeat, Config::STUDY_REPEAT);
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
            (&["study", "--repeat", "0"], "'0' for '--repeat <N>'"),
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
