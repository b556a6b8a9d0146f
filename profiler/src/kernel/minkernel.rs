//! The oldest kernel the eBPF programs load on: Linux 5.15 (`bpf_task_pt_regs`, for write
//! causes, came in 5.15; task local storage for tracing programs in 5.11). Checked at start-up
//! from `uname -r`, before anything is loaded, so that an older kernel gets one clear line
//! instead of a verifier error.

/// The minimum kernel, (major, minor).
pub const MIN_KERNEL: (u32, u32) = (5, 15);

/// The minimum kernel for `--blockers`: charging a wait walks the holder slots with
/// `bpf_loop`, which came in 5.17.
pub const MIN_KERNEL_BLOCKERS: (u32, u32) = (5, 17);

/// Does this kernel release have `bpf_loop` (unknown releases are given the benefit)?
pub fn has_bpf_loop(release: &str) -> bool {
    parse_release(release).is_none_or(|(major, minor, _)| (major, minor) >= MIN_KERNEL_BLOCKERS)
}

/// The release is older than [`MIN_KERNEL`].
#[derive(Debug, thiserror::Error)]
#[error(
    "this kernel (Linux {release}) is too old: mmaplock-prof needs Linux {}.{} or newer",
    MIN_KERNEL.0,
    MIN_KERNEL.1
)]
pub struct TooOld {
    pub release: String,
}

/// (major, minor, patch) of a kernel release string such as `6.18.44-fc-v595` or
/// `5.4.0-150-generic`; the patch level may be absent (`6.1-rc3`: 0). None if it does not
/// start with `MAJOR.MINOR`.
pub fn parse_release(release: &str) -> Option<(u32, u32, u32)> {
    // Each part is the leading digits of its dot-separated field: "44-fc-v595" -> 44.
    fn number(s: &str) -> Option<u32> {
        let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        s[..end].parse().ok()
    }
    let mut parts = release.trim().splitn(3, '.');
    let major = parts.next().and_then(number)?;
    let minor_field = parts.next()?;
    let minor = number(minor_field)?;
    // "6.1-rc3": the minor field ends the version.
    let patch = if minor_field.bytes().all(|b| b.is_ascii_digit()) {
        parts.next().and_then(number).unwrap_or(0)
    } else {
        0
    };
    Some((major, minor, patch))
}

/// Ok for [`MIN_KERNEL`] or newer, and for a release string that cannot be read (better to
/// try than to refuse a kernel we do not understand).
pub fn check(release: &str) -> Result<(), TooOld> {
    match parse_release(release) {
        Some((major, minor, _)) if (major, minor) < MIN_KERNEL => Err(TooOld {
            release: release.trim().to_string(),
        }),
        _ => Ok(()),
    }
}

/// This machine's kernel release (`uname -r`), if it can be read.
pub fn running_release() -> Option<String> {
    // SAFETY: uname fills the zeroed struct; its fields are NUL-terminated strings.
    unsafe {
        let mut u: libc::utsname = std::mem::zeroed();
        if libc::uname(&mut u) != 0 {
            return None;
        }
        let s = std::ffi::CStr::from_ptr(u.release.as_ptr());
        Some(s.to_string_lossy().into_owned())
    }
}

/// [`check`] on the running kernel.
pub fn check_running() -> Result<(), TooOld> {
    running_release().map_or(Ok(()), |r| check(&r))
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blockers_need_bpf_loop() {
        assert!(!has_bpf_loop("5.15.0-91-generic"));
        assert!(!has_bpf_loop("5.16.20"));
        assert!(has_bpf_loop("5.17.0"));
        assert!(has_bpf_loop("6.18.44-fc-v595"));
        assert!(has_bpf_loop("weird"));
    }

    #[test]
    fn releases_parse() {
        assert_eq!(parse_release("6.18.44-fc-v595"), Some((6, 18, 44)));
        assert_eq!(parse_release("5.4.0-150-generic"), Some((5, 4, 0)));
        assert_eq!(parse_release("5.15.0"), Some((5, 15, 0)));
        assert_eq!(parse_release("5.15"), Some((5, 15, 0)));
        assert_eq!(parse_release("6.1-rc3"), Some((6, 1, 0)));
        assert_eq!(parse_release("4.19.0+\n"), Some((4, 19, 0)));
        assert_eq!(parse_release("5.10.0-28-amd64"), Some((5, 10, 0)));
        for junk in ["", "linux", "6", "6.", ".18.1", "x.y.z", "v6.18", "-5.15"] {
            assert_eq!(parse_release(junk), None, "{junk:?}");
        }
    }

    #[test]
    fn the_minimum_is_5_15() {
        assert!(check("6.18.44-fc-v595").is_ok());
        assert!(check("5.15.0").is_ok());
        assert!(check("5.15.0-91-generic").is_ok());
        assert!(check("10.0").is_ok());
        assert!(check("5.14.21-150400.24-default").is_err());
        assert!(check("4.19.0").is_err());
        let e = check("5.4.0-150-generic").unwrap_err().to_string();
        assert_eq!(
            e,
            "this kernel (Linux 5.4.0-150-generic) is too old: mmaplock-prof needs Linux 5.15 \
             or newer"
        );
        // Unreadable: try anyway.
        assert!(check("junk").is_ok());
    }

    #[test]
    fn this_machine_has_a_release() {
        let r = running_release().expect("uname");
        assert!(parse_release(&r).is_some(), "{r}");
    }
}
