//! Names for JIT code: V8's perf map (`/tmp/perf-PID.map`, written by node's
//! `--perf-basic-prof` or `--perf-basic-prof-only-functions`), one `START SIZE NAME` line (hex
//! start and size) per code object, appended as code is compiled. Read through the process's
//! root (`/proc/PID/root/tmp/perf-NSPID.map`, the pid as the process's own pid namespace
//! sees it) so that containers work, else from this host's `/tmp`.

use std::{
    fs,
    path::{Path, PathBuf},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use crate::registry::ids;

/// A JavaScript function as V8 names its code: `JS:*hotAllocator /srv/app.js:12:3`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JsFunction {
    pub name: String,
    /// `file:line:column`, as V8 writes it (empty for code with no script).
    pub location: String,
}

/// What a perf map says about an address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JitName {
    /// JavaScript code (any tier: interpreted `~`, Sparkplug `^`, Maglev `+`, TurboFan `*`).
    Js(JsFunction),
    /// Other generated code: a builtin, a bytecode handler, a regular expression, a stub.
    Other(String),
}

impl JitName {
    /// V8's name for a code object, split into its kind and function.
    pub fn parse(raw: &str) -> JitName {
        let raw = raw.trim();
        // V8 10 and older tag functions by how they were compiled, and write no column.
        let tags = ["JS:", "LazyCompile:", "Function:", "Script:", "Eval:"];
        let Some(rest) = tags.iter().find_map(|t| raw.strip_prefix(t)) else {
            return JitName::Other(raw.to_string());
        };
        // The tier marker, if any.
        let rest = rest.trim_start_matches(['~', '^', '*', '+']);
        let (name, location) = match rest.rsplit_once(' ') {
            Some((n, l)) => (n.trim(), l.trim()),
            None => (rest.trim(), ""),
        };
        let name = if name.is_empty() { "(anonymous)" } else { name };
        JitName::Js(JsFunction {
            name: name.to_string(),
            location: location.to_string(),
        })
    }
}

/// A process's perf map, sorted by start address.
#[derive(Debug, Default)]
pub struct PerfMap {
    path: PathBuf,
    /// (start, end, raw name), sorted by start; a later line for the same start wins (code
    /// moved or recompiled at an address freed before).
    entries: Vec<(u64, u64, String)>,
    /// Bytes of the file read so far (it only grows while the process runs).
    read_len: u64,
}

/// The pid of `pid` in its own (innermost) pid namespace, from `/proc/PID/status`.
fn ns_pid(pid: u32) -> Option<u32> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("NSpid:"))?;
    line.split_whitespace().last()?.parse().ok()
}

/// When `pid` started, as wall-clock time (boot time plus its start in clock ticks).
fn started_at(pid: u32) -> Option<SystemTime> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let ticks = ids::stat_start_ticks(&stat)?;
    let btime: u64 = fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())?;
    let since_boot = Duration::from_secs_f64(ticks as f64 / ids::clock_ticks() as f64);
    Some(UNIX_EPOCH + Duration::from_secs(btime) + since_boot)
}

/// Where the perf map of `pid` is: through its root while it lives, else this host's /tmp.
/// A file last written before the process started is an earlier process's with the same pid
/// (node leaves its map behind), and is not used.
pub fn path_of(pid: u32) -> Option<PathBuf> {
    let inner = ns_pid(pid).unwrap_or(pid);
    let through_root = PathBuf::from(format!("/proc/{pid}/root/tmp/perf-{inner}.map"));
    let host = PathBuf::from(format!("/tmp/perf-{pid}.map"));
    // A process in our own root writes the host's file: name that one, which stays readable
    // after the process exits (its /proc/PID/root does not).
    let same_root = fs::read_link(format!("/proc/{pid}/root")).is_ok_and(|r| r == Path::new("/"))
        && inner == pid;
    let candidates = if same_root {
        vec![host]
    } else {
        vec![through_root, host]
    };
    let path = candidates.into_iter().find(|p| p.exists())?;
    // A second of slack: the start time has clock-tick resolution.
    if let (Some(start), Ok(modified)) = (
        started_at(pid),
        fs::metadata(&path).and_then(|m| m.modified()),
    ) && modified + Duration::from_secs(1) < start
    {
        log::debug!("{} predates process {pid}: not its own", path.display());
        return None;
    }
    Some(path)
}

impl PerfMap {
    /// The perf map of `pid`, if it writes one.
    pub fn open(pid: u32) -> Option<PerfMap> {
        let mut m = PerfMap {
            path: path_of(pid)?,
            ..PerfMap::default()
        };
        m.refresh();
        Some(m)
    }

    #[cfg(test)]
    pub fn from_text(text: &str) -> PerfMap {
        let mut m = PerfMap::default();
        m.add_lines(text);
        m
    }

    /// Reads what was appended since the last reading.
    pub fn refresh(&mut self) {
        let Ok(meta) = fs::metadata(&self.path) else {
            return;
        };
        if meta.len() <= self.read_len {
            return;
        }
        let Ok(bytes) = fs::read(&self.path) else {
            return;
        };
        // Only whole lines: the writer may be in the middle of one.
        let end = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        let start = (self.read_len as usize).min(end);
        let text = String::from_utf8_lossy(&bytes[start..end]).into_owned();
        self.read_len = end as u64;
        self.add_lines(&text);
    }

    fn add_lines(&mut self, text: &str) {
        for line in text.lines() {
            let mut parts = line.splitn(3, ' ');
            let (Some(start), Some(size), Some(name)) = (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let (Ok(start), Ok(size)) = (
                u64::from_str_radix(start.trim_start_matches("0x"), 16),
                u64::from_str_radix(size.trim_start_matches("0x"), 16),
            ) else {
                continue;
            };
            self.entries
                .push((start, start.saturating_add(size), name.to_string()));
        }
        // Stable: for equal starts the later line stays last, and wins in `lookup`.
        self.entries.sort_by_key(|e| e.0);
    }

    /// V8's name of the code at `addr`.
    pub fn lookup(&self, addr: u64) -> Option<JitName> {
        let i = self.entries.partition_point(|e| e.0 <= addr);
        // The last entry starting at or below `addr` that still covers it.
        self.entries[..i]
            .iter()
            .rev()
            .take(4)
            .find(|e| addr < e.1)
            .map(|e| JitName::parse(&e.2))
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines as node 20 writes them with `--perf-basic-prof`.
    const MAP: &str = "\
55d0c8a00000 40 Builtin:ArgumentsAdaptorTrampoline
7fbb0400ad80 198 JS:^hotAllocator /tmp/jsw.js:2:22
7fbb0400b100 28c JS:*hotAllocator /tmp/jsw.js:2:22
7fbb0400c000 80 JS:~ /tmp/jsw.js:4:7
7fbb0400d000 100 RegExp:[a-z]+
";

    #[test]
    fn v8_names_become_functions_and_files() {
        let m = PerfMap::from_text(MAP);
        assert_eq!(m.len(), 5);
        let js = |name: &str, location: &str| {
            Some(JitName::Js(JsFunction {
                name: name.into(),
                location: location.into(),
            }))
        };
        assert_eq!(
            m.lookup(0x7fbb0400b100),
            js("hotAllocator", "/tmp/jsw.js:2:22")
        );
        assert_eq!(
            m.lookup(0x7fbb0400b100 + 0x28b),
            js("hotAllocator", "/tmp/jsw.js:2:22")
        );
        assert_eq!(m.lookup(0x7fbb0400b100 + 0x28c), None, "past the end");
        assert_eq!(
            m.lookup(0x7fbb0400ad90),
            js("hotAllocator", "/tmp/jsw.js:2:22")
        );
        assert_eq!(
            m.lookup(0x7fbb0400c010),
            js("(anonymous)", "/tmp/jsw.js:4:7")
        );
        assert_eq!(
            m.lookup(0x7fbb0400d010),
            Some(JitName::Other("RegExp:[a-z]+".into()))
        );
        assert_eq!(m.lookup(0x1000), None);
    }

    #[test]
    fn appended_lines_are_read_and_a_partial_line_waits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("perf-1.map");
        fs::write(
            &path,
            "7f0000001000 10 JS:*a /x.js:1:1\n7f0000002000 10 JS:*b",
        )
        .unwrap();
        let mut m = PerfMap {
            path: path.clone(),
            ..PerfMap::default()
        };
        m.refresh();
        assert_eq!(m.len(), 1, "the unfinished line is not read");
        fs::write(
            &path,
            "7f0000001000 10 JS:*a /x.js:1:1\n7f0000002000 10 JS:*b /x.js:2:1\n",
        )
        .unwrap();
        m.refresh();
        assert_eq!(m.len(), 2);
        assert!(matches!(m.lookup(0x7f0000002005), Some(JitName::Js(f)) if f.name == "b"));
    }
}
