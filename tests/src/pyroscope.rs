//! The stand-in for Grafana Pyroscope's `/ingest` (tests/fixtures/pyroscope-ingest: Pyroscope's
//! own label-set parser and pprof's parser behind Go's multipart reader), built by `cargo
//! xtask test` into `~/.cache/mmaplock-prof/pyroscope-ingest/`: Pyroscope's server cannot be
//! had from a registry here. It answers 400 to what they refuse and writes each push it took
//! as a JSON line. Killed on drop.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use serde_json::Value;

use crate::{scrape::free_port, wait_until};

pub fn ingest_bin() -> Option<PathBuf> {
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    let bin = home.join(".cache/mmaplock-prof/pyroscope-ingest/pyroscope-ingest");
    bin.is_file().then_some(bin)
}

pub struct Ingest {
    child: Child,
    pub port: u16,
    out: PathBuf,
}

impl Ingest {
    pub fn start(bin: &Path, dir: &Path) -> Self {
        let port = free_port();
        let out = dir.join("ingested.jsonl");
        let child = Command::new(bin)
            .arg(format!("127.0.0.1:{port}"))
            .arg(&out)
            .stdin(Stdio::null())
            .spawn()
            .expect("start the ingest stand-in");
        wait_until(
            crate::scaled(Duration::from_secs(30)),
            Duration::from_millis(50),
            || {
                std::net::TcpStream::connect(("127.0.0.1", port))
                    .map(drop)
                    .map_err(|e| format!("port {port}: {e}"))
            },
        );
        Ingest { child, port, out }
    }

    /// The pushes it took.
    pub fn pushes(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect()
    }
}

impl Drop for Ingest {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
