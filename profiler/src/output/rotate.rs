//! A file that rotates by size: FILE, then FILE.1 (newest) .. FILE.N (oldest), so that a
//! long-running agent's NDJSON never fills the disk.

use std::{
    fs::{self, File},
    io,
    path::{Path, PathBuf},
};

use crate::output::lines::{LineFile, cut_partial_tail};

pub struct Rotating {
    path: PathBuf,
    file: LineFile,
    written: u64,
    limit: u64,
    keep: u32,
}

fn numbered(path: &Path, n: u32) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(format!(".{n}"));
    PathBuf::from(s)
}

impl Rotating {
    /// Opens (appends to) `path`; rotates when a write would take it past `limit` bytes. A
    /// file that ends in a partial line (the agent was killed, or the disk was full, in the
    /// middle of one) is cut back to its last whole line first, and that is said: what is
    /// appended never continues a broken line.
    pub fn open(path: &Path, limit: u64, keep: u32) -> io::Result<Self> {
        let mut file = fs::OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(path)?;
        if file.metadata()?.is_file() {
            let cut = cut_partial_tail(&mut file)?;
            if cut > 0 {
                eprintln!(
                    "mmaplock-prof agent: {} ended in a partial line ({cut} bytes): removed, appending after the last whole line",
                    path.display()
                );
            }
        }
        let file = LineFile::new(file)?;
        Ok(Rotating {
            path: path.to_path_buf(),
            written: file.len().unwrap_or(0),
            file,
            limit: limit.max(1),
            keep,
        })
    }

    fn rotate(&mut self) -> io::Result<()> {
        if self.keep == 0 {
            fs::remove_file(&self.path)?;
        } else {
            for n in (1..self.keep).rev() {
                let from = numbered(&self.path, n);
                if from.exists() {
                    fs::rename(&from, numbered(&self.path, n + 1))?;
                }
            }
            fs::rename(&self.path, numbered(&self.path, 1))?;
        }
        self.file = LineFile::new(File::create(&self.path)?)?;
        self.written = 0;
        Ok(())
    }

    /// Writes one whole record (a line): records are never split across files, and a write
    /// that fails (a full disk) leaves no part of the record behind.
    pub fn write_record(&mut self, record: &[u8]) -> io::Result<()> {
        if self.written > 0 && self.written + record.len() as u64 > self.limit {
            self.rotate()?;
        }
        self.file.write_record(record)?;
        self.written += record.len() as u64;
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotates_whole_lines_and_keeps_n() {
        let (_dir, path) = crate::vocab::scratch::scratch("r.jsonl");
        let mut r = Rotating::open(&path, 25, 2).unwrap();
        for i in 0..10 {
            r.write_record(format!("{{\"line\":{i:03}}}\n").as_bytes())
                .unwrap();
        }
        let read = |p: &Path| fs::read_to_string(p).unwrap_or_default();
        // 13-byte lines, 25-byte limit: one line per file, the newest three kept.
        assert_eq!(read(&path), "{\"line\":009}\n");
        assert_eq!(read(&numbered(&path, 1)), "{\"line\":008}\n");
        assert_eq!(read(&numbered(&path, 2)), "{\"line\":007}\n");
        assert!(!numbered(&path, 3).exists());
    }

    #[test]
    fn a_restart_never_appends_after_a_partial_line() {
        let (_dir, path) = crate::vocab::scratch::scratch("r.jsonl");
        fs::write(&path, "{\"line\":1}\n{\"line\":2").unwrap();
        let mut r = Rotating::open(&path, 1 << 20, 2).unwrap();
        r.write_record(b"{\"line\":3}\n").unwrap();
        assert_eq!(
            fs::read_to_string(&path).unwrap(),
            "{\"line\":1}\n{\"line\":3}\n"
        );
    }
}
