//! Output files that survive what goes wrong around them:
//!
//! - [`Pending`]: a file named on the command line is opened at once, to fail early (exit 2)
//!   if it cannot be written, but not truncated: an existing file is emptied only once the
//!   run has attached ([`Pending::commit`]). A usage error, missing privileges or a refused
//!   `--bpf-stats` leave it as it was (a file created for the run is removed again).
//! - [`LineFile`]: one record (a JSON line, a text report) goes in one write, and a write that
//!   fails half-way (a full disk) is cut back to the last whole record, so the file never
//!   holds a partial line.
//! - [`Trouble`]: a failing output is said once on standard error, naming the file and why,
//!   and once more when it can be written again; the run goes on meanwhile.

use std::{
    fs::{self, File, OpenOptions},
    io::{self, Seek, SeekFrom, Write},
    path::{Path, PathBuf},
};

/// A file opened for the run, not yet truncated.
pub struct Pending {
    path: PathBuf,
    file: Option<File>,
    /// We created it: removed again if the run never starts.
    created: bool,
}

impl Pending {
    /// Opens `path` for writing without changing it (created if absent).
    pub fn open(path: &Path) -> io::Result<Pending> {
        let (file, created) = match OpenOptions::new().write(true).open(path) {
            Ok(f) => (f, false),
            Err(e) if e.kind() == io::ErrorKind::NotFound => (
                OpenOptions::new().write(true).create_new(true).open(path)?,
                true,
            ),
            Err(e) => return Err(e),
        };
        Ok(Pending {
            path: path.to_path_buf(),
            file: Some(file),
            created,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The run has started: the file is emptied (a regular file; a FIFO or a terminal is
    /// left as it is) and handed over.
    pub fn commit(mut self) -> io::Result<File> {
        let mut file = self.file.take().expect("committed once");
        if file.metadata()?.is_file() {
            file.set_len(0)?;
            file.seek(SeekFrom::Start(0))?;
        }
        Ok(file)
    }

    /// The run has started, and the file is written by someone else at its end: only keep
    /// it (do not remove it).
    pub fn keep(mut self) {
        self.file = None;
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if self.file.is_some() && self.created {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// A file written a whole record at a time, at its end.
pub struct LineFile {
    file: File,
    /// A regular file: a partial write is cut back to where the file ended before it.
    regular: bool,
}

impl LineFile {
    /// `file` as it is (positioned at its end, or opened for appending).
    pub fn new(mut file: File) -> io::Result<LineFile> {
        let regular = file.metadata()?.is_file();
        if regular {
            file.seek(SeekFrom::End(0))?;
        }
        Ok(LineFile { file, regular })
    }

    /// Writes `record` whole, or not at all (as far as the file system lets us: a partial
    /// write is cut back). The end is taken anew each time, so a file truncated by someone
    /// else (logrotate's copytruncate) is cut back to its new end, not its old one.
    pub fn write_record(&mut self, record: &[u8]) -> io::Result<()> {
        let end = if self.regular {
            Some(self.file.metadata()?.len())
        } else {
            None
        };
        self.file.write_all(record).inspect_err(|_| {
            if let Some(end) = end {
                // Best effort: on a full disk, shrinking a file always works.
                let _ = self.file.set_len(end);
                let _ = self.file.seek(SeekFrom::Start(end));
            }
        })
    }

    /// The file's length now (regular files).
    pub fn len(&self) -> Option<u64> {
        self.regular
            .then(|| self.file.metadata().map(|m| m.len()).ok())
            .flatten()
    }
}

/// Cuts a file that does not end with a newline back to its last whole line (a record cut
/// short by a crash or a full disk), so that what is appended next starts a line of its own.
/// Returns the bytes removed.
pub fn cut_partial_tail(file: &mut File) -> io::Result<u64> {
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(0);
    }
    let mut pos = len;
    let mut buf = vec![0u8; 64 * 1024];
    let keep = loop {
        let start = pos.saturating_sub(buf.len() as u64);
        let chunk = &mut buf[..(pos - start) as usize];
        file.seek(SeekFrom::Start(start))?;
        io::Read::read_exact(file, chunk)?;
        if pos == len && chunk.last() == Some(&b'\n') {
            return Ok(0);
        }
        if let Some(i) = chunk.iter().rposition(|&b| b == b'\n') {
            break start + i as u64 + 1;
        }
        if start == 0 {
            break 0;
        }
        pos = start;
    };
    file.set_len(keep)?;
    file.seek(SeekFrom::Start(keep))?;
    Ok(len - keep)
}

/// Whether an output is failing, to say so once (and once more when it recovers).
#[derive(Default)]
pub struct Trouble {
    failing: bool,
    /// Records not written since it began failing.
    dropped: u64,
}

impl Trouble {
    /// A write to `what` failed: says so the first time.
    pub fn failed(&mut self, what: &str, e: &io::Error, then: &str) {
        self.dropped += 1;
        if !self.failing {
            self.failing = true;
            eprintln!("mmaplock-prof: cannot write {what}: {e}; {then}");
        }
    }

    /// A write to `what` worked: says so if it had been failing.
    pub fn worked(&mut self, what: &str) {
        if self.failing {
            eprintln!(
                "mmaplock-prof: {what} is written again ({} report(s) could not be)",
                self.dropped
            );
            self.failing = false;
            self.dropped = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pending_file_is_untouched_until_committed_and_a_new_one_removed() {
        let (dir, old) = crate::vocab::scratch::scratch("old.json");
        fs::write(&old, "keep me\n").unwrap();
        drop(Pending::open(&old).unwrap());
        assert_eq!(fs::read_to_string(&old).unwrap(), "keep me\n");
        let new = dir.path().join("new.json");
        drop(Pending::open(&new).unwrap());
        assert!(!new.exists(), "created for a run that never started");
        let mut f = Pending::open(&old).unwrap().commit().unwrap();
        f.write_all(b"x\n").unwrap();
        assert_eq!(fs::read_to_string(&old).unwrap(), "x\n");
        Pending::open(&new).unwrap().keep();
        assert!(new.exists());
        assert!(Pending::open(&dir.path().join("no/such/dir")).is_err());
    }

    #[test]
    fn a_partial_tail_is_cut_back_to_the_last_whole_line() {
        let (_dir, p) = crate::vocab::scratch::scratch("r.jsonl");
        for (content, kept) in [
            ("", ""),
            ("{\"a\":1}\n", "{\"a\":1}\n"),
            ("{\"a\":1}\n{\"b\":", "{\"a\":1}\n"),
            ("{\"b\":", ""),
        ] {
            fs::write(&p, content).unwrap();
            let mut f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
            let cut = cut_partial_tail(&mut f).unwrap();
            assert_eq!(fs::read_to_string(&p).unwrap(), kept);
            assert_eq!(cut as usize, content.len() - kept.len());
        }
        // A partial line longer than one read.
        let long = format!("{{\"a\":1}}\n{}", "x".repeat(200_000));
        fs::write(&p, &long).unwrap();
        let mut f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
        cut_partial_tail(&mut f).unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "{\"a\":1}\n");
    }
}
