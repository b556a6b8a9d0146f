use super::*;
use crate::{
    output::{
        fixtures::{process, stats},
        report::{FrameReport, SampleReport, SampledStacks, ThreadReport},
    },
    registry::roles::Role,
};

/// A process of `threads` listed threads, `stacks` sampled stacks of 40 frames of long C++
/// names, and `functions` JavaScript functions: far more than a summary line may hold.
fn huge(threads: u32, stacks: u32, functions: u32) -> ProcessReport {
    let mut p = process(1, "node", 5_000_000, false);
    let t0 = p.threads[1].clone();
    p.threads = (0..threads)
        .map(|i| ThreadReport {
            tid: 10 + i,
            lock: crate::output::report::LockReport {
                write: stats(3, u64::from(i) * 1000 + 1000, 2000, &[(2048, 3)]),
                ..t0.lock.clone()
            },
            ..t0.clone()
        })
        .collect();
    let frames: Vec<FrameReport> = (0..stacks * 4)
        .map(|i| FrameReport {
            function: format!(
                "v8::internal::SomeLongNamespace::SomeClass<v8::internal::Template{i}>::Method(int, unsigned long)"
            ),
            dso: Some("/usr/lib/x86_64-linux-gnu/libnode.so.115".into()),
            build_id: Some("0123456789abcdef0123456789abcdef01234567".into()),
            ..FrameReport::default()
        })
        .collect();
    p.samples = Some(SampledStacks {
        frames,
        stacks: (0..stacks)
            .map(|i| SampleReport {
                frames: (0..40).map(|j| (i * 4 + j % 4) % (stacks * 4)).collect(),
                role: Role::Worker,
                comm: "node".into(),
                cause: "mmap".into(),
                op: "write".into(),
                count: 2,
                wait_ns_sum: u64::from(stacks - i) * 100,
                hold_ns_sum: Some(10),
                holder: false,
            })
            .collect(),
        cut: Default::default(),
    });
    p.js_functions = Some(
        (0..functions)
            .map(|i| JsFunctionReport {
                function: format!("handler{i}"),
                file: format!("/srv/app/a/rather/long/path/to/module{i}.js:{i}:3"),
                writes: 1,
                wait_ns_sum: u64::from(functions - i),
            })
            .collect(),
    );
    p
}

fn json_len(p: &ProcessReport) -> usize {
    serde_json::to_vec(p).unwrap().len()
}

/// A process's entry past the bound is cut to it, the stacks that waited least first, then
/// its threads, then its functions; everything cut is counted, and the process's sums stay
/// whole.
#[test]
fn a_process_past_the_bound_is_cut_to_it_and_says_what_it_cut() {
    let mut p = huge(600, 5_000, 20_000);
    let before = json_len(&p);
    assert!(before > 4 * MAX_PROCESS_BYTES, "{before}");
    let writes: u64 = p.threads.iter().map(|t| t.lock.write.count).sum();
    let sampled: u64 = p
        .samples
        .as_ref()
        .unwrap()
        .stacks
        .iter()
        .map(|s| s.count)
        .sum();
    let js_writes: u64 = p.js_functions.iter().flatten().map(|f| f.writes).sum();
    bound_process(&mut p, MAX_PROCESS_BYTES);
    let after = json_len(&p);
    assert!(after <= MAX_PROCESS_BYTES, "{after} bytes");
    let t = p.trimmed.clone().expect("said what it cut");
    assert_eq!(t.bytes, before as u64);
    // Samples: those kept and those cut add up; the kept waited longest; frames only theirs.
    let s = p.samples.as_ref().unwrap();
    let kept: u64 = s.stacks.iter().map(|x| x.count).sum();
    assert_eq!(kept + s.cut.count, sampled);
    assert_eq!(t.samples, Some(s.cut.stacks));
    assert!(
        s.stacks
            .windows(2)
            .all(|w| w[0].wait_ns_sum >= w[1].wait_ns_sum)
    );
    let used: std::collections::BTreeSet<u32> = s
        .stacks
        .iter()
        .flat_map(|x| x.frames.iter().copied())
        .collect();
    assert_eq!(used.len(), s.frames.len(), "no frame unused, none missing");
    assert!(
        s.stacks
            .iter()
            .all(|x| x.frames.iter().all(|&i| (i as usize) < s.frames.len()))
    );
    // Threads: the listed and the grouped add up.
    let rows: u64 = p.thread_rows().map(|(t, _)| t.lock.write.count).sum();
    assert_eq!(rows, writes);
    assert_eq!(p.threads.len() as u64 + p.grouped_threads(), 600, "{t:?}");
    // Functions: kept and cut add up.
    let kept_js: u64 = p.js_functions.iter().flatten().map(|f| f.writes).sum();
    let cut_js = t.js_functions.map_or(0, |c| c.count);
    assert_eq!(kept_js + cut_js, js_writes);
    // The flame graph is what is left of the samples.
    assert_eq!(
        p.flame
            .as_ref()
            .map(|f| f.iter().map(|x| x.count).sum::<u64>()),
        Some(kept)
    );
    // Within the bound already: untouched.
    let mut small = process(2, "node", 5_000, true);
    bound_process(&mut small, MAX_PROCESS_BYTES);
    assert!(small.trimmed.is_none());
}

/// A sampled frame is labelled alike whether it comes from the profile or from a file's
/// `samples`, so that the flame graph a reader derives is the live run's.
#[test]
fn frames_are_labelled_alike_live_and_read_back() {
    use crate::registry::stacks::SampledFrame;
    for f in [
        SampledFrame {
            function: "munmap".into(),
            script: None,
            line: None,
            column: None,
            dso: Some("/usr/lib/x86_64-linux-gnu/libc.so.6".into()),
            build_id: None,
        },
        SampledFrame {
            function: "viaReadFile".into(),
            script: Some("/srv/app.js".into()),
            line: Some(46),
            column: Some(22),
            dso: None,
            build_id: None,
        },
        SampledFrame {
            function: "[jit]".into(),
            script: None,
            line: None,
            column: None,
            dso: None,
            build_id: None,
        },
    ] {
        assert_eq!(FrameReport::from(&f).label(), f.label());
    }
}
