//! The command line (docs/cli.md). Defaults live in [`Config`], so help text, code and docs
//! agree.//!
//! Here the command itself (`Cli`, its subcommands, the profiling run's arguments); the
//! subcommands' arguments are `commands.rs`, the value parsers the agent's `--config` shares
//! `values.rs`.

use std::{path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand};

mod commands;
#[cfg(test)]
mod tests;
mod values;

pub use crate::vocab::{Format, Mode};
pub use commands::{AgentArgs, CompareArgs, DemoArgs, ReportArgs, SCENARIOS, StudyArgs};
#[cfg(test)]
pub use values::a_kernel_thread;
pub use values::{
    parse_cgroup, parse_comm, parse_glob, parse_pid, parse_push_header, parse_push_interval,
    parse_push_url,
};
use values::{
    parse_fail_above, parse_interval, parse_max_threads, parse_path, parse_positive_secs,
};

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
    /// With stacks sampled, a process's write (contention mode: wait) is sampled too when the
    /// process had none sampled for this long: a process whose writes are few, or spread
    /// over many threads that each make fewer than `STACK_SAMPLE`, still shows its code (a
    /// native library's threads growing glibc's arenas a few times a second each).
    pub const SAMPLE_FLOOR_MS: u32 = 1000;
    /// The agent's bound on the stacks a process has taken a second (`--max-stack-rate`):
    /// past it the kernel side samples that process less often, the samples weighted to
    /// `--stack-sample`. What a hot process costs the agent is then bounded (the agent's CPU
    /// and the programs' both grow with the stacks taken), while a profile of a few minutes
    /// still holds thousands of its stacks.
    pub const AGENT_MAX_STACK_RATE: u32 = 50;
    pub const DEMO_WORKERS: u32 = 4;
    pub const DEMO_FILE_KIB: u32 = 64;
    pub const DEMO_ITERATIONS: u32 = 2_000;
    /// Three runs per cell: two ranges of three runs of one distribution fail to overlap 1
    /// time in 10 (of two runs, 1 in 3), and `--quick` stays around two minutes.
    pub const STUDY_REPEAT: u32 = 3;
    /// The agent's `--escalate-*` defaults: left on, a capture of 15 s in full mode once a
    /// process's threads spent 5% of their time over 30 s waiting for its lock, at most once
    /// in 10 minutes per process, the captures kept within 512 MiB.
    pub const ESCALATE_AT: &str = "5";
    pub const ESCALATE_WINDOW: &str = "30";
    pub const ESCALATE_FOR: &str = "15";
    pub const ESCALATE_COOLDOWN: &str = "600";
    pub const ESCALATE_BUDGET_MIB: u64 = 512;
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
    /// Print what this kernel offers the eBPF programs (each probed feature, then whether
    /// every mode runs here) and exit: 0 if profiling can run, 1 if not.
    #[arg(long)]
    pub probe_kernel: bool,
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
        if self.command.is_none() && p.pprof.is_some() && p.stack_sample == Some(0) {
            return Err(Cli::command().error(
                clap::error::ErrorKind::ArgumentConflict,
                "--pprof FILE is a profile of the sampled stacks, and --stack-sample 0 takes none: leave --stack-sample out (1 write in 64) or give it 1 or more",
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
        // An invalid value: the values there are, which clap lists on the next line.
        return match msg
            .lines()
            .map(str::trim)
            .find(|l| l.starts_with("[possible values:"))
        {
            Some(values) => format!("{first} {values}"),
            None => first.to_string(),
        };
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
    Agent(Box<AgentArgs>),
    /// Render a run's NDJSON (or a study's results.json) as a self-contained HTML page.
    Report(ReportArgs),
    /// Compare two runs (before and after a fix): writes and write wait per group of processes,
    /// thread role and cause, with ratios; several runs per file are judged for noise.
    Compare(CompareArgs),
    /// The investigation's mitigation study on this machine: every scenario as Worker
    /// threads and as processes, profiled; results.json, results.md and report.html.
    Study(StudyArgs),
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
    /// Processes whose command name is NAME: at exec, or renamed to it later (Node's
    /// `process.title`); all their threads; repeatable.
    #[arg(long = "comm", value_name = "NAME", value_parser = parse_comm)]
    pub comms: Vec<String>,
    /// Stop after SECS (default: until Ctrl-C, SIGTERM, or the targets exit).
    #[arg(short, long, value_name = "SECS", value_parser = parse_positive_secs)]
    pub duration: Option<Duration>,
    /// An interval report every SECS; 0 = the summary only. Default 1, or 0 with a COMMAND
    /// whose reports go to standard error (no -o).
    #[arg(short, long, value_name = "SECS", value_parser = parse_interval)]
    pub interval: Option<f64>,
    /// Threads the kernel's statistics map has room for (4 entries each: reads and write
    /// causes); beyond it, acquisitions are counted in `lost.map_full`. Allocated as used.
    #[arg(long, value_name = "N", default_value_t = Config::MAX_THREADS, value_parser = parse_max_threads)]
    pub max_threads: u32,
    /// Capture the user stack of one in N write acquisitions (per thread), to charge writes
    /// to code (`dsos`, `js_functions`, `stacks` in the summary); 0 turns it off. Default 64
    /// (1 with --stacks): a 16 KiB stack copy per sampled write, before the lock is taken.
    /// Also a process's write whenever it had none sampled for a second.
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
    /// Also write a pprof profile of the sampled stacks at the end (gzipped protobuf, as Go's
    /// mutex profile: contentions and delay), for `go tool pprof`, speedscope, Pyroscope or
    /// Parca; values are the sampled writes, unscaled.
    #[arg(long, value_name = "FILE", value_parser = parse_path)]
    pub pprof: Option<PathBuf>,
    /// A study of this host (`mmaplock-prof study`'s results.json): the summary's findings
    /// quote what each mitigation measured there.
    #[arg(long, value_name = "results.json", value_parser = parse_path)]
    pub study: Option<PathBuf>,
    /// What to measure: `full`, every acquisition's wait and hold (three tracepoints, a clock
    /// read at each), or `contention`, only the waits that went to the lock's slow path
    /// (`lock:contention_begin/end`, Linux 5.19+): an acquisition that does not wait costs
    /// nothing, and uncontended acquisitions, optimistic spinning, trylocks and hold times
    /// are not seen.
    #[arg(long, value_enum, default_value_t = Mode::Full)]
    pub mode: Mode,
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
    /// The agent's captures only (`--escalate-dir`): the --pid process must have started at
    /// these clock ticks after boot (/proc/PID/stat), so that a pid reused by another process
    /// between the agent's decision and this run is refused, not profiled.
    #[arg(long, hide = true, requires = "pids", value_name = "TICKS")]
    pub pid_start_ticks: Option<u64>,
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
    /// List every process in the summary and show each in the text and the page. By
    /// default the summary lists the processes that waited materially and the 10 others that
    /// waited longest, and groups the rest by command (`minor_processes`); the text and the
    /// page show the 10 that waited longest in full, a line for the others.
    #[arg(long)]
    pub all_processes: bool,
    /// Exit with status 3 (once the summary is written) when the profiled threads' wait for
    /// their processes' mmap_lock is over PCT percent of their time alive: the summary's
    /// processes' `time_share` pooled (their waits summed over their times summed). With a
    /// COMMAND, its own failure wins: its status is the exit status.
    #[arg(long, value_name = "PCT", value_parser = parse_fail_above)]
    pub fail_above: Option<f64>,
    /// No status messages on standard error.
    #[arg(short, long)]
    pub quiet: bool,
    #[command(flatten)]
    pub output: OutputArgs,
    /// Run COMMAND and profile it and its descendants from their first instruction; the run
    /// ends when it exits, and the exit status is its own. Under sudo it runs as the user who
    /// ran sudo (SUDO_UID, SUDO_GID). Signals sent to the profiler are passed on to it.
    #[arg(last = true, value_name = "COMMAND", num_args = 1.., value_parser = clap::value_parser!(std::ffi::OsString),
          conflicts_with_all = ["pids", "children", "pid_start_ticks"])]
    pub command: Vec<std::ffi::OsString>,
}

impl ProfileArgs {
    /// `--interval`: as given, else 1, or 0 (the summary only) for a COMMAND whose reports go
    /// to standard error among its own output.
    pub fn interval(&self) -> f64 {
        self.interval.unwrap_or(
            if !self.command.is_empty() && self.output.output.is_none() {
                0.0
            } else {
                Config::INTERVAL_S
            },
        )
    }
}
