//! What the run may read of other users' processes: one line at start when it lacks
//! CAP_SYS_PTRACE, rather than roles and code quietly missing.

/// Says so on standard error, once attached (an error before that is one line alone), when the
/// run lacks CAP_SYS_PTRACE.
pub fn warn_if_lacking_ptrace() {
    if lacks_ptrace() {
        eprintln!(
            "mmaplock-prof: without CAP_SYS_PTRACE, other users' processes are counted but their thread roles, code and executables cannot be read (docs/privileges.md)"
        );
    }
}

/// Effective capabilities lack CAP_SYS_PTRACE (bit 19) and we are not root: other users'
/// processes' memory, maps and executables are then out of reach, and roles, code attribution
/// and `--exe` selection quietly degrade. Worth one line at start.
fn lacks_ptrace() -> bool {
    const CAP_SYS_PTRACE: u32 = 19;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return false;
    }
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let hex = s
                .lines()
                .find_map(|l| l.strip_prefix("CapEff:"))?
                .trim()
                .to_string();
            u64::from_str_radix(&hex, 16).ok()
        })
        .is_some_and(|caps| caps & (1 << CAP_SYS_PTRACE) == 0)
}
