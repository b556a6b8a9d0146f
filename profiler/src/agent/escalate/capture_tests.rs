//! The capture's outcomes, and its plan per kernel.

use super::*;

#[test]
fn the_plan_avoids_full_mode_where_it_costs_every_process() {
    assert!(
        Plan::for_kernel(TracepointLayout::WithMemcgPath)
            .args
            .contains(&"contention")
    );
    let p = Plan::for_kernel(TracepointLayout::Current);
    assert!(p.args.contains(&"full") && p.args.contains(&"--blockers"));
}

/// A capture whose profiler has ended, its verdict written by `sh -c script` (standing
/// in for `report --trigger`), in a directory holding its report and trigger.
fn rendering(dir: &Path, script: &str) -> Capture {
    fs::create_dir_all(dir).unwrap();
    fs::write(dir.join("report.ndjson"), "{\"type\":\"summary\"}\n").unwrap();
    fs::write(dir.join(TRIGGER_FILE), "{}").unwrap();
    let trigger: Trigger = serde_json::from_str(
        r#"{"pid":7,"comm":"node","share":0.2,"threshold":0.05,"window_s":5.0,"waits":30,
            "at":"","wait_ns":1,"alive_ns":5,"from":"","to":"","mode":"contention",
            "sampled":0}"#,
    )
    .unwrap();
    let sh = |script: &str| {
        Command::new("sh")
            .args(["-c", script])
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut render = sh(script);
    let said = relay(&mut render, 7);
    Capture {
        proc: ProcId::new(7, 1),
        labels: Default::default(),
        dir: dir.to_path_buf(),
        crossed: Default::default(),
        trigger: Box::new(trigger),
        during: Default::default(),
        began: std::time::Instant::now(),
        child: sh("exit 0"),
        stage: Stage::Rendering(render, said),
        said: None,
    }
}

fn render(c: &mut Capture) -> Outcome {
    let Stage::Rendering(r, _) = &mut c.stage else {
        unreachable!()
    };
    let status = r.wait().ok();
    c.rendered(status)
}

/// CI once filled the disk only when the verdict was written (the report had fit): that
/// capture is lost for lack of space as at any other step, not kept as captured.
#[test]
fn a_verdict_that_finds_no_space_loses_the_capture_as_no_space() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("c");
    let mut c = rendering(
        &dir,
        "echo 'report.ndjson: No space left on device (os error 28)' >&2; exit 2",
    );
    assert_eq!(
        render(&mut c),
        Outcome::NoSpace("report.ndjson: No space left on device (os error 28)".into())
    );
    assert!(!dir.exists(), "the capture is removed");
    // Any other failure keeps the report (intact: its summary is replaced whole).
    let mut c = rendering(&dir, "echo 'cannot draw the page' >&2; exit 2");
    assert_eq!(render(&mut c), Outcome::Captured);
    assert!(dir.join("report.ndjson").exists());
    // Drawn: the trigger, now in the summary, goes.
    let mut c = rendering(&dir, "exit 0");
    assert_eq!(render(&mut c), Outcome::Captured);
    assert!(dir.join("report.ndjson").exists() && !dir.join(TRIGGER_FILE).exists());
}
