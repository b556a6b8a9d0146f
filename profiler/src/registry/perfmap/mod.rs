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
//!
//! Where the file is: `locate`. What its names mean: `jitname`.

mod jitname;
mod locate;

use std::{fs, path::PathBuf};

pub use jitname::{JitName, JsFunction};
use locate::{candidates, predates};

use crate::registry::untrusted;

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

impl PerfMap {
    /// The perf map of `pid`, if it writes one that may be read: a regular file (no link
    /// anywhere on its path), owned by the process's user or root, no larger than
    /// [`MAX_PERF_MAP_BYTES`], written since the process started. Anything else is ignored
    /// with one warning naming the file and why (once per file).
    pub fn open(pid: u32) -> Option<PerfMap> {
        let locate::Whose {
            euid: owner,
            inner_pid,
        } = locate::whose(pid)?;
        for path in candidates(pid, inner_pid) {
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
            if predates(pid, opened.mtime) {
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
mod tests;
