//! Tests that cannot run: the skip recorded for `cargo xtask test` (libtest has no "skipped"
//! outcome), the tools it installs, and the root and kernel the BPF tests need. Under CI a
//! test that cannot run fails.

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
    eprintln!("SKIPPED {test}: {reason}");
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

/// A tool that `cargo xtask test` installs (`what` names it), or None with the calling test
/// recorded as skipped ([`skip_because`]; under CI, where it must be there, a failure).
pub fn installed_or_skip<T>(tool: Option<T>, what: &str) -> Option<T> {
    if tool.is_none() {
        assert!(
            !under_ci(),
            "{what} is not installed (cargo xtask test installs it)"
        );
        skip_because(&format!("{what} is not installed"));
    }
    tool
}

/// Root-only tests call this first. Not being root is a failure, not a skip: CI runs as root
/// and must exercise the real programs. A kernel without the mmap_lock tracepoints is the one
/// reason to skip: then the skip is recorded ([`skip_because`]; a failure under CI) and this
/// returns false.
pub fn require_root_and_tracepoints() -> bool {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "this test loads eBPF programs and needs root: run `sudo -E cargo xtask test`"
    );
    let btf = std::fs::read("/sys/kernel/btf/vmlinux").unwrap_or_default();
    let needle = b"btf_trace_mmap_lock_acquire_returned";
    if !btf.windows(needle.len()).any(|w| w == needle) {
        skip_because("this kernel has no mmap_lock tracepoints in its BTF");
        return false;
    }
    true
}

/// The opening of a root test that writes files: [`require_root_and_tracepoints`], then a
/// fresh directory of its own (removed on drop). None when the test is skipped (recorded, a
/// failure under CI): the test then returns at once.
///
/// ```ignore
/// let Some(dir) = bpf_test() else { return };
/// ```
pub fn bpf_test() -> Option<tempfile::TempDir> {
    require_root_and_tracepoints().then(|| tempfile::tempdir().expect("a temporary directory"))
}
