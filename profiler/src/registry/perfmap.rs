//! Names for JIT code: V8's perf map (`/tmp/perf-PID.map`, written by node's
//! `--perf-basic-prof` or `--perf-basic-prof-only-functions`), one `START SIZE NAME` line (hex
//! start and size) per code object, appended as code is compiled. Read through the process's
//! root (`/proc/PID/root/tmp/perf-NSPID.map`, the pid as the process's own pid namespace
//! sees it) so that containers work, else from this host's `/tmp`.
//!
//! The file is an adversary's: /tmp is world-writable, so anyone may put a file, a link or a
//! FIFO at that name before node does (or for a node that writes no map at all), and a large
//! one once made a run read gigabytes. So it is opened through [`untrusted`] (no link on its
//! path, a regular file owned by the process's user or root, bounded in size), read from
//! where the last reading stopped, a bounded chunk at a time, lines bounded in length; what
//! does not pass is ignored with one warning naming the file.

use std::{
    fs,
    path::{Path, PathBuf},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use crate::registry::untrusted;
use crate::vocab::ids;

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

/// The most of a perf map that is read: V8 writes a line per compiled code object (about 100
/// bytes), so 64 MiB is over half a million, far more than a server's hot code. A file larger
/// than this when first seen is refused whole; one that grows past it is read up to it.
pub const MAX_PERF_MAP_BYTES: u64 = 64 << 20;
/// The longest line taken: a name and a script path (at most PATH_MAX); longer lines are
/// skipped whole.
pub const MAX_PERF_MAP_LINE: usize = 8 << 10;
/// The most read at one refresh, so that a refresh (done from the run's loop) never holds up
/// signals, interval reports or the kernel's maps for long: a few milliseconds of parsing.
pub const PERF_MAP_CHUNK: usize = 2 << 20;

/// A process's perf map, sorted by start address, read as it grows.
#[derive(Debug, Default)]
pub struct PerfMap {
    path: PathBuf,
    /// The uid that may own the file besides root: the process's effective uid.
    owner: u32,
    /// (start, end, raw name), sorted by start; a later line for the same start wins (code
    /// moved or recompiled at an address freed before).
    entries: Vec<(u64, u64, String)>,
    /// Bytes of the file consumed so far (whole lines, and the partial line kept below).
    read_len: u64,
    /// The file those bytes came from ((dev, inode)); another one starts over.
    identity: Option<(u64, u64)>,
    /// The start of a line whose newline has not been written yet.
    partial: Vec<u8>,
    /// Inside a line longer than [`MAX_PERF_MAP_LINE`]: skipped up to its newline.
    skipping: bool,
    /// Nothing more is read (refused, or read up to the bound).
    done: bool,
    /// The file last read, kept open: once the process is gone, its path may name nothing
    /// (a container's /tmp goes with it), but what it wrote before its exit is still there.
    held: Option<fs::File>,
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

/// A file held open, as [`untrusted::open`] would describe it now (its size has grown).
fn reopened(file: fs::File) -> Option<untrusted::Opened> {
    use std::os::unix::fs::MetadataExt as _;
    let meta = file.metadata().ok()?;
    Some(untrusted::Opened {
        size: meta.len(),
        inode: meta.ino(),
        dev: meta.dev(),
        mtime: meta.mtime(),
        file,
    })
}

/// Where the perf map of `pid` may be: through its root while it lives, else this host's
/// /tmp. A process in our own root writes the host's file: that one is named, as it stays
/// readable after the process exits (its /proc/PID/root does not).
fn candidates(pid: u32) -> Vec<PathBuf> {
    let inner = ns_pid(pid).unwrap_or(pid);
    let through_root = PathBuf::from(format!("/proc/{pid}/root/tmp/perf-{inner}.map"));
    let host = PathBuf::from(format!("/tmp/perf-{pid}.map"));
    let same_root = fs::read_link(format!("/proc/{pid}/root")).is_ok_and(|r| r == Path::new("/"))
        && inner == pid;
    if same_root {
        vec![host]
    } else {
        vec![through_root, host]
    }
}

impl PerfMap {
    /// The perf map of `pid`, if it writes one that may be read: a regular file (no link
    /// anywhere on its path), owned by the process's user or root, no larger than
    /// [`MAX_PERF_MAP_BYTES`], written since the process started. Anything else is ignored
    /// with one warning naming the file and why (once per file).
    pub fn open(pid: u32) -> Option<PerfMap> {
        let owner = untrusted::euid_of(pid)?;
        for path in candidates(pid) {
            let policy = untrusted::Policy {
                owner: Some(owner),
                max_size: MAX_PERF_MAP_BYTES,
                inode: None,
            };
            let opened = match untrusted::open(&path, &policy) {
                Ok(o) => o,
                Err(e) if e.is_not_found() => continue,
                Err(e) => {
                    if e.is_suspicious() {
                        untrusted::warn_once(&path, &format_args!("not read as a perf map: {e}"));
                    } else {
                        log::debug!("{}: {e}", path.display());
                    }
                    return None;
                }
            };
            // A file last written before the process started is an earlier process's with the
            // same pid (node leaves its map behind). A second of slack: start times have
            // clock-tick resolution.
            if let Some(start) = started_at(pid)
                && let Ok(mtime) = u64::try_from(opened.mtime)
                && UNIX_EPOCH + Duration::from_secs(mtime + 1) < start
            {
                log::debug!("{} predates process {pid}: not its own", path.display());
                return None;
            }
            let mut m = PerfMap {
                path,
                owner,
                ..PerfMap::default()
            };
            m.read_from(opened);
            return Some(m);
        }
        None
    }

    #[cfg(test)]
    pub fn from_text(text: &str) -> PerfMap {
        let mut m = PerfMap::default();
        m.consume(text.as_bytes());
        m.sort();
        m
    }

    /// Reads what was appended since the last reading (at most [`PERF_MAP_CHUNK`]).
    pub fn refresh(&mut self) {
        if self.done {
            return;
        }
        let policy = untrusted::Policy {
            owner: Some(self.owner),
            // A file that grew past the bound since is read up to it, below.
            max_size: u64::MAX,
            inode: None,
        };
        match untrusted::open(&self.path, &policy) {
            Ok(o) => self.read_from(o),
            Err(e) if e.is_suspicious() => {
                untrusted::warn_once(&self.path, &format_args!("not read as a perf map: {e}"));
                self.done = true;
            }
            Err(e) => {
                log::debug!("{}: {e}", self.path.display());
                if let Some(o) = self.held.take().and_then(reopened) {
                    self.read_from(o);
                }
            }
        }
    }

    fn read_from(&mut self, o: untrusted::Opened) {
        if self.identity.is_some_and(|id| id != (o.dev, o.inode)) {
            // Written anew (another file under the same name): read it from its start.
            self.read_len = 0;
            self.partial.clear();
            self.skipping = false;
        }
        self.identity = Some((o.dev, o.inode));
        if o.size <= self.read_len {
            return;
        }
        let until = o.size.min(MAX_PERF_MAP_BYTES);
        let want = (until.saturating_sub(self.read_len)).min(PERF_MAP_CHUNK as u64) as usize;
        if want > 0 {
            match untrusted::read_at(&o.file, self.read_len, want) {
                Ok(bytes) => {
                    self.read_len += bytes.len() as u64;
                    self.consume(&bytes);
                    self.sort();
                }
                Err(e) => log::debug!("{}: {e}", self.path.display()),
            }
        }
        if self.read_len >= MAX_PERF_MAP_BYTES && o.size > MAX_PERF_MAP_BYTES {
            untrusted::warn_once(
                &self.path,
                &format_args!(
                    "it grew past {MAX_PERF_MAP_BYTES} bytes, the most read from a perf map: \
                     JIT code named later is not named"
                ),
            );
            self.done = true;
        }
        self.held = Some(o.file);
    }

    /// Takes whole lines from `bytes`; a partial last line waits for its newline.
    fn consume(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let (line, rest, complete) = match bytes.iter().position(|&b| b == b'\n') {
                Some(i) => (&bytes[..i], &bytes[i + 1..], true),
                None => (bytes, &[][..], false),
            };
            bytes = rest;
            if self.skipping {
                self.skipping = !complete;
                continue;
            }
            if self.partial.len() + line.len() > MAX_PERF_MAP_LINE {
                untrusted::warn_once(
                    &self.path,
                    &format_args!(
                        "a line longer than {MAX_PERF_MAP_LINE} bytes is not a perf map's: \
                         such lines are skipped"
                    ),
                );
                self.partial.clear();
                self.skipping = !complete;
                continue;
            }
            self.partial.extend_from_slice(line);
            if complete {
                let line = std::mem::take(&mut self.partial);
                self.add_line(&String::from_utf8_lossy(&line));
            }
        }
    }

    fn add_line(&mut self, line: &str) {
        let mut parts = line.splitn(3, ' ');
        let (Some(start), Some(size), Some(name)) = (parts.next(), parts.next(), parts.next())
        else {
            return;
        };
        let (Ok(start), Ok(size)) = (
            u64::from_str_radix(start.trim_start_matches("0x"), 16),
            u64::from_str_radix(size.trim_start_matches("0x"), 16),
        ) else {
            return;
        };
        self.entries
            .push((start, start.saturating_add(size), name.to_string()));
    }

    /// Stable, and cheap on a sorted prefix: for equal starts the later line stays last, and
    /// wins in `lookup`.
    fn sort(&mut self) {
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

    /// A map of `path` as `PerfMap::open` makes it, for a file of ours.
    fn map_of(path: &Path) -> PerfMap {
        PerfMap {
            path: path.to_path_buf(),
            owner: rustix::process::geteuid().as_raw(),
            ..PerfMap::default()
        }
    }

    #[test]
    fn appended_lines_are_read_once_and_a_partial_line_waits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("perf-1.map");
        fs::write(
            &path,
            "7f0000001000 10 JS:*a /x.js:1:1\n7f0000002000 10 JS:*b",
        )
        .unwrap();
        let mut m = map_of(&path);
        m.refresh();
        assert_eq!(m.len(), 1, "the unfinished line is not read");
        m.refresh();
        assert_eq!(m.len(), 1, "nothing new");
        let mut f = fs::OpenOptions::new().append(true).open(&path).unwrap();
        std::io::Write::write_all(&mut f, b" /x.js:2:1\n7f0000003000 10 JS:*c /x.js:3:1\n")
            .unwrap();
        m.refresh();
        assert_eq!(m.len(), 3);
        assert!(matches!(m.lookup(0x7f0000002005), Some(JitName::Js(f)) if f.name == "b"));
        assert!(
            matches!(m.lookup(0x7f0000003005), Some(JitName::Js(f)) if f.location == "/x.js:3:1")
        );
        // Each byte was read once.
        assert_eq!(m.read_len, fs::metadata(&path).unwrap().len());
    }

    /// A container's perf map goes with the container: what was appended before it went is
    /// read from the file held open.
    #[test]
    fn lines_appended_before_the_file_went_away_are_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("perf-3.map");
        fs::write(&path, "7f0000001000 10 JS:*a /x.js:1:1\n").unwrap();
        let mut m = map_of(&path);
        m.refresh();
        assert_eq!(m.len(), 1);
        let mut f = fs::OpenOptions::new().append(true).open(&path).unwrap();
        std::io::Write::write_all(&mut f, b"7f0000002000 10 JS:*b /x.js:2:1\n").unwrap();
        drop(f);
        fs::remove_file(&path).unwrap();
        m.refresh();
        assert_eq!(m.len(), 2, "read from the file held open");
        assert!(matches!(m.lookup(0x7f0000002005), Some(JitName::Js(f)) if f.name == "b"));
        m.refresh();
        assert_eq!(m.len(), 2);
    }

    #[test]
    fn long_lines_are_skipped_and_each_refresh_reads_a_bounded_chunk() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("perf-2.map");
        let mut text = String::from("7f0000001000 10 JS:*first /x.js:1:1\n");
        text.push_str(&format!(
            "7f0000005000 10 JS:*{}\n",
            "x".repeat(MAX_PERF_MAP_LINE)
        ));
        // Enough lines for three chunks.
        let line = "7f0000009000 10 JS:*filler /y.js:1:1\n";
        let n = 2 * PERF_MAP_CHUNK / line.len() + 10;
        text.push_str(&line.repeat(n));
        text.push_str("7f000000a000 10 JS:*last /x.js:9:9\n");
        fs::write(&path, &text).unwrap();
        let mut m = map_of(&path);
        m.refresh();
        assert_eq!(m.read_len, PERF_MAP_CHUNK as u64, "one chunk per refresh");
        assert!(untrusted::warned(&path), "the long line is said once");
        m.refresh();
        m.refresh();
        assert_eq!(m.read_len, text.len() as u64);
        assert_eq!(m.len(), n + 2, "every line but the long one");
        assert!(m.lookup(0x7f0000005005).is_none());
        assert!(matches!(m.lookup(0x7f000000a001), Some(JitName::Js(f)) if f.name == "last"));
    }

    #[test]
    fn a_map_larger_than_the_bound_or_a_link_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let huge = dir.path().join("perf-3.map");
        let f = fs::File::create(&huge).unwrap();
        f.set_len(MAX_PERF_MAP_BYTES + 1).unwrap();
        // What `open` does with a candidate: refused, with one warning.
        let policy = untrusted::Policy {
            owner: Some(rustix::process::geteuid().as_raw()),
            max_size: MAX_PERF_MAP_BYTES,
            inode: None,
        };
        let e = untrusted::open(&huge, &policy).err().unwrap();
        assert!(e.is_suspicious(), "{e}");
        // A map that grows past the bound while read: read up to it, then no more.
        let grown = dir.path().join("perf-4.map");
        let mut m = map_of(&grown);
        let line = "7f0000009000 10 JS:*filler /y.js:1:1\n";
        fs::write(&grown, line).unwrap();
        m.refresh();
        assert_eq!(m.len(), 1);
        fs::OpenOptions::new()
            .write(true)
            .open(&grown)
            .unwrap()
            .set_len(MAX_PERF_MAP_BYTES * 2)
            .unwrap();
        for _ in 0..(MAX_PERF_MAP_BYTES as usize / PERF_MAP_CHUNK + 2) {
            m.refresh();
        }
        assert_eq!(m.read_len, MAX_PERF_MAP_BYTES);
        assert!(m.done && untrusted::warned(&grown));
        // A link in place of the map: refused, said once.
        let link = dir.path().join("perf-5.map");
        std::os::unix::fs::symlink(&grown, &link).unwrap();
        let mut m = map_of(&link);
        m.refresh();
        assert!(m.done && m.len() == 0 && untrusted::warned(&link));
    }
}
