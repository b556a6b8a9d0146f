//! The validation of every value the CLI and the agent take, on the command line and in
//! `--config` lines alike: one function per kind of value, each error one line naming what is
//! wrong.

use std::{path::PathBuf, time::Duration};

/// A process id, not a kernel thread's.
pub fn parse_pid(s: &str) -> Result<u32, String> {
    let pid = match s.parse::<u32>() {
        Ok(0) | Err(_) => return Err(format!("{s:?} is not a process id (a positive integer)")),
        Ok(p) => p,
    };
    if is_kernel_thread(pid) {
        return Err(format!(
            "pid {pid} is a kernel thread: kernel threads have no memory map, hence no mmap_lock of their own (their work on others' locks is counted in those processes)"
        ));
    }
    Ok(pid)
}

/// Whether a live pid is a kernel thread (PF_KTHREAD in `/proc/PID/stat`'s flags).
fn is_kernel_thread(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| stat_is_kernel_thread(&s))
}

/// Whether a `/proc/PID/stat` line has PF_KTHREAD in its flags (field 9, counted after the
/// command name's last ')', which may itself hold spaces and parentheses).
fn stat_is_kernel_thread(stat: &str) -> bool {
    const PF_KTHREAD: u64 = 0x0020_0000;
    stat.rfind(')')
        .and_then(|i| {
            stat[i + 1..]
                .split_ascii_whitespace()
                .nth(6)?
                .parse::<u64>()
                .ok()
        })
        .is_some_and(|flags| flags & PF_KTHREAD != 0)
}

/// A kernel thread of this host, found in /proc (which pids they have differs by host and
/// boot: kthreadd is pid 2 only in the initial PID namespace).
#[cfg(test)]
pub fn a_kernel_thread() -> u32 {
    std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|&pid| is_kernel_thread(pid))
        .expect("a kernel thread in /proc (the tests run in the host's PID namespace)")
}

/// The most threads `--max-threads` may ask for (the map then takes a few hundred MiB).
pub const MAX_MAX_THREADS: u32 = 4_194_304;

pub fn parse_max_threads(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(n) if (1..=MAX_MAX_THREADS).contains(&n) => Ok(n),
        _ => Err(format!(
            "{s:?} is not a number of threads from 1 to {MAX_MAX_THREADS}"
        )),
    }
}

fn parse_secs(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        // A non-zero number too small for a double (1e-400) parses as 0: it is not 0.
        Ok(v) if v == 0.0 && has_nonzero_digit(s) => Err(format!(
            "{s:?} is too small to be a number of seconds (it would be taken as 0)"
        )),
        Ok(v) if (0.0..1e9).contains(&v) => Ok(v),
        _ => Err(format!("{s:?} is not a number of seconds")),
    }
}

/// Whether the digits of a number's mantissa are not all 0.
fn has_nonzero_digit(s: &str) -> bool {
    let mantissa = s.split(['e', 'E']).next().unwrap_or(s);
    mantissa.bytes().any(|b| (b'1'..=b'9').contains(&b))
}

/// The shortest `--duration` or non-zero `--interval`: anything shorter is a typo, and an
/// interval of nanoseconds would only spin.
pub const MIN_SECS: f64 = 0.001;

pub(super) fn parse_positive_secs(s: &str) -> Result<Duration, String> {
    match parse_secs(s)? {
        v if v >= MIN_SECS => Ok(Duration::from_secs_f64(v)),
        _ => Err(format!("{s:?} must be at least {MIN_SECS} seconds")),
    }
}

pub(super) fn parse_interval(s: &str) -> Result<f64, String> {
    match parse_secs(s)? {
        v if v == 0.0 || v >= MIN_SECS => Ok(v),
        _ => Err(format!(
            "{s:?} must be 0 (summary only) or at least {MIN_SECS} seconds"
        )),
    }
}

/// A command name: matching nothing, an empty one would profile nothing until killed, and so
/// would one longer than the kernel keeps (it cuts names to 15 bytes).
pub fn parse_comm(s: &str) -> Result<String, String> {
    if s.is_empty() {
        return Err("a command name cannot be empty".into());
    }
    let max = profiler_common::COMM_LEN - 1;
    if s.len() > max {
        return Err(format!(
            "{s:?} is {} bytes, longer than the {max} the kernel keeps of a command name: it would match nothing (write its first {max} bytes, as /proc/PID/comm shows it)",
            s.len()
        ));
    }
    Ok(s.to_string())
}

pub fn parse_glob(s: &str) -> Result<String, String> {
    if s.is_empty() {
        return Err("must not be empty".into());
    }
    glob::Pattern::new(s)
        .map(|_| s.to_string())
        .map_err(|e| format!("not a glob: {e}"))
}

pub fn parse_cgroup(s: &str) -> Result<String, String> {
    if !s.starts_with('/') {
        return Err(format!(
            "{s:?}: a cgroup v2 path is absolute, as /proc/PID/cgroup shows it (e.g. /system.slice/api.service)"
        ));
    }
    Ok(s.trim_end_matches('/').to_string())
}

/// A share of time in percent: above 0, at most 100.
pub(super) fn parse_percent(s: &str) -> Result<f64, String> {
    match s.trim_end_matches('%').parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 100.0 => Ok(v),
        _ => Err(format!("{s:?} is not a percentage above 0 and at most 100")),
    }
}

/// Where the agent pushes to (`--pyroscope`, `--otlp`): an `http://` or `https://` URL with
/// a host, its paths below it (a trailing `/` dropped); no query or fragment, which the
/// paths appended to it would break.
pub fn parse_push_url(s: &str) -> Result<String, String> {
    let bad = |why: &str| format!("{s:?} is not a push URL ({why}; e.g. https://host:4318)");
    let uri: ureq::http::Uri = s.parse().map_err(|_| bad("not a URL"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => return Err(bad("http:// or https:// only")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(bad("no host"));
    }
    if uri.query().is_some() || s.contains('#') {
        return Err(bad("no query or fragment"));
    }
    Ok(s.trim_end_matches('/').to_string())
}

/// A header sent with every push (`--push-header 'Authorization: Bearer TOKEN'`): a valid
/// HTTP name and value.
pub fn parse_push_header(s: &str) -> Result<(String, String), String> {
    let Some((name, value)) = s.split_once(':') else {
        return Err(format!("{:?} is not `NAME: VALUE`", redact(s)));
    };
    let (name, value) = (name.trim(), value.trim());
    if ureq::http::HeaderName::from_bytes(name.as_bytes()).is_err() {
        return Err(format!("{name:?} is not an HTTP header name"));
    }
    if value.is_empty() || ureq::http::HeaderValue::from_str(value).is_err() {
        return Err(format!(
            "the value of header {name} is empty or not a valid header value"
        ));
    }
    Ok((name.to_string(), value.to_string()))
}

/// What an error may show of a header: its name, never its value (a token).
fn redact(s: &str) -> String {
    s.chars()
        .take_while(|c| *c != ' ')
        .take(32)
        .collect::<String>()
        + " ..."
}

/// `--push-interval`: whole or fractional seconds from 1 to 600 (the agent keeps 600 s of
/// sampled stacks: a push covers what ended since the last).
pub fn parse_push_interval(s: &str) -> Result<Duration, String> {
    match parse_secs(s)? {
        v if (1.0..=600.0).contains(&v) => Ok(Duration::from_secs_f64(v)),
        _ => Err(format!(
            "{s:?} is not a push interval from 1 to 600 seconds"
        )),
    }
}

/// `--fail-above`: a percentage from 0 (any wait fails) to 100.
pub(super) fn parse_fail_above(s: &str) -> Result<f64, String> {
    match s.trim_end_matches('%').parse::<f64>() {
        Ok(v) if (0.0..=100.0).contains(&v) => Ok(v),
        _ => Err(format!("{s:?} is not a percentage from 0 to 100")),
    }
}

pub(super) fn parse_path(s: &str) -> Result<PathBuf, String> {
    if s.is_empty() {
        return Err("a path cannot be empty".into());
    }
    Ok(PathBuf::from(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Recorded lines (Linux 6.18): kthreadd, a user process, and a user process whose
    /// name holds ") " and digits that would be taken for fields by a naive split.
    #[test]
    fn push_values_are_checked() {
        assert_eq!(
            parse_push_url("https://pyro.example:4040/").unwrap(),
            "https://pyro.example:4040"
        );
        assert_eq!(
            parse_push_url("http://127.0.0.1:4318/otlp").unwrap(),
            "http://127.0.0.1:4318/otlp"
        );
        for bad in ["ftp://h", "localhost:4318", "http://", "http://h/?a=b", ""] {
            assert!(parse_push_url(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_push_header("Authorization: Bearer abc").unwrap(),
            ("Authorization".into(), "Bearer abc".into())
        );
        assert_eq!(
            parse_push_header("X-Scope-OrgID:tenant-1").unwrap(),
            ("X-Scope-OrgID".into(), "tenant-1".into())
        );
        for bad in [
            "Authorization Bearer abc",
            "Bad Name: x",
            "X-A:",
            "X-A: a\nb",
        ] {
            let bad = bad.replace("\\n", "\n");
            let e = parse_push_header(&bad).unwrap_err();
            assert!(!e.contains("abc"), "a value is never shown: {e}");
        }
        assert_eq!(parse_push_interval("15").unwrap(), Duration::from_secs(15));
        for bad in ["0.5", "601", "x"] {
            assert!(parse_push_interval(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn kernel_threads_are_told_by_their_stat_flags() {
        let kthreadd = "2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0 25 0 0 \
                        18446744073709551615 0 0 0 0 0 0 0 2147483647 0 1 0 0 0 1 0";
        let cat = "22781 (cat) R 22778 22778 13644 0 -1 4194304 102 0 0 0 0 0 0 0 20 0 1 0 \
                   52493 3133440 394 18446744073709551615 94818228088832";
        let tricky = "4242 (a) S 1 2 3 4 -1 2129984 (x) S 1 1 1 0 -1 4194560 1 0 0 0";
        assert!(stat_is_kernel_thread(kthreadd));
        assert!(!stat_is_kernel_thread(cat));
        assert!(!stat_is_kernel_thread(tricky));
        for junk in ["", "7 (x)", "7 (x) S 1 1 1 0 -1 notanumber"] {
            assert!(!stat_is_kernel_thread(junk), "{junk:?}");
        }
    }

    #[test]
    fn a_live_kernel_thread_is_refused_and_this_process_accepted() {
        let k = a_kernel_thread();
        let e = parse_pid(&k.to_string()).unwrap_err();
        assert!(e.contains(&format!("pid {k} is a kernel thread")), "{e}");
        let me = std::process::id();
        assert_eq!(parse_pid(&me.to_string()), Ok(me));
    }
}
