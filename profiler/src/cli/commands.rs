//! The subcommands' arguments: `demo`, `agent`, `report`, `compare` and `study` (the study's
//! scenario ids and file sizes with them).

use std::{path::PathBuf, time::Duration};

use clap::Args;

use super::values::{
    parse_cgroup, parse_comm, parse_glob, parse_max_threads, parse_path, parse_percent, parse_pid,
    parse_positive_secs, parse_push_header, parse_push_interval, parse_push_url,
};
use super::{Config, OutputArgs};
use crate::{
    output::compare::By,
    vocab::{Format, Mode},
};

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
    /// Also write the run as a self-contained HTML page.
    #[arg(long, value_name = "OUT.html", value_parser = parse_path)]
    pub html: Option<PathBuf>,
    /// What is printed: text (default on a terminal: the summary as the live run printed it,
    /// findings, tables and histograms) or json (the findings, one line).
    #[arg(short, long, value_enum)]
    pub format: Option<Format>,
    /// A study of this host (`mmaplock-prof study`'s results.json): each finding quotes what
    /// its mitigation measured there.
    #[arg(long, value_name = "results.json", value_parser = parse_path)]
    pub study: Option<PathBuf>,
    /// Also write a pprof profile of the run's sampled stacks (its summary's `samples`), the
    /// same as the live run's --pprof.
    #[arg(long, value_name = "FILE", value_parser = parse_path)]
    pub pprof: Option<PathBuf>,
    /// Show every process the file lists in the text and the page (by default the 10 that
    /// waited longest in full, a line for the others), and group none (a file of an earlier
    /// build, or of `--all-processes`, lists every process).
    #[arg(long)]
    pub all_processes: bool,
    /// The agent's captures only: write this `trigger` (a JSON file) into the run's summary,
    /// in place, before rendering it.
    #[arg(long, hide = true, value_name = "FILE", value_parser = parse_path)]
    pub trigger: Option<PathBuf>,
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
    /// Group processes before comparing: run (all of a run's processes summed, so that a run
    /// of Worker threads lines up with one of child processes), comm (command name), cgroup,
    /// or exe (executable's path, whatever the process calls itself).
    #[arg(long, value_name = "BY", default_value = "run", value_parser = by_parser())]
    pub by: By,
}

/// `--by`'s values, each error listing them.
fn by_parser() -> impl clap::builder::TypedValueParser<Value = By> {
    use clap::builder::TypedValueParser as _;
    clap::builder::PossibleValuesParser::new(By::NAMES)
        .map(|s| By::parse(&s).expect("one of the possible values"))
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
    /// Contention mode always names the writer each wait waited behind.
    #[arg(long)]
    pub blockers: bool,
    /// `contention` (only waits that went to the lock's slow path: nothing paid by an
    /// acquisition that does not wait) or `full` (every acquisition's wait and hold). Default:
    /// contention where the kernel has the lock contention tracepoints (Linux 5.19+), full
    /// otherwise (said at start and in mmaplock_mode_fallback).
    #[arg(long, value_enum)]
    pub mode: Option<Mode>,
    /// Export the sampled writes of up to N JavaScript functions per process
    /// (mmaplock_js_function_sampled_writes_total{process,cgroup,function}; past N, "(other)").
    /// Samples one write's stack in --stack-sample per thread; 0: off.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub js_functions: usize,
    /// Serve /debug/pprof/mmaplock on the --listen address (same TLS and auth as /metrics):
    /// a pprof profile of the sampled stacks of the last interval, or of the last N seconds
    /// with ?seconds=N (at most 600), for Parca or Grafana Alloy's pyroscope.scrape. Samples
    /// one write's stack in --stack-sample per thread.
    #[arg(long)]
    pub pprof: bool,
    /// Take a bounded full profile of a process whose threads' wait for its lock crosses
    /// --escalate-at, into a directory of its own under DIR (report.ndjson, report.html,
    /// profile.pb.gz, and before.pb.gz: this agent's sampled stacks of the window that
    /// crossed). One capture at a time on the host (docs/agent.md).
    #[arg(long, value_name = "DIR", value_parser = parse_path)]
    pub escalate_dir: Option<PathBuf>,
    /// The threshold: the process's threads' wait for its lock, in percent of their time
    /// alive, over --escalate-window (at least 20 waits in it).
    #[arg(long, value_name = "PERCENT", default_value = Config::ESCALATE_AT, value_parser = parse_percent)]
    pub escalate_at: f64,
    /// The window the share is measured over.
    #[arg(long, value_name = "SECS", default_value = Config::ESCALATE_WINDOW, value_parser = parse_positive_secs)]
    pub escalate_window: Duration,
    /// The capture's length.
    #[arg(long, value_name = "SECS", default_value = Config::ESCALATE_FOR, value_parser = parse_positive_secs)]
    pub escalate_for: Duration,
    /// No second capture of a process within SECS of its last one's start.
    #[arg(long, value_name = "SECS", default_value = Config::ESCALATE_COOLDOWN, value_parser = parse_positive_secs)]
    pub escalate_cooldown: Duration,
    /// The captures kept under --escalate-dir at most, in MiB: the oldest go first.
    #[arg(long, value_name = "MIB", default_value_t = Config::ESCALATE_BUDGET_MIB, value_parser = clap::value_parser!(u64).range(1..))]
    pub escalate_budget_mib: u64,
    /// Push pprof profiles of the sampled stacks to Grafana Pyroscope at URL/ingest, one per
    /// process and cgroup every --push-interval (application name: the process's name;
    /// labels process, cgroup, host). Samples one write's stack in --stack-sample per thread.
    #[arg(long, value_name = "URL", value_parser = parse_push_url)]
    pub pyroscope: Option<String>,
    /// Push OTLP/HTTP (protobuf) to URL: the sampled stacks as OTLP profiles (alpha, proto
    /// 1.10 v1development) to URL/v1development/profiles and the metrics of /metrics to
    /// URL/v1/metrics, every --push-interval.
    #[arg(long, value_name = "URL", value_parser = parse_push_url)]
    pub otlp: Option<String>,
    /// How often --pyroscope and --otlp push, 1 to 600 (default 15; each push covers what
    /// ended since the last).
    #[arg(long, value_name = "SECS", value_parser = parse_push_interval)]
    pub push_interval: Option<std::time::Duration>,
    /// A header sent with every push, e.g. 'Authorization: Bearer TOKEN' or
    /// 'X-Scope-OrgID: tenant'; repeatable (a secret is better kept in --config, 0600).
    #[arg(long = "push-header", value_name = "NAME: VALUE", value_parser = parse_push_header)]
    pub push_headers: Vec<(String, String)>,
    /// The CA certificate(s), PEM, that https push URLs must chain to (default: Mozilla's
    /// roots, as webpki-roots ships them).
    #[arg(long, value_name = "FILE", value_parser = parse_path)]
    pub push_ca: Option<PathBuf>,
    /// With --js-functions, --pprof, --pyroscope, --otlp or --escalate-dir: take one write's
    /// stack in N per thread.
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub stack_sample: u32,
    /// At most about this many stacks a second per process: one that waits more often is
    /// sampled less often (its samples weighted to --stack-sample, so that counts stay
    /// unbiased); 0: no bound.
    #[arg(long, value_name = "PER_S", default_value_t = Config::AGENT_MAX_STACK_RATE)]
    pub max_stack_rate: u32,
    /// No status messages on standard error.
    #[arg(short, long)]
    pub quiet: bool,
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
