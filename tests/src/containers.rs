//! Containers for the tests, through podman (Debian's; `cargo xtask test` installs it and
//! runc): runtime runc, since crun refuses this host kind's hybrid cgroup layout, and the
//! ulimits that runc may set without CAP_SYS_RESOURCE.
//!
//! The node image is built here, from the host's node and the libraries `ldd` says it links,
//! with no registry: a tarball of that root file system, `podman import`ed. node sits at
//! `/opt/node/bin/node`, a path the host does not have, so that a report naming it names the
//! file as the container sees it. Built once per image content (its tag is a hash of the
//! files' names, sizes and times) and kept for the next run; older tags are removed.

// The same reading of `ldd` as xtask's image (its unit tests are there).
#[path = "../../xtask/src/ldd.rs"]
mod ldd;

use std::{
    hash::{Hash, Hasher},
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::OnceLock,
};

pub const PODMAN: &str = "/usr/bin/podman";
/// Where the image has node.
pub const NODE_IN_IMAGE: &str = "/opt/node/bin/node";
/// The tests' fixtures, mounted read-only.
pub const FIXTURES_IN_IMAGE: &str = "/app";
const REPOSITORY: &str = "localhost/mmaplock-prof-test-node";

/// Arguments every container of the tests gets (`podman run` and `podman create`).
pub const RUN_ARGS: [&str; 6] = [
    "--runtime",
    "runc",
    "--ulimit",
    "nofile=20000:20000",
    "--ulimit",
    "nproc=4096:4096",
];

/// A podman command (no output on the test's terminal unless it fails: see [`output`]).
pub fn podman() -> Command {
    Command::new(PODMAN)
}

/// Runs a command; its standard output, or why it failed.
pub fn output(cmd: &mut Command) -> Result<String, String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Whether podman and runc are there; Err says what is missing (the caller skips, which
/// fails under CI: `cargo xtask test` installs both).
pub fn available() -> Result<(), String> {
    for (what, path) in [("podman", PODMAN), ("runc", "/usr/sbin/runc")] {
        if !Path::new(path).exists() {
            return Err(format!("{what} is not installed ({path})"));
        }
    }
    Ok(())
}

/// The node image's tag, built if needed (once per test binary); Err says why it cannot be.
pub fn node_image() -> Result<String, String> {
    static IMAGE: OnceLock<Result<String, String>> = OnceLock::new();
    IMAGE.get_or_init(build_node_image).clone()
}

/// The host's node, resolved (`/usr/bin/node` or wherever PATH has it).
fn host_node() -> Result<PathBuf, String> {
    let which = output(Command::new("sh").args(["-c", "command -v node"]))
        .map_err(|_| "no node on PATH".to_string())?;
    std::fs::canonicalize(&which).map_err(|e| format!("{which}: {e}"))
}

/// The shared libraries a binary links, as `ldd` resolves them on this host (the loader too).
pub fn linked_libraries(bin: &Path) -> Result<Vec<PathBuf>, String> {
    let libs = ldd::linked_files(&output(Command::new("ldd").arg(bin))?);
    if libs.is_empty() {
        return Err(format!("ldd found no libraries for {}", bin.display()));
    }
    Ok(libs)
}

fn build_node_image() -> Result<String, String> {
    available()?;
    let node = host_node()?;
    let libs = linked_libraries(&node)?;
    // (path in the image, file on the host)
    let mut files: Vec<(PathBuf, PathBuf)> = vec![(PathBuf::from(NODE_IN_IMAGE), node.clone())];
    files.extend(libs.iter().map(|l| (l.clone(), l.clone())));
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for (inside, host) in &files {
        let m = std::fs::metadata(host).map_err(|e| format!("{}: {e}", host.display()))?;
        (inside, m.len(), m.mtime(), m.mtime_nsec()).hash(&mut h);
    }
    let tag = format!("{REPOSITORY}:{:016x}", h.finish());
    let exists = podman()
        .args(["image", "exists", &tag])
        .status()
        .is_ok_and(|s| s.success());
    if !exists {
        let dir = tempfile_dir()?;
        let root = dir.join("rootfs");
        for (inside, host) in &files {
            let dest = root.join(inside.strip_prefix("/").unwrap_or(inside));
            std::fs::create_dir_all(dest.parent().unwrap()).map_err(|e| e.to_string())?;
            // Dereferenced: the image holds files, not the host's links.
            std::fs::copy(host, &dest).map_err(|e| format!("{}: {e}", host.display()))?;
        }
        for d in ["tmp", "app", "proc", "sys", "dev", "etc"] {
            std::fs::create_dir_all(root.join(d)).map_err(|e| e.to_string())?;
        }
        output(Command::new("chmod").arg("1777").arg(root.join("tmp")))?;
        let tarball = dir.join("rootfs.tar");
        output(
            Command::new("tar")
                .arg("-C")
                .arg(&root)
                .args(["--owner=0", "--group=0", "--numeric-owner", "-cf"])
                .arg(&tarball)
                .arg("."),
        )?;
        output(
            podman()
                .args(["import", "--quiet", "--change"])
                .arg(format!("ENTRYPOINT [\"{NODE_IN_IMAGE}\"]"))
                .args(["--change", "WORKDIR /tmp"])
                .arg(&tarball)
                .arg(&tag),
        )?;
        let _ = std::fs::remove_dir_all(&dir);
        // Earlier builds of the image (another node, other libraries) are of no more use.
        let listed = output(podman().args([
            "images",
            "--format",
            "{{.Repository}}:{{.Tag}}",
            "--filter",
            &format!("reference={REPOSITORY}"),
        ]))
        .unwrap_or_default();
        for old in listed.lines().filter(|t| *t != tag && !t.is_empty()) {
            let _ = output(podman().args(["rmi", "--force", old]));
        }
    }
    // The image runs (and podman's parent cgroup, /libpod_parent with runc here, exists from
    // now on: a selector may name it before the test's own container starts).
    let v = output(
        podman()
            .args(["run", "--rm"])
            .args(RUN_ARGS)
            .arg(&tag)
            .args(["-e", "process.stdout.write(process.version)"]),
    )?;
    if !v.starts_with('v') {
        return Err(format!("node in {tag} printed {v:?}"));
    }
    Ok(tag)
}

fn tempfile_dir() -> Result<PathBuf, String> {
    let d = std::env::temp_dir().join(format!("mlp-image-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).map_err(|e| e.to_string())?;
    Ok(d)
}

/// A container by name, removed (killed first) when dropped.
pub struct Container {
    pub name: String,
}

impl Container {
    /// A name of this test process's, unique among its containers.
    pub fn new_name(what: &str) -> Container {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Container {
            name: format!("mlp-{what}-{}-{n}", std::process::id()),
        }
    }

    /// `podman run -i --rm --name NAME RUN_ARGS podman_args IMAGE args`, the fixtures
    /// mounted at [`FIXTURES_IN_IMAGE`]: for [`crate::Workload::spawn`] (stdin is passed on).
    pub fn run_command(&self, image: &str, podman_args: &[&str], args: &[&str]) -> Command {
        let mut c = podman();
        c.args(["run", "-i", "--rm", "--name", &self.name])
            .args(RUN_ARGS)
            .arg("-v")
            .arg(format!(
                "{}:{FIXTURES_IN_IMAGE}:ro",
                crate::fixture("").display()
            ))
            .args(podman_args)
            .arg(image)
            .args(args);
        c
    }

    /// `roles.js` in this container, as [`crate::roles_workload`] runs it on the host: 3
    /// Workers reading a 64 KiB file (written in `data`, mounted at /data) `iterations` times
    /// each, two libuv threadpool threads, two V8 platform threads.
    pub fn roles_command(&self, image: &str, data: &Path, iterations: u32) -> Command {
        std::fs::write(data.join("data.bin"), vec![7u8; 64 * 1024]).unwrap();
        let file = format!("{FIXTURES_IN_IMAGE}/roles.js");
        self.run_command(
            image,
            &[
                "-e",
                "UV_THREADPOOL_SIZE=2",
                "-v",
                &format!("{}:/data:ro", data.display()),
            ],
            &[
                "--v8-pool-size=2",
                &file,
                "3",
                &iterations.to_string(),
                "/data/data.bin",
            ],
        )
    }

    /// `podman create` of the image with `args`; the container's id.
    pub fn create(
        &self,
        image: &str,
        podman_args: &[&str],
        args: &[&str],
    ) -> Result<String, String> {
        output(
            podman()
                .args(["create", "--name", &self.name])
                .args(RUN_ARGS)
                .args(podman_args)
                .arg(image)
                .args(args),
        )
    }

    /// `podman init`, `podman start`, ...: a podman verb on this container.
    pub fn verb(&self, verb: &str) -> Result<String, String> {
        output(podman().args([verb, &self.name]))
    }

    /// A field of `podman inspect` (a Go template such as `{{.State.Pid}}`).
    pub fn inspect(&self, format: &str) -> Result<String, String> {
        output(podman().args(["inspect", "--format", format, &self.name]))
    }

    /// The host pid of the container's first process (0 when it is not running).
    pub fn host_pid(&self) -> u32 {
        self.inspect("{{.State.Pid}}")
            .ok()
            .and_then(|p| p.parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman()
            .args(["rm", "--force", "--time", "0", &self.name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// A process's cgroup v2 path, as /proc says it (`0::PATH`).
pub fn cgroup_of(pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::to_string)
}

/// The host's tid of each thread of `pid`, by its tid inside the process's pid namespace
/// (`NSpid` of /proc/PID/task/TID/status: host first, innermost last).
pub fn host_tids(pid: u32) -> std::collections::HashMap<u64, u64> {
    let mut out = std::collections::HashMap::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let Ok(status) = std::fs::read_to_string(e.path().join("status")) else {
            continue;
        };
        if let Some(line) = status.lines().find(|l| l.starts_with("NSpid:")) {
            let ids: Vec<u64> = line
                .split_whitespace()
                .skip(1)
                .filter_map(|n| n.parse().ok())
                .collect();
            if let (Some(&host), Some(&inner)) = (ids.first(), ids.last()) {
                out.insert(inner, host);
            }
        }
    }
    out
}
