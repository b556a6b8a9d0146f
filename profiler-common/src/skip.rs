//! Tests that cannot run, recorded for `cargo xtask test`: libtest has no "skipped" outcome,
//! so a test that returns early would count as passed. The unit tests (`profiler`) and the
//! integration tests (`tests`) record theirs here, and xtask counts them (`suite.rs`).

extern crate std;

use std::{format, string::ToString};

/// The environment variable through which `cargo xtask test` names the file where skipped
/// tests are recorded (one line each: `test name<TAB>reason`). libtest has no "skipped"
/// outcome for a test that returns early: xtask reads this file, counts those tests as skipped
/// instead of passed, and, under CI, fails the run.
pub const SKIP_FILE_ENV: &str = "MMAPLOCK_PROF_TEST_SKIP_FILE";

/// Whether this run is CI (`CI` set, as CI services and `.ci/run` do): there, a test that
/// cannot run is a failure.
pub fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && v != "false")
}

/// Records that the calling test is skipped, and why; the test then returns at once:
///
/// ```ignore
/// if skip_because("no node") { return; }
/// ```
///
/// Under CI it panics instead, so that the test that could not run is named as failed.
/// Always returns true.
pub fn skip_because(reason: &str) -> bool {
    // libtest runs each test on a thread named after it; the binary says which test file.
    let name = std::thread::current()
        .name()
        .unwrap_or("<unnamed test>")
        .to_string();
    let file = std::env::current_exe()
        .ok()
        .and_then(|e| Some(e.file_stem()?.to_str()?.to_string()))
        .map(|stem| {
            stem.rsplit_once('-')
                .map_or(stem.clone(), |(f, _)| f.to_string())
        });
    let test = match file {
        Some(f) => format!("{f}::{name}"),
        None => name,
    };
    assert!(
        !under_ci(),
        "{test} cannot run ({reason}), and under CI (CI is set) a test that cannot run fails"
    );
    std::eprintln!("SKIPPED {test}: {reason}");
    if let Some(path) = std::env::var_os(SKIP_FILE_ENV) {
        use std::io::Write as _;
        let line = format!("{test}\t{}\n", reason.replace(['\n', '\t'], " "));
        // One short O_APPEND write per skip: whole lines even from concurrent test binaries.
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(line.as_bytes()))
            .unwrap_or_else(|e| panic!("cannot record the skip in {path:?}: {e}"));
    }
    true
}
