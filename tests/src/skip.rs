//! Tests that cannot run: the skip recorded for `cargo xtask test` (libtest has no "skipped"
//! outcome), the tools it installs, and the root and kernel the BPF tests need. Under CI a
//! test that cannot run fails.

pub use profiler_common::skip::{SKIP_FILE_ENV, skip_because, under_ci};

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
