//! mmaplock-prof: where processes, Node.js in particular, lose time on the Linux kernel's
//! per-process mmap_lock. See README.md and docs/.

mod agent;
mod aggregation;
mod cli;
mod demo;
mod kernel;
mod nodework;
mod offline;
mod output;
mod registry;
mod run;
mod signals;
mod study;
mod vocab;

use std::{process::ExitCode, time::Duration};

use clap::Parser as _;

use crate::{
    cli::{Cli, Command, Format},
    kernel::collector::CollectorConfig,
};

#[derive(Debug, thiserror::Error)]
enum Error {
    #[error(transparent)]
    Session(#[from] run::SessionError),
    #[error(transparent)]
    Demo(#[from] demo::DemoError),
    #[error(transparent)]
    Agent(#[from] agent::AgentError),
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    #[error(transparent)]
    Kernel(#[from] kernel::features::Unsupported),
    #[error(transparent)]
    Offline(offline::OfflineError),
    #[error(transparent)]
    Study(#[from] study::StudyError),
}

impl Error {
    fn exit_code(&self) -> u8 {
        match self {
            Error::Session(e) => e.exit_code(),
            Error::Demo(e) => e.exit_code(),
            Error::Agent(e) => e.exit_code(),
            Error::Runtime(_) | Error::Kernel(_) => 1,
            Error::Offline(e) => e.exit_code(),
            Error::Study(e) => e.exit_code(),
        }
    }
}

/// Runs the command line; its exit status when the run decides it (`-- COMMAND`,
/// `--fail-above`), else 0.
fn run(cli: Cli) -> Result<u8, Error> {
    // Files only: no kernel involved.
    match &cli.command {
        Some(Command::Report(r)) => return offline::report(r).map(|()| 0).map_err(Error::Offline),
        Some(Command::Compare(c)) => {
            return offline::compare(c).map(|()| 0).map_err(Error::Offline);
        }
        _ => {}
    }
    // Before anything is loaded (every other command loads the programs): what this kernel
    // lacks, probed, said in one line.
    let (blockers, mode) = match &cli.command {
        None => (cli.profile.blockers, Some(cli.profile.mode)),
        Some(Command::Agent(a)) => (a.blockers, a.mode),
        _ => (false, None),
    };
    kernel::features::decide(
        kernel::features::Features::running(),
        kernel::features::Needs {
            // Contention mode names its holders without bpf_loop (the agent's default mode
            // is decided with the kernel's features: full where contention cannot run).
            blockers: blockers
                && (mode == Some(cli::Mode::Full)
                    || (mode.is_none()
                        && !kernel::features::Features::running().contention_tracepoints)),
            contention: mode == Some(cli::Mode::Contention),
        },
    )?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(Error::Runtime)?;
    match cli.command {
        Some(Command::Demo(d)) => rt.block_on(demo::run(demo::DemoConfig {
            workers: d.workers,
            file_kib: d.file_kib,
            iterations: d.iterations,
            node: d.node,
            format: Format::resolve(d.output.format, d.output.output.as_ref()),
            output: d.output.output,
            verbose: d.output.verbose,
        }))?,
        Some(Command::Report(_) | Command::Compare(_)) => unreachable!("handled above"),
        Some(Command::Study(s)) => rt.block_on(study::run(study::StudyConfig {
            out: s.out,
            quick: s.quick,
            ks: s.ks,
            sizes: s.sizes,
            scenarios: s.scenarios,
            node: s.node,
            iterations: s.iterations,
            repeat: s.repeat,
        }))?,
        Some(Command::Agent(a)) => rt.block_on(agent::run(agent::AgentConfig {
            // Stacks are sampled for what shows them (a capture's before.pb.gz is the ring's;
            // the agent decides, the config file's push settings known).
            stack_sample: a.stack_sample,
            max_stack_rate: a.max_stack_rate,
            push: agent::push::PushSettings {
                pyroscope: a.pyroscope,
                otlp: a.otlp,
                interval: a.push_interval,
                headers: a.push_headers,
                ca: a.push_ca,
            },
            listen: a.listen,
            selectors: agent::selection::Selectors {
                comms: a.comms,
                exes: a.exes,
                cgroups: a.cgroups,
                pids: a.pids,
            },
            config_file: a.config,
            web_config: a.web_config,
            pid_label: a.pid_label,
            output: a.output,
            rotate_bytes: a.rotate_mib.max(1) * 1024 * 1024,
            rotate_keep: a.rotate_keep,
            interval: a.interval,
            max_threads: a.max_threads,
            bpf_stats: a.bpf_stats,
            blockers: a.blockers,
            mode: a.mode,
            js_functions: a.js_functions,
            pprof: a.pprof,
            escalate: a.escalate_dir.map(|dir| agent::EscalateConfig {
                dir,
                at_percent: a.escalate_at,
                window: a.escalate_window,
                length: a.escalate_for,
                cooldown: a.escalate_cooldown,
                budget_bytes: a.escalate_budget_mib << 20,
                stack_sample: a.stack_sample,
            }),
            quiet: a.quiet,
        }))?,
        None => {
            let p = cli.profile;
            let interval = p.interval();
            // A command's output has standard output: reports without -o go to standard error.
            let to_stderr = !p.command.is_empty() && p.output.output.is_none();
            let format = match (p.output.format, to_stderr) {
                (Some(f), _) => f,
                (None, true) if std::io::IsTerminal::is_terminal(&std::io::stderr()) => {
                    Format::Text
                }
                (None, true) => Format::Json,
                (None, false) => Format::resolve(None, p.output.output.as_ref()),
            };
            let ended = rt.block_on(run::run(run::SessionConfig {
                collector: CollectorConfig {
                    pids: p.pids,
                    comms: p.comms,
                    max_threads: p.max_threads,
                    bpf_stats: p.bpf_stats,
                    writes_only: p.writes_only,
                    floor: if p.floor {
                        kernel::collector::Floor::Empty
                    } else if p.floor_clock {
                        kernel::collector::Floor::Clock
                    } else if p.floor_storage {
                        kernel::collector::Floor::Storage
                    } else {
                        kernel::collector::Floor::Off
                    },
                    selection: false,
                    children: p.children,
                    blockers: p.blockers,
                    mode: p.mode,
                    stack_sample: p.stack_sample.unwrap_or(if p.stacks.is_some() {
                        cli::Config::STACK_SAMPLE_WITH_STACKS_FILE
                    } else {
                        cli::Config::STACK_SAMPLE
                    }),
                    sample_floor_ms: cli::Config::SAMPLE_FLOOR_MS,
                    floor_after_first: false,
                    max_stack_rate: 0,
                },
                duration: p.duration,
                interval: (interval > 0.0).then(|| Duration::from_secs_f64(interval)),
                format,
                output: p.output.output,
                stacks_file: p.stacks,
                html: p.html,
                pprof: p.pprof,
                study: p.study,
                all_processes: p.all_processes,
                pid_start_ticks: p.pid_start_ticks,
                command: p.command,
                fail_above: p.fail_above,
                verbose: p.output.verbose,
                quiet: p.quiet,
            }))?;
            return Ok(ended.code());
        }
    }
    Ok(0)
}

/// The soft limit of open files up to the hard one: the default 1024 is shared by the kernel
/// side (maps, links, the flush iterator), the files kept for symbolization and, in the
/// agent, the metrics connections (capped under whatever the limit is: agent/http.rs).
fn raise_open_files_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut l = getrlimit(Resource::Nofile);
    if l.current != l.maximum {
        l.current = l.maximum;
        if let Err(e) = setrlimit(Resource::Nofile, l) {
            log::debug!("cannot raise RLIMIT_NOFILE: {e}");
        }
    }
}

/// The logger (standard error): `RUST_LOG` if set, else warnings with the eBPF programs'
/// diagnostics off; `--log-level` then sets mmaplock-prof's own level, its programs' included
/// (the level they are loaded with follows: kernel/ebpf_log.rs).
fn logger(log_level: Option<log::LevelFilter>, rust_log: Option<&str>) -> env_logger::Builder {
    let mut b = env_logger::Builder::new();
    if let Ok(style) = std::env::var("RUST_LOG_STYLE") {
        b.parse_write_style(&style);
    }
    match rust_log {
        Some(filters) => b.parse_filters(filters),
        None => b
            .filter_level(log::LevelFilter::Warn)
            .filter_module(kernel::ebpf_log::LOG_TARGET, log::LevelFilter::Off),
    };
    if let Some(level) = log_level {
        b.filter_module(env!("CARGO_CRATE_NAME"), level)
            .filter_module(kernel::ebpf_log::LOG_TARGET, level);
    }
    b
}

fn main() -> ExitCode {
    // Before anything else: a signal during start-up ends the run cleanly (signals.rs).
    signals::catch_early();
    // A fixed mmap threshold: glibc otherwise raises it after the first large free, and the
    // megabyte-sized buffers of a report for thousands of threads then stay in the heap for
    // good instead of going back to the system.
    // SAFETY: mallopt only tunes the allocator, before any other thread exists.
    unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 256 * 1024) };
    let cli = match Cli::try_parse().and_then(Cli::check) {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            // One line naming the problem, as for every other bad input.
            eprintln!("mmaplock-prof: {} (see --help)", cli::one_line(&e));
            return ExitCode::from(2);
        }
    };
    logger(cli.log_level, std::env::var("RUST_LOG").ok().as_deref()).init();
    if cli.probe_kernel {
        // What the kernel matrix records (docs/kernels.md): the probes, and a verdict that is
        // also the exit status.
        let features = kernel::features::Features::running();
        println!("{features}");
        let usable = kernel::features::decide(features, kernel::features::Needs::default());
        return if usable.is_ok() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        };
    }
    // Only profiling and the agent end cleanly on a signal at any time; the other commands
    // keep the default dispositions.
    if matches!(cli.command, None | Some(Command::Agent(_))) {
        raise_open_files_limit();
    } else {
        signals::restore_default();
    }
    match run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("mmaplock-prof: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

#[cfg(test)]
mod tests {
    use log::{Level, LevelFilter, Log, Metadata};

    use super::logger;
    use crate::kernel::ebpf_log::{LOG_TARGET, level_for};

    fn enabled(l: &dyn Log, target: &str, level: Level) -> bool {
        l.enabled(&Metadata::builder().target(target).level(level).build())
    }

    /// What the eBPF programs are loaded with (`AYA_LOG_LEVEL`), and what else is logged, for
    /// each way of asking.
    #[test]
    fn the_programs_log_only_when_asked() {
        let own = "mmaplock_prof::kernel::load";
        let cases: [(Option<LevelFilter>, Option<&str>, u8); 8] = [
            // Nothing asked: warnings, the programs off.
            (None, None, 0),
            (Some(LevelFilter::Debug), None, Level::Debug as u8),
            (Some(LevelFilter::Warn), None, Level::Warn as u8),
            (Some(LevelFilter::Off), None, 0),
            (None, Some("mmaplock_prof=debug"), Level::Debug as u8),
            (None, Some("info"), Level::Info as u8),
            (None, Some("aya=debug"), 0),
            // The command line wins.
            (Some(LevelFilter::Off), Some("trace"), 0),
        ];
        for (flag, env, want) in cases {
            let l = logger(flag, env).build();
            assert_eq!(
                level_for(&l),
                want,
                "--log-level {flag:?}, RUST_LOG {env:?}"
            );
        }
        let quiet = logger(None, None).build();
        assert!(enabled(&quiet, own, Level::Warn) && !enabled(&quiet, own, Level::Info));
        assert!(!enabled(&quiet, LOG_TARGET, Level::Error));
        // --log-level is mmaplock-prof's own: dependencies stay at warnings.
        let debug = logger(Some(LevelFilter::Debug), None).build();
        assert!(enabled(&debug, own, Level::Debug) && enabled(&debug, LOG_TARGET, Level::Debug));
        assert!(!enabled(&debug, "aya::bpf", Level::Info) && enabled(&debug, "aya", Level::Warn));
    }
}
