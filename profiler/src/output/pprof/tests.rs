//! The profile of a summary, decoded back: its types, names, mappings, labels and totals.

use std::io::Read as _;

use prost::Message as _;

use super::*;
use crate::output::{
    fixtures::{ndjson, process, summary},
    reading::{Keep, Line},
    report::{SampleCut, SampledStacks},
};
use crate::registry::roles::Role;

/// A process's samples: a Worker's write through a JavaScript function (3 writes, 900 ns),
/// the main thread's through native code only (2 writes, 40 ns), and 4 cut ones.
fn samples() -> SampledStacks {
    let native = |function: &str, dso: &str, build_id: Option<&str>| FrameReport {
        function: function.into(),
        dso: Some(dso.into()),
        build_id: build_id.map(String::from),
        ..FrameReport::default()
    };
    let row = |frames: Vec<u32>, role, cause: &'static str, count, wait, hold| SampleReport {
        frames,
        role,
        comm: "node".into(),
        cause: cause.into(),
        op: "write".into(),
        count,
        wait_ns_sum: wait,
        hold_ns_sum: Some(hold),
        holder: false,
    };
    SampledStacks {
        frames: vec![
            native(
                "mprotect",
                "/usr/lib/x86_64-linux-gnu/libc.so.6",
                Some("ab12"),
            ),
            FrameReport {
                function: "viaReadFile".into(),
                script: Some("/srv/jsapis.js".into()),
                line: Some(46),
                column: Some(22),
                ..FrameReport::default()
            },
            native("uv_run", "/usr/bin/node", None),
        ],
        stacks: vec![
            row(vec![0, 1, 2], Role::Worker, "mprotect", 3, 900, 30),
            row(vec![0, 2], Role::Main, "brk", 2, 40, 20),
        ],
        cut: SampleCut {
            stacks: 2,
            count: 4,
            wait_ns_sum: 7,
            hold_ns_sum: Some(8),
            holder_count: 0,
            holder_wait_ns_sum: 0,
        },
    }
}

fn decode(gz: &[u8]) -> proto::Profile {
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(gz)
        .read_to_end(&mut raw)
        .expect("gzip");
    proto::Profile::decode(raw.as_slice()).expect("a pprof profile")
}

fn pprof_of(r: &Report) -> Vec<u8> {
    let mut out = Vec::new();
    Pprof.emit(r, &mut out).unwrap();
    out
}

fn a_summary() -> Report {
    let mut p = process(7, "node", 5000, false);
    p.samples = Some(samples());
    p.cgroup = Some("/system.slice/api.service".into());
    p.exe = Some("/usr/bin/node".into());
    let mut r = summary(vec![p]);
    r.stack_sample = Some(64);
    r
}

/// The sum of each sample type's values.
fn totals(p: &proto::Profile) -> Vec<i64> {
    let mut t = vec![0; p.sample_type.len()];
    for s in &p.sample {
        for (t, v) in t.iter_mut().zip(&s.value) {
            *t += v;
        }
    }
    t
}

fn string(p: &proto::Profile, i: i64) -> &str {
    &p.string_table[i as usize]
}

#[test]
fn a_summary_is_a_mutex_profile_whose_totals_are_the_sampled_ones() {
    let p = decode(&pprof_of(&a_summary()));
    let types: Vec<(&str, &str)> = (p.sample_type.iter())
        .map(|t| (string(&p, t.r#type), string(&p, t.unit)))
        .collect();
    assert_eq!(
        types,
        [
            ("contentions", "count"),
            ("delay", "nanoseconds"),
            ("writes", "count"),
            ("hold", "nanoseconds"),
            ("holder_contentions", "count"),
            ("holder_delay", "nanoseconds"),
        ]
    );
    let period = p.period_type.unwrap();
    assert_eq!(
        (string(&p, period.r#type), string(&p, period.unit), p.period),
        ("contentions", "count", 64)
    );
    assert_eq!(string(&p, p.default_sample_type), "delay");
    // Unscaled: the sampled writes, their wait and hold, cut ones included.
    assert_eq!(totals(&p), [3 + 2 + 4, 900 + 40 + 7, 9, 30 + 20 + 8, 0, 0]);
    assert_eq!(p.time_nanos, 1_767_225_600_000_000_000);
    assert_eq!(p.duration_nanos, 2_000_000_000);
    let comments: Vec<&str> = p.comment.iter().map(|&c| string(&p, c)).collect();
    assert!(
        comments
            .iter()
            .any(|c| c.starts_with("sampled: 1 in 64 write acquisitions per thread")),
        "{comments:?}"
    );
}

#[test]
fn frames_are_functions_with_their_script_or_their_files_mapping() {
    let p = decode(&pprof_of(&a_summary()));
    let function = |name: &str| {
        (p.function.iter())
            .find(|f| string(&p, f.name) == name)
            .unwrap_or_else(|| panic!("no {name}"))
    };
    let js = function("viaReadFile");
    assert_eq!(
        (string(&p, js.filename), js.start_line),
        ("/srv/jsapis.js", 46)
    );
    let location = |f: &proto::Function| {
        (p.location.iter())
            .find(|l| l.line[0].function_id == f.id)
            .unwrap()
    };
    let l = location(js);
    assert_eq!(
        (l.mapping_id, l.line[0].line, l.line[0].column),
        (0, 46, 22)
    );
    let libc = location(function("mprotect"));
    let m = &p.mapping[libc.mapping_id as usize - 1];
    // The binary first (pprof's main binary), though libc's frame came first.
    assert_eq!(string(&p, p.mapping[0].filename), "/usr/bin/node");
    assert_eq!(location(function("uv_run")).mapping_id, 1);
    assert_eq!(m.id, libc.mapping_id);
    assert_eq!(
        (string(&p, m.filename), string(&p, m.build_id)),
        ("/usr/lib/x86_64-linux-gnu/libc.so.6", "ab12")
    );
    assert!(m.has_functions);
    // Every id a sample names exists; each function and mapping once.
    assert_eq!(p.function.len(), 4, "three frames and the cut ones");
    assert_eq!(p.mapping.len(), 2);
    for s in &p.sample {
        for id in &s.location_id {
            assert!(p.location.iter().any(|l| l.id == *id));
        }
    }
    // The Worker's sample, innermost first, with its labels.
    let worker = &p.sample[0];
    let names: Vec<&str> = (worker.location_id.iter())
        .map(|id| {
            let l = p.location.iter().find(|l| l.id == *id).unwrap();
            let f = p
                .function
                .iter()
                .find(|f| f.id == l.line[0].function_id)
                .unwrap();
            string(&p, f.name)
        })
        .collect();
    assert_eq!(names, ["mprotect", "viaReadFile", "uv_run"]);
    let labels: Vec<(&str, &str)> = (worker.label.iter())
        .map(|l| (string(&p, l.key), string(&p, l.str)))
        .collect();
    assert_eq!(
        labels,
        [
            ("process", "node"),
            ("pid", "7"),
            ("cgroup", "/system.slice/api.service"),
            ("role", "worker"),
            ("comm", "node"),
            ("cause", "mprotect"),
            ("op", "write"),
            ("side", "waiter"),
        ]
    );
    // What was cut: one sample of its own, with the process's labels.
    let cut = p.sample.last().unwrap();
    assert_eq!(cut.value, [4, 7, 4, 8, 0, 0]);
    assert_eq!(cut.label.len(), 4, "the process's and its side");
}

/// A holder's sample (the writer a sampled wait began behind, charged its wait) has its
/// values in the holders' types and 0 in the waiters': each type's total is one side's, so
/// that a default view (`delay`) counts each wait once; the cut rows are split the same way.
#[test]
fn each_side_has_its_own_sample_types_and_a_wait_is_counted_once() {
    for mode in [Mode::Full, Mode::Contention] {
        let mut r = a_summary();
        r.mode = mode;
        let samples = r.processes[0].samples.as_mut().unwrap();
        samples.stacks[1].holder = true;
        samples.cut.holder_count = 5;
        samples.cut.holder_wait_ns_sum = 11;
        let p = decode(&pprof_of(&r));
        let total = |name: &str| {
            let i = (p.sample_type.iter())
                .position(|t| string(&p, t.r#type) == name)
                .unwrap();
            totals(&p)[i]
        };
        assert_eq!(string(&p, p.default_sample_type), "delay");
        // The waiters: the Worker's row and the cut waiters; the holders: main's row and
        // the cut holders.
        assert_eq!((total("contentions"), total("delay")), (3 + 4, 900 + 7));
        assert_eq!(
            (total("holder_contentions"), total("holder_delay")),
            (2 + 5, 40 + 11)
        );
        let side = |s: &proto::Sample| {
            (s.label.iter())
                .find(|l| string(&p, l.key) == "side")
                .map(|l| string(&p, l.str).to_string())
                .unwrap()
        };
        let n = p.sample_type.len();
        for s in &p.sample {
            let (own, other) = match side(s).as_str() {
                "waiter" => (&s.value[..n - 2], &s.value[n - 2..]),
                _ => (&s.value[n - 2..], &s.value[..n - 2]),
            };
            assert!(other.iter().all(|&v| v == 0), "{mode:?} {s:?}");
            assert!(own.iter().any(|&v| v > 0), "{mode:?} {s:?}");
        }
    }
}

/// The profile's main binary is the process's executable, though an addon's `.node` file
/// (a shared object not named `.so`) was the first file sampled.
#[test]
fn the_executable_is_the_first_mapping() {
    let mut r = a_summary();
    let samples = r.processes[0].samples.as_mut().unwrap();
    samples.frames[0].dso = Some("/srv/build/Release/churn.node".into());
    let p = decode(&pprof_of(&r));
    let files: Vec<&str> = p.mapping.iter().map(|m| string(&p, m.filename)).collect();
    assert_eq!(files, ["/usr/bin/node", "/srv/build/Release/churn.node"]);
    // Without a known executable, shared objects still go last.
    r.processes[0].exe = None;
    let p = decode(&pprof_of(&r));
    assert_eq!(string(&p, p.mapping[0].filename), "/usr/bin/node");
}

/// `report RUN.json --pprof` reads the summary back from its JSON line: the same profile.
#[test]
fn the_saved_summary_gives_the_same_profile() {
    let r = a_summary();
    let mut read = None;
    crate::output::reading::read("run.json", ndjson(&[&r]).as_bytes(), |l| {
        if let Line::Summary(s) = l {
            read = Some(s);
        }
    })
    .unwrap();
    assert_eq!(pprof_of(&read.unwrap()), pprof_of(&r));
    let _ = crate::output::html::RunLines::parse("run.json", &ndjson(&[&r])).unwrap();
}

/// In contention mode the samples are contended waits: no hold, no writes column.
#[test]
fn contention_mode_has_no_hold_types() {
    let mut r = a_summary();
    r.mode = Mode::Contention;
    let p = decode(&pprof_of(&r));
    assert_eq!(p.sample_type.len(), 4);
    assert_eq!(totals(&p), [9, 947, 0, 0]);
    let comments: Vec<&str> = p.comment.iter().map(|&c| string(&p, c)).collect();
    assert!(
        comments
            .iter()
            .any(|c| c.contains("1 in 64 contended writes")),
        "{comments:?}"
    );
}
