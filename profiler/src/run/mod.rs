//! A profiling run: attach, report every interval, stop on duration, signal or the targets'
//! exit, and always finish with a complete summary.
//!
//! Data flows one way: collector (kernel maps) -> aggregation (deltas, windows) ->
//! attribution and report (model) -> output (JSON lines or text).

use std::{
    fs::File,
    io::{self, BufWriter, Write},
    os::fd::{FromRawFd, OwnedFd},
    path::PathBuf,
    time::{Duration, SystemTime},
};

use tokio::{
    io::{Interest, unix::AsyncFd},
    signal::unix::{SignalKind, signal},
};

use aya::maps::{MapData, RingBuf};
use profiler_common::exit_record;
use rustc_hash::FxHashMap as HashMap;

use crate::{
    aggregation::{Totals, Window, ids_of},
    cli::Format,
    collector::{Collector, CollectorConfig, CollectorError, Counters, ProgramStats},
    ids::{self, ProcId, ThreadId},
    report::{Kind, Lost, Overhead, Report, ReportBuilder, Uncounted, to_text},
    stacks::StackAttribution,
};

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("no process with pid {0}")]
    NoSuchPid(u32),
    #[error("cannot watch pid {0}: {1}")]
    Watch(u32, io::Error),
    #[error("cannot write {0}: {1}")]
    OpenOutput(PathBuf, io::Error),
    #[error("cannot write the report: {0}")]
    Write(io::Error),
    #[error("cannot read events from the kernel: {0}")]
    Events(io::Error),
    #[error("cannot install signal handlers: {0}")]
    Signals(io::Error),
    #[error(transparent)]
    Collector(#[from] CollectorError),
}

impl SessionError {
    /// 2 for bad usage, 1 for an environment the tool cannot run in.
    pub fn exit_code(&self) -> u8 {
        match self {
            SessionError::NoSuchPid(_) | SessionError::OpenOutput(..) => 2,
            SessionError::Collector(
                CollectorError::TooManyPids
                | CollectorError::TooManyComms
                | CollectorError::CommTooLong(_),
            ) => 2,
            _ => 1,
        }
    }
}

/// Where reports go, and in which format.
pub struct Sink {
    out: Box<dyn Write>,
    format: Format,
    /// The reader went away (e.g. `| head`): keep profiling quietly, write nothing more.
    closed: bool,
}

impl Sink {
    pub fn open(output: Option<&PathBuf>, format: Format) -> Result<Self, SessionError> {
        let out: Box<dyn Write> = match output {
            Some(p) => Box::new(BufWriter::new(
                File::create(p).map_err(|e| SessionError::OpenOutput(p.clone(), e))?,
            )),
            None => Box::new(io::stdout()),
        };
        Ok(Sink {
            out,
            format,
            closed: false,
        })
    }

    pub fn format(&self) -> Format {
        self.format
    }

    /// Writes a report, then frees it.
    pub fn write_report(&mut self, r: Report) -> Result<(), SessionError> {
        if self.closed {
            return Ok(());
        }
        let res = match self.format {
            // Straight to the writer: a report of ten thousand threads is megabytes.
            Format::Json => serde_json::to_writer(&mut self.out, &r)
                .map_err(io::Error::from)
                .and_then(|_| self.out.write_all(b"\n"))
                .and_then(|_| self.out.flush()),
            Format::Text => {
                let text = to_text(&r);
                self.out
                    .write_all(text.as_bytes())
                    .and_then(|_| self.out.flush())
            }
        };
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

/// Waits for processes to exit through pidfds (no polling, no pid-reuse race).
pub struct Targets {
    fds: Vec<AsyncFd<OwnedFd>>,
}

impl Targets {
    /// Opens every pid; a pid that does not exist is a usage error.
    pub fn open(pids: &[u32]) -> Result<Self, SessionError> {
        let mut fds = Vec::new();
        for &pid in pids {
            // SAFETY: plain syscall; the returned fd is owned by us from here on.
            let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
            if fd < 0 {
                let e = io::Error::last_os_error();
                return Err(if e.raw_os_error() == Some(libc::ESRCH) {
                    SessionError::NoSuchPid(pid)
                } else {
                    SessionError::Watch(pid, e)
                });
            }
            let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
            // SAFETY: the OwnedFd stays open, and the same fd, for the AsyncFd's lifetime.
            let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
                .map_err(|e| SessionError::Watch(pid, io::Error::other(e.to_string())))?;
            fds.push(fd);
        }
        Ok(Targets { fds })
    }

    /// Resolves once every target has exited; never if there are none.
    pub async fn all_exited(&self) {
        if self.fds.is_empty() {
            return std::future::pending().await;
        }
        for fd in &self.fds {
            // A pidfd becomes readable when its process exits.
            let _ = fd.readable().await;
        }
    }
}

/// Everything a run accumulates between two readings of the kernel maps.
pub struct Profile {
    pub collector: Collector,
    totals: Totals,
    /// Activity since the last interval report; None without interval reports.
    interval: Option<Window>,
    pub builder: ReportBuilder,
    start: SystemTime,
    interval_start: SystemTime,
    counters_at_interval: Counters,
    counters: Counters,
    /// `exits_lost` when last looked at.
    exits_lost: u64,
    /// Threads that began exiting and are not freed yet (their last acquisitions are still
    /// to be flushed), with their process.
    exiting: HashMap<ThreadId, u32>,
    /// Threads still exiting when the run ended (see `Lost::exit_pending`).
    exit_pending: u64,
    /// BPF statistics at the start of the interval and now; None when not collected.
    programs_at_interval: Option<Vec<ProgramStats>>,
    programs: Option<Vec<ProgramStats>>,
    /// With stack sampling: writes by code.
    pub stacks: Option<StackAttribution>,
    polls: u64,
}

/// Every this many readings, all entries are read (see `Profile::poll`).
const FULL_READ_EVERY: u64 = 30;

/// How long the end of a run waits for exiting threads to be freed (an RCU grace period or
/// two, normally a few milliseconds).
const EXIT_WAIT: Duration = Duration::from_secs(1);

fn lost(c: Counters, base: Counters, exit_pending: u64) -> Lost {
    Lost {
        events: 0,
        map_full: c.map_full.saturating_sub(base.map_full),
        stacks: c.stacks_lost.saturating_sub(base.stacks_lost),
        nested: c.nested.saturating_sub(base.nested),
        no_state: c.no_state.saturating_sub(base.no_state),
        ring_full: c.ring_full.saturating_sub(base.ring_full),
        exit_flush: c.exit_flush.saturating_sub(base.exit_flush),
        exit_pending,
    }
    .with_total()
}

fn uncounted(c: Counters, base: Counters) -> Uncounted {
    Uncounted {
        fork_child: c.fork_child.saturating_sub(base.fork_child),
        flushed_under_lock: c.flush_under_lock.saturating_sub(base.flush_under_lock),
    }
}

impl Profile {
    /// `intervals`: whether interval reports are wanted (otherwise no interval window is kept).
    pub fn new(collector: Collector, intervals: bool) -> Self {
        let now = SystemTime::now();
        Profile {
            collector,
            totals: Totals::default(),
            interval: intervals.then(Window::default),
            builder: ReportBuilder::default(),
            start: now,
            interval_start: now,
            counters_at_interval: Counters::default(),
            counters: Counters::default(),
            exits_lost: 0,
            exiting: HashMap::default(),
            exit_pending: 0,
            programs_at_interval: None,
            programs: None,
            stacks: None,
            polls: 0,
        }
    }

    /// Reads the kernel maps and folds what changed into the interval and total windows.
    /// First the kernel flushes every live thread's pending acquisitions (so that a thread
    /// idle since its last acquisition is counted now, not whenever it next locks). `all`:
    /// read every kernel entry, not only those noted as changed (see
    /// `Collector::read_stats`); done every few readings and at the end.
    pub fn poll(&mut self, all: bool) -> Result<(), SessionError> {
        self.polls += 1;
        let all = all || self.polls.is_multiple_of(FULL_READ_EVERY);
        self.collector.flush_pending()?;
        // Exit notices before the reading: a freed thread's last acquisitions were flushed
        // and noted before its notice was sent, so the reading below has them.
        let freed = self.take_exit_notices();
        // Read once per poll: a lost DIRTY note means reading every entry.
        let counters = self.collector.counters()?;
        let all = all || counters.dirty_lost != self.counters.dirty_lost;
        let (totals, interval, builder) = (&mut self.totals, &mut self.interval, &mut self.builder);
        self.collector.read_stats(all, |chunk| {
            for d in totals.update(chunk) {
                let (owner, thread) = ids_of(&d.key);
                // Learn a process's name and a thread's role while they are alive.
                builder.names.prime(owner);
                builder
                    .roles
                    .observe(owner, thread, d.tgid, &d.comm, d.fsbase);
                if let Some(interval) = interval.as_mut() {
                    interval.add(&d);
                }
            }
        })?;
        self.counters = counters;
        self.programs = self
            .collector
            .bpf_stats_on()
            .then(|| self.collector.program_stats());
        for t in freed {
            self.retire_thread(t)?;
        }
        if self.counters.exits_lost != self.exits_lost {
            self.exits_lost = self.counters.exits_lost;
            self.prune_by_proc()?;
        }
        Ok(())
    }

    /// Drains the exit notices: remembers exiting threads, returns the freed ones.
    fn take_exit_notices(&mut self) -> Vec<ThreadId> {
        let mut freed = Vec::new();
        for e in self.collector.exited_threads() {
            let t = ThreadId::new(e.tid, ids::ticks_of_ns(e.tid_start));
            match e.tag {
                exit_record::EXITING => {
                    self.exiting.insert(t, e.tgid);
                }
                exit_record::FREED => {
                    self.exiting.remove(&t);
                    freed.push(t);
                }
                _ => {}
            }
        }
        freed
    }

    /// A thread is gone: reads its entries one last time, deletes them, keeps its totals with
    /// its role, and forgets what was cached about it (and about its processes once they are
    /// gone too).
    fn retire_thread(&mut self, thread: ThreadId) -> Result<(), SessionError> {
        for owner in self.totals.owners_of(thread) {
            let keys = self.totals.keys_of(owner, thread);
            let mut last = Vec::with_capacity(keys.len());
            for key in &keys {
                if let Some(v) = self.collector.lookup(key)? {
                    last.push((*key, v));
                }
            }
            for d in self.totals.update(&last) {
                if let Some(interval) = self.interval.as_mut() {
                    interval.add(&d);
                }
            }
            for key in &keys {
                self.collector.remove(key);
            }
            let role = self
                .totals
                .identity(owner, thread)
                .map(|(tgid, comm, fsbase)| {
                    self.builder.roles.role(owner, thread, tgid, &comm, fsbase)
                });
            self.totals.retire(owner, thread, role);
            self.builder.roles.forget_thread(owner, thread);
            if let Some(stacks) = self.stacks.as_mut() {
                stacks.forget_thread(thread.tid);
            }
            if !self.totals.has_live_threads(owner) && !ids::is_alive(owner) {
                self.forget_process(owner);
            }
        }
        Ok(())
    }

    /// Drops everything cached about a process that is gone (its name stays in the
    /// report through its retired threads' totals).
    fn forget_process(&mut self, owner: ProcId) {
        // The name is part of the results: it moves to the totals.
        if let Some(name) = self.builder.names.cached(owner) {
            self.totals.name_process(owner, name.to_string());
        }
        self.builder.names.forget(owner);
        self.builder.roles.forget_process(owner);
        if let Some(stacks) = self.stacks.as_mut() {
            stacks.forget_process(owner);
        }
    }

    /// Looks for exited threads in /proc: only needed when exit notices were lost.
    fn prune_by_proc(&mut self) -> Result<(), SessionError> {
        let dead: Vec<ThreadId> = self
            .totals
            .live_threads()
            .filter(|&(_, tid, tgid)| !ids::thread_is_alive(tgid, tid))
            .map(|(_, tid, _)| tid)
            .collect();
        for t in dead {
            self.retire_thread(t)?;
        }
        Ok(())
    }

    /// The end of a run: the kernel flushes every live thread's pending acquisitions, and
    /// threads that began exiting are waited for (briefly) until they are freed, so that
    /// their last acquisitions are in; then everything is read.
    pub async fn finish(&mut self) -> Result<(), SessionError> {
        self.collector.flush_pending()?;
        let waited_since = tokio::time::Instant::now();
        let mut freed = self.take_exit_notices();
        // An exiting thread is freed within an RCU grace period of being reaped; only an
        // unreaped zombie leader keeps us waiting the whole time.
        while !self.exiting.is_empty() && waited_since.elapsed() < EXIT_WAIT {
            tokio::time::sleep(Duration::from_millis(5)).await;
            freed.extend(self.take_exit_notices());
        }
        // A thread still listed in /proc (an unreaped zombie) was flushed by the iterator;
        // one that is gone from /proc but not freed yet may still hold acquisitions back.
        self.collector.flush_pending()?;
        freed.extend(self.take_exit_notices());
        self.exit_pending = self
            .exiting
            .iter()
            .filter(|(t, tgid)| {
                !std::path::Path::new(&format!("/proc/{tgid}/task/{}", t.tid)).exists()
            })
            .count() as u64;
        // The freed threads are retired by the poll (their notices were taken here).
        self.poll(true)?;
        for t in freed {
            self.retire_thread(t)?;
        }
        Ok(())
    }

    /// Our cost since the reading `since` (None: since our programs were loaded, when their
    /// statistics started from zero); None when the kernel does not collect statistics.
    fn overhead(
        &self,
        since: Option<&[ProgramStats]>,
        start: SystemTime,
        end: SystemTime,
    ) -> Option<Overhead> {
        let cur = self.programs.as_deref()?;
        let wall = end.duration_since(start).unwrap_or_default();
        Some(Overhead::between(cur, since.unwrap_or(&[]), wall))
    }

    /// Classifies the threads announced on the ring buffer, while they run.
    pub fn classify_new_threads(&mut self, ring: &mut RingBuf<MapData>) {
        while let Some(item) = ring.next() {
            if let Some(t) = Collector::parse_new_thread(&item) {
                let owner = ProcId::new(t.owner, ids::ticks_of_ns(t.owner_start));
                self.builder.names.prime(owner);
                self.builder.roles.observe(
                    owner,
                    ThreadId::new(t.tid, ids::ticks_of_ns(t.tid_start)),
                    t.tgid,
                    &t.comm,
                    t.fsbase,
                );
            }
        }
    }

    /// Everything since the start, per process and thread.
    pub fn total_window(&self) -> Window {
        self.totals.window()
    }

    /// With stack sampling, reads the unwind information of the given processes now.
    pub fn prepare_stacks(&mut self, pids: &[u32]) {
        if self.collector.stack_sample() == 0 {
            return;
        }
        let mut stacks = StackAttribution::default();
        for p in pids.iter().filter_map(|&pid| ProcId::of_live(pid)) {
            stacks.prepare(p);
        }
        self.stacks = Some(stacks);
    }

    /// Folds up to `max` sampled stack records into the stack attribution; returns how many.
    pub fn take_stacks(&mut self, ring: &mut RingBuf<MapData>, max: usize) -> usize {
        let Some(stacks) = self.stacks.as_mut() else {
            return 0;
        };
        let mut n = 0;
        while n < max {
            let Some(item) = ring.next() else { break };
            stacks.on_record(&item);
            n += 1;
        }
        n
    }

    /// The report for the interval since the previous one, which it then starts anew.
    pub fn interval_report(&mut self) -> Report {
        let now = SystemTime::now();
        let overhead = self.overhead(
            self.programs_at_interval.as_deref(),
            self.interval_start,
            now,
        );
        let window = self.interval.take().unwrap_or_default();
        let r = self.builder.build(
            Kind::Interval,
            &window,
            self.interval_start,
            now,
            (
                lost(self.counters, self.counters_at_interval, 0),
                uncounted(self.counters, self.counters_at_interval),
            ),
            overhead,
        );
        self.interval = Some(Window::default());
        self.interval_start = now;
        self.counters_at_interval = self.counters;
        self.programs_at_interval = self.programs.clone();
        r
    }

    pub fn summary(&mut self) -> Report {
        let now = SystemTime::now();
        // Our programs were loaded at the start: their statistics count from zero.
        let overhead = self.overhead(None, self.start, now);
        let total = self.totals.window();
        let mut r = self.builder.build(
            Kind::Summary,
            &total,
            self.start,
            now,
            (
                lost(self.counters, Counters::default(), self.exit_pending),
                uncounted(self.counters, Counters::default()),
            ),
            overhead,
        );
        if let Some(stacks) = &mut self.stacks {
            stacks.symbolize();
            self.builder
                .add_stacks(&mut r, stacks, self.collector.stack_sample());
        }
        r
    }
}

/// Stack records handled between two looks at the new threads.
const STACK_BATCH: usize = 32;

/// The ring buffers the kernel side writes to: threads seen for the first time, and sampled
/// stacks. Records are drained as soon as they arrive, so that threads are classified while
/// they run and the stacks buffer never fills.
pub struct Rings {
    new_threads: AsyncFd<RingBuf<MapData>>,
    stacks: Option<AsyncFd<RingBuf<MapData>>>,
}

fn register(ring: RingBuf<MapData>) -> Result<AsyncFd<RingBuf<MapData>>, SessionError> {
    // SAFETY: the ring buffer owns its fd, open and unchanged for the AsyncFd's lifetime.
    unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
        .map_err(|e| SessionError::Events(io::Error::other(e.to_string())))
}

impl Rings {
    /// Takes the collector's ring buffers (stacks only when sampling them); must run inside
    /// the async runtime.
    pub fn open(collector: &mut Collector) -> Result<Self, SessionError> {
        let new_threads = register(collector.take_new_threads()?)?;
        let stacks = if collector.stack_sample() > 0 {
            Some(register(collector.take_stacks()?)?)
        } else {
            None
        };
        Ok(Rings {
            new_threads,
            stacks,
        })
    }

    /// Waits until a ring buffer has records. Readiness is cleared before returning, so that
    /// records arriving after the following [`drain`](Self::drain) wake us again.
    pub async fn ready(&self) -> io::Result<()> {
        let stacks = async {
            match &self.stacks {
                Some(s) => s.readable().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            g = self.new_threads.readable() => g?.clear_ready(),
            g = stacks => g?.clear_ready(),
        }
        Ok(())
    }

    /// Hands every record available to `profile`. New threads come first, and are looked at
    /// again between small batches of stacks: a thread must be classified while it lives,
    /// a stack can wait.
    pub fn drain(&mut self, profile: &mut Profile) {
        loop {
            profile.classify_new_threads(self.new_threads.get_mut());
            let Some(s) = self.stacks.as_mut() else {
                return;
            };
            if profile.take_stacks(s.get_mut(), STACK_BATCH) < STACK_BATCH {
                profile.classify_new_threads(self.new_threads.get_mut());
                return;
            }
        }
    }
}

/// What a run needs.
pub struct SessionConfig {
    pub collector: CollectorConfig,
    pub duration: Option<Duration>,
    /// None: summary only.
    pub interval: Option<Duration>,
    pub format: Format,
    pub output: Option<PathBuf>,
    /// Folded stacks go there at the end.
    pub stacks_file: Option<PathBuf>,
    pub verbose: bool,
    pub quiet: bool,
}

fn names_get(names: &crate::attribution::ProcessNames, p: ProcId) -> String {
    names.cached(p).unwrap_or("?").to_string()
}

fn describe_targets(c: &CollectorConfig) -> String {
    let mut parts = Vec::new();
    if !c.pids.is_empty() {
        let pids: Vec<String> = c.pids.iter().map(u32::to_string).collect();
        parts.push(format!("pid {}", pids.join(", ")));
    }
    if !c.comms.is_empty() {
        parts.push(format!("comm {}", c.comms.join(", ")));
    }
    if parts.is_empty() {
        "all processes".into()
    } else {
        parts.join(" and ")
    }
}

pub async fn run(cfg: SessionConfig) -> Result<(), SessionError> {
    // Validate everything the user gave before touching the kernel.
    let targets = Targets::open(&cfg.collector.pids)?;
    let mut sink = Sink::open(cfg.output.as_ref(), cfg.format)?;
    // Say now, not at the end, if the folded stacks cannot be written.
    if let Some(path) = &cfg.stacks_file {
        File::create(path).map_err(|e| SessionError::OpenOutput(path.clone(), e))?;
    }
    let mut sigint = signal(SignalKind::interrupt()).map_err(SessionError::Signals)?;
    let mut sigterm = signal(SignalKind::terminate()).map_err(SessionError::Signals)?;
    let mut sighup = signal(SignalKind::hangup()).map_err(SessionError::Signals)?;

    let collector = Collector::start(&cfg.collector)?;
    if cfg.verbose {
        let l = collector.kernel.layout;
        eprintln!(
            "mmaplock-prof: tracepoint layout {}; task_struct offsets mm={} tgid={} group_leader={} comm={}; mm_struct.owner={}",
            collector.kernel.tracepoints,
            l.task_mm,
            l.task_tgid,
            l.task_group_leader,
            l.task_comm,
            if l.mm_owner == 0 {
                "absent (no CONFIG_MEMCG: foreign takers charged to pid 0)".to_string()
            } else {
                l.mm_owner.to_string()
            },
        );
    }
    if !cfg.quiet {
        eprintln!(
            "mmaplock-prof: attached in {:.1} ms, profiling {}; Ctrl-C to stop",
            collector.attach_time.as_secs_f64() * 1e3,
            describe_targets(&cfg.collector)
        );
    }
    let mut collector = collector;
    let mut rings = Rings::open(&mut collector)?;
    let mut profile = Profile::new(collector, cfg.interval.is_some());
    profile.prepare_stacks(&cfg.collector.pids);
    for p in cfg
        .collector
        .pids
        .iter()
        .filter_map(|&pid| ProcId::of_live(pid))
    {
        profile.builder.names.prime(p);
    }

    let deadline = async {
        match cfg.duration {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);
    // Without interval reports, still read the maps every second so that exited threads'
    // entries are freed (and their names learnt) while the run goes on.
    let period = cfg.interval.unwrap_or(Duration::from_secs(1));
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let exited = targets.all_exited();
    tokio::pin!(exited);

    // A failure mid-run ends the run, but after the summary of what was gathered.
    let mut failure = None;
    loop {
        tokio::select! {
            _ = ticker.tick() => {
                // Sampled stacks first: a process forgotten by the poll must have had them.
                rings.drain(&mut profile);
                let step = profile.poll(false).and_then(|()| match cfg.interval {
                    Some(_) => sink.write_report(profile.interval_report()),
                    None => Ok(()),
                });
                if let Err(e) = step {
                    failure = Some(e);
                    break;
                }
            }
            ready = rings.ready() => {
                if let Err(e) = ready {
                    failure = Some(SessionError::Events(e));
                    break;
                }
                rings.drain(&mut profile);
            }
            _ = &mut deadline => break,
            _ = &mut exited => break,
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
            _ = sighup.recv() => break,
        }
    }

    // The last (partial) interval and the summary; the signal handlers stay installed, so a
    // second Ctrl-C cannot cut the summary short.
    rings.drain(&mut profile);
    let last = profile.finish().await;
    rings.drain(&mut profile);
    if cfg.interval.is_some() && last.is_ok() {
        let r = profile.interval_report();
        sink.write_report(r)?;
    }
    let summary = profile.summary();
    sink.write_report(summary)?;
    if let Some(e) = failure {
        return Err(e);
    }
    last?;
    if let (Some(path), Some(stacks)) = (&cfg.stacks_file, &profile.stacks) {
        let names = &mut profile.builder.names;
        let folded = stacks.folded(|pid| names_get(names, pid));
        std::fs::write(path, folded).map_err(|e| SessionError::OpenOutput(path.clone(), e))?;
    }
    Ok(())
}
