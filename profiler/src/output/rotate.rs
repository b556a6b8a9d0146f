//! A file that rotates by size: FILE, then FILE.1 (newest) .. FILE.N (oldest), so that a
//! long-running agent's NDJSON never fills the disk.

use std::{
    fs::{self, File},
    io::{self, BufWriter, Write},
    path::{Path, PathBuf},
};

pub struct Rotating {
    path: PathBuf,
    file: BufWriter<File>,
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
    /// Opens (appends to) `path`; rotates when a write would take it past `limit` bytes.
    pub fn open(path: &Path, limit: u64, keep: u32) -> io::Result<Self> {
        let file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        let written = file.metadata()?.len();
        Ok(Rotating {
            path: path.to_path_buf(),
            file: BufWriter::new(file),
            written,
            limit: limit.max(1),
            keep,
        })
    }

    fn rotate(&mut self) -> io::Result<()> {
        self.file.flush()?;
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
        self.file = BufWriter::new(File::create(&self.path)?);
        self.written = 0;
        Ok(())
    }

    /// Writes one whole record (a line): records are never split across files.
    pub fn write_record(&mut self, record: &[u8]) -> io::Result<()> {
        if self.written > 0 && self.written + record.len() as u64 > self.limit {
            self.rotate()?;
        }
        self.file.write_all(record)?;
        self.file.flush()?;
        self.written += record.len() as u64;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotates_whole_lines_and_keeps_n() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.jsonl");
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
}
