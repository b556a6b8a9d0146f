//! pprof profiles of the sampled stacks, for the tools people already look at profiles in
//! (`go tool pprof`, speedscope, Grafana Pyroscope, Parca): `--pprof FILE`, `report RUN.json
//! --pprof FILE`, the agent's `/debug/pprof/mmaplock`, its pushes and its captures.
//!
//! Each wait is counted once in every default view. As Go keeps its block profile (the
//! waiters) apart from its mutex profile (the holders), the waiters' samples carry their
//! values in `contentions/count` and `delay/nanoseconds` (the default sample type; in full
//! mode also `writes/count` and `hold/nanoseconds`, their own acquisitions' hold), and the
//! holders' samples (the writer a sampled wait began behind, charged its wait) in
//! `holder_contentions/count` and `holder_delay/nanoseconds`: a sample is 0 in the other
//! side's types, so a viewer that shows one type (`go tool pprof -top`, a Pyroscope or Parca
//! profile type) never adds the two sides. Period type `contentions/count`, period the
//! sampling rate. Values are the sampled acquisitions, unscaled, so that a profile's totals
//! are the report's sampled totals exactly; the comments say the rate. Each sample carries
//! its process's labels (`process`, `pid` or `cgroup`) and its own (`role`, `comm`, `cause`,
//! `op`, `side`); frames are functions with their script and line (JavaScript) or their
//! file's mapping and build id (native code), the process's executable the first mapping.

pub(crate) mod proto;
#[cfg(test)]
mod tests;

use std::{
    collections::HashMap,
    io::{self, Write},
};

use prost::Message as _;

pub use crate::vocab::Mode;

use crate::output::{
    Output,
    report::{FrameReport, Report, SampleCut, SampleReport},
};

/// Frames by index, as a process's samples refer to them.
pub trait Frames {
    fn frame(&self, i: u32) -> Option<&FrameReport>;
}

impl Frames for Vec<FrameReport> {
    fn frame(&self, i: u32) -> Option<&FrameReport> {
        self.get(i as usize)
    }
}

/// One process's sampled stacks, with the labels every one of its samples carries.
pub struct ProcessSamples<'a> {
    pub labels: Vec<(&'static str, String)>,
    /// Its executable's path (`/proc/PID/exe`), the profile's main binary; None when unknown.
    pub exe: Option<&'a str>,
    pub frames: &'a dyn Frames,
    pub stacks: &'a [SampleReport],
    pub cut: SampleCut,
}

/// What a profile is made of: a summary's `samples`, or the agent's last intervals.
pub trait Samples {
    fn mode(&self) -> Mode;
    /// One in how many acquisitions per thread had its stack taken.
    fn rate(&self) -> Option<u32>;
    /// When what it covers began, ns since the epoch, and how long it lasted, ns.
    fn span_ns(&self) -> (i64, i64);
    /// Comments beyond the rate (what the window is, what is left out).
    fn notes(&self) -> Vec<String>;
    fn processes(&self) -> Vec<ProcessSamples<'_>>;
}

/// ns since the epoch of an RFC 3339 time (0 if it is not one).
pub fn epoch_ns(t: &str) -> i64 {
    humantime::parse_rfc3339(t)
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos() as i64)
}

/// Summaries as one profile: a run's, or a demo's runs side by side (each process with its
/// own labels).
pub struct Summaries<'a>(pub Vec<&'a Report>);

impl Samples for Summaries<'_> {
    fn mode(&self) -> Mode {
        self.0.first().map_or(Mode::Full, |r| r.mode)
    }
    fn rate(&self) -> Option<u32> {
        self.0.iter().find_map(|r| r.stack_sample)
    }
    fn span_ns(&self) -> (i64, i64) {
        let (Some(first), Some(last)) = (self.0.first(), self.0.last()) else {
            return (0, 0);
        };
        let start = epoch_ns(&first.start);
        let secs = last.duration_s.or(last.interval_s).unwrap_or(0.0);
        let end = epoch_ns(&last.end).max(epoch_ns(&last.start) + (secs * 1e9).round() as i64);
        (start, end.saturating_sub(start).max(0))
    }
    fn notes(&self) -> Vec<String> {
        (self.0.iter())
            .map(|r| format!("run from {} to {}", r.start, r.end))
            .collect()
    }
    fn processes(&self) -> Vec<ProcessSamples<'_>> {
        (self.0.iter().flat_map(|r| &r.processes))
            .filter_map(|p| {
                let s = p.samples.as_ref()?;
                let mut labels = vec![("process", p.comm.clone()), ("pid", p.pid.to_string())];
                if let Some(c) = &p.cgroup {
                    labels.push(("cgroup", c.clone()));
                }
                Some(ProcessSamples {
                    labels,
                    exe: p.exe.as_deref(),
                    frames: &s.frames,
                    stacks: &s.stacks,
                    cut: s.cut,
                })
            })
            .collect()
    }
}

/// The processes of another [`Samples`] that carry these labels (a Pyroscope push names
/// its labels once per request).
pub struct Subset<'a> {
    pub of: &'a dyn Samples,
    pub labels: &'a [(&'static str, String)],
}

impl Samples for Subset<'_> {
    fn mode(&self) -> Mode {
        self.of.mode()
    }
    fn rate(&self) -> Option<u32> {
        self.of.rate()
    }
    fn span_ns(&self) -> (i64, i64) {
        self.of.span_ns()
    }
    fn notes(&self) -> Vec<String> {
        self.of.notes()
    }
    fn processes(&self) -> Vec<ProcessSamples<'_>> {
        (self.of.processes().into_iter())
            .filter(|p| p.labels == self.labels)
            .collect()
    }
}

/// The gzipped pprof profile of any [`Samples`].
pub struct Pprof;

impl<'a> Output<dyn Samples + 'a> for Pprof {
    fn emit(&mut self, samples: &(dyn Samples + 'a), out: &mut dyn Write) -> io::Result<()> {
        let bytes = profile(samples).encode_to_vec();
        let mut gz = flate2::write::GzEncoder::new(out, flate2::Compression::default());
        gz.write_all(&bytes)?;
        gz.finish().map(|_| ())
    }
}

impl Output for Pprof {
    fn emit(&mut self, report: &Report, out: &mut dyn Write) -> io::Result<()> {
        Output::<dyn Samples>::emit(self, &Summaries(vec![report]), out)
    }
}

/// A sample's identity: its locations and its labels (key, value) as string indices.
type SampleId = (Vec<u64>, Vec<(i64, i64)>);

/// Builds a profile: strings, mappings, functions and locations each kept once, samples of
/// the same stack and labels merged.
#[derive(Default)]
struct Builder {
    p: proto::Profile,
    strings: HashMap<String, i64>,
    mappings: HashMap<(i64, i64), u64>,
    functions: HashMap<(i64, i64, i64), u64>,
    locations: HashMap<(u64, u64, i64, i64), u64>,
    samples: HashMap<SampleId, usize>,
    /// The string indices of the processes' executables.
    exes: Vec<i64>,
}

impl Builder {
    fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.p.string_table.len() as i64;
        self.p.string_table.push(s.to_string());
        self.strings.insert(s.to_string(), i);
        i
    }

    fn value_type(&mut self, t: &str, unit: &str) -> proto::ValueType {
        proto::ValueType {
            r#type: self.string(t),
            unit: self.string(unit),
        }
    }

    fn mapping(&mut self, file: &str, build_id: Option<&str>) -> u64 {
        let key = (self.string(file), self.string(build_id.unwrap_or("")));
        let next = self.p.mapping.len() as u64 + 1;
        let id = *self.mappings.entry(key).or_insert(next);
        if id == next {
            self.p.mapping.push(proto::Mapping {
                id,
                filename: key.0,
                build_id: key.1,
                has_functions: true,
            });
        }
        id
    }

    fn location(&mut self, f: &FrameReport) -> u64 {
        let mapping = match &f.dso {
            Some(d) => self.mapping(d, f.build_id.as_deref()),
            None => 0,
        };
        let name = self.string(&f.function);
        let file = self.string(f.script.as_deref().unwrap_or(""));
        let line = i64::from(f.line.unwrap_or(0));
        let next = self.p.function.len() as u64 + 1;
        let function = *self.functions.entry((name, file, line)).or_insert(next);
        if function == next {
            self.p.function.push(proto::Function {
                id: function,
                name,
                system_name: name,
                filename: file,
                start_line: line,
            });
        }
        let column = i64::from(f.column.unwrap_or(0));
        let next = self.p.location.len() as u64 + 1;
        let id = *(self.locations)
            .entry((mapping, function, line, column))
            .or_insert(next);
        if id == next {
            self.p.location.push(proto::Location {
                id,
                mapping_id: mapping,
                line: vec![proto::Line {
                    function_id: function,
                    line,
                    column,
                }],
            });
        }
        id
    }

    fn sample(&mut self, locations: Vec<u64>, labels: &[(&str, &str)], values: &[i64]) {
        let labels: Vec<proto::Label> = (labels.iter())
            .map(|(k, v)| proto::Label {
                key: self.string(k),
                str: self.string(v),
            })
            .collect();
        let next = self.p.sample.len();
        let key = labels.iter().map(|l| (l.key, l.str)).collect();
        let at = *self.samples.entry((locations.clone(), key)).or_insert(next);
        if at == next {
            self.p.sample.push(proto::Sample {
                location_id: locations,
                value: values.to_vec(),
                label: labels,
            });
        } else {
            for (v, add) in self.p.sample[at].value.iter_mut().zip(values) {
                *v += add;
            }
        }
    }
}

/// The sample types of a mode, in order: the waiters' (`delay` the default), then the
/// holders'.
pub fn sample_types(mode: Mode) -> &'static [(&'static str, &'static str)] {
    match mode {
        Mode::Full => &[
            ("contentions", "count"),
            ("delay", "nanoseconds"),
            ("writes", "count"),
            ("hold", "nanoseconds"),
            ("holder_contentions", "count"),
            ("holder_delay", "nanoseconds"),
        ],
        Mode::Contention => &[
            ("contentions", "count"),
            ("delay", "nanoseconds"),
            ("holder_contentions", "count"),
            ("holder_delay", "nanoseconds"),
        ],
    }
}

/// One side's sums for a sample: a waiter's acquisitions (count, wait, writes, hold) or the
/// waits charged to a holder (count, wait).
#[derive(Clone, Copy, Default)]
struct Sums {
    count: u64,
    wait: u64,
    writes: u64,
    hold: u64,
}

/// A sampled stack's values, in the order of [`sample_types`]: its side's, 0 in the other's.
pub fn row_values(mode: Mode, row: &SampleReport) -> Vec<i64> {
    let sums = Sums {
        count: row.count,
        wait: row.wait_ns_sum,
        writes: if row.op == "write" { row.count } else { 0 },
        hold: row.hold_ns_sum.unwrap_or(0),
    };
    values(mode, row.holder, sums)
}

/// What a process's samples cut come to, per side (`true`: the holders'), in the order of
/// [`sample_types`]; a side with nothing cut is left out.
pub fn cut_values(mode: Mode, c: &SampleCut) -> Vec<(bool, Vec<i64>)> {
    // Full mode samples writes only: there the cut waiters' are writes.
    let waiters = Sums {
        count: c.count,
        wait: c.wait_ns_sum,
        writes: c.count,
        hold: c.hold_ns_sum.unwrap_or(0),
    };
    let holders = Sums {
        count: c.holder_count,
        wait: c.holder_wait_ns_sum,
        ..Sums::default()
    };
    [(false, waiters), (true, holders)]
        .into_iter()
        .filter(|(_, s)| s.count > 0)
        .map(|(holder, s)| (holder, values(mode, holder, s)))
        .collect()
}

/// A sample's values, in the order of [`sample_types`]: its side's, 0 in the other's.
fn values(mode: Mode, holder: bool, s: Sums) -> Vec<i64> {
    let v = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    let (count, wait) = (v(s.count), v(s.wait));
    match (mode, holder) {
        (Mode::Full, false) => vec![count, wait, v(s.writes), v(s.hold), 0, 0],
        (Mode::Full, true) => vec![0, 0, 0, 0, count, wait],
        (Mode::Contention, false) => vec![count, wait, 0, 0],
        (Mode::Contention, true) => vec![0, 0, count, wait],
    }
}

/// The frame a process's cut samples stand under.
pub fn cut_frame(c: &SampleCut) -> FrameReport {
    FrameReport {
        function: format!("[{} sampled stacks cut]", c.stacks),
        ..FrameReport::default()
    }
}

/// The profile of `s` (not yet encoded).
fn profile(s: &dyn Samples) -> proto::Profile {
    let mode = s.mode();
    let mut b = Builder::default();
    b.string("");
    b.p.sample_type = (sample_types(mode).iter())
        .map(|(t, u)| b.value_type(t, u))
        .collect();
    let contentions = b.p.sample_type[0];
    b.p.period_type = Some(contentions);
    b.p.period = i64::from(s.rate().unwrap_or(1));
    b.p.default_sample_type = b.p.sample_type[1].r#type;
    (b.p.time_nanos, b.p.duration_nanos) = s.span_ns();
    let what = match mode {
        Mode::Full => "write acquisitions",
        Mode::Contention => "contended writes (waits that went to the lock's slow path)",
    };
    let mut comments = vec![format!(
        "mmaplock-prof {}: waits for the kernel's mmap_lock by sampled stack",
        env!("CARGO_PKG_VERSION")
    )];
    if let Some(n) = s.rate() {
        comments.push(format!(
            "sampled: 1 in {n} {what} per thread; values are the sampled ones, unscaled (multiply by {n} to estimate all)"
        ));
    }
    comments.push(
        "contentions and delay: the waiters' stacks (the default); holder_contentions and holder_delay: the holders' stacks, charged the waits that began behind them (-sample_index=holder_delay); each sample is 0 in the other side's types"
            .to_string(),
    );
    if mode == Mode::Full {
        comments.push(
            "contentions counts every sampled acquisition, whether it waited or not; writes the write ones; hold their hold of the lock"
                .to_string(),
        );
    }
    comments.extend(s.notes());
    let mut cut = SampleCut::default();
    for p in s.processes() {
        if let Some(exe) = p.exe {
            let i = b.string(exe);
            b.exes.push(i);
        }
        let mut labels: Vec<(&str, &str)> =
            (p.labels.iter()).map(|(k, v)| (*k, v.as_str())).collect();
        let base = labels.len();
        for row in p.stacks {
            let locations = (row.frames.iter())
                .filter_map(|&i| p.frames.frame(i))
                .map(|f| b.location(f))
                .collect();
            labels.truncate(base);
            labels.extend([
                ("role", row.role.as_str()),
                ("comm", row.comm.as_str()),
                ("cause", row.cause.as_ref()),
                ("op", row.op.as_ref()),
                ("side", if row.holder { "holder" } else { "waiter" }),
            ]);
            b.sample(locations, &labels, &row_values(mode, row));
        }
        let c = p.cut;
        let sides = cut_values(mode, &c);
        if !sides.is_empty() {
            let at = vec![b.location(&cut_frame(&c))];
            for (holder, values) in sides {
                labels.truncate(base);
                labels.push(("side", if holder { "holder" } else { "waiter" }));
                b.sample(at.clone(), &labels, &values);
            }
            cut.stacks += c.stacks;
        }
    }
    if cut.stacks > 0 {
        comments.push(format!(
            "{} distinct stacks past the report's limit are each process's `[... sampled stacks cut]` sample",
            cut.stacks
        ));
    }
    b.p.comment = comments.iter().map(|c| b.string(c)).collect();
    let exes = std::mem::take(&mut b.exes);
    executables_first(&mut b.p, &exes);
    b.p
}

/// pprof takes the first mapping for the program's binary: the processes' executables
/// (node) go first, then other files, then shared objects (`*.so*`, and a native addon's
/// `*.node`, often the first sampled), their ids renumbered.
fn executables_first(p: &mut proto::Profile, exes: &[i64]) {
    let rank = |m: &proto::Mapping| {
        let file = &p.string_table[m.filename as usize];
        if exes.contains(&m.filename) {
            0
        } else if file.contains(".so") || file.ends_with(".node") {
            2
        } else {
            1
        }
    };
    let mut order: Vec<usize> = (0..p.mapping.len()).collect();
    order.sort_by_key(|&i| rank(&p.mapping[i]));
    let mut new_id = vec![0u64; p.mapping.len() + 1];
    for (n, &i) in order.iter().enumerate() {
        new_id[p.mapping[i].id as usize] = n as u64 + 1;
    }
    let mut mappings: Vec<proto::Mapping> = order.iter().map(|&i| p.mapping[i].clone()).collect();
    for m in &mut mappings {
        m.id = new_id[m.id as usize];
    }
    p.mapping = mappings;
    for l in &mut p.location {
        l.mapping_id = new_id[l.mapping_id as usize];
    }
}
