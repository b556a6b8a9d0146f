//! The programs the tests run: this build's profiler and ground-truth helpers (from
//! `target/<profile>`), the fixtures, and the N-API addons built from them with gcc.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

/// Where cargo put this test's binaries: `target/<profile>`.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/<test binary>
    exe.parent()
        .and_then(Path::parent)
        .expect("test binary in target/<profile>/deps")
        .to_path_buf()
}

pub(crate) fn built(name: &str) -> PathBuf {
    let p = target_dir().join(name);
    assert!(
        p.exists(),
        "{} is not built: run the tests with `cargo xtask test`",
        p.display()
    );
    p
}

/// The profiler under test: this build's, or the one `MMAPLOCK_PROF_BIN` names (to run the
/// tests against another build).
pub fn profiler_bin() -> PathBuf {
    match std::env::var_os("MMAPLOCK_PROF_BIN") {
        Some(p) => PathBuf::from(p),
        None => built("mmaplock-prof"),
    }
}

pub fn churn_bin() -> PathBuf {
    built("mmap-churn")
}

pub fn lock_ops_bin() -> PathBuf {
    built("lock-ops")
}

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name)
}

/// Builds the tests' N-API addon (`fixtures/addon/churn.c`) with gcc against the installed
/// Node headers, into `dir`.
pub fn build_addon(dir: &Path) -> PathBuf {
    let out = dir.join("churn.node");
    gcc(&out, "addon/churn.c", &[]);
    out
}

/// Builds the addon-library fixture into `dir`: `libmmaplock_spawner.so`
/// (`fixtures/addon/libspawner.c`, which starts a thread of its own) and `spawner.node`
/// (`fixtures/addon/spawner.c`), which needs it (DT_NEEDED, found through its rpath
/// `$ORIGIN`). Returns the addon.
pub fn build_spawner_addon(dir: &Path) -> PathBuf {
    gcc(
        &dir.join("libmmaplock_spawner.so"),
        "addon/libspawner.c",
        &["-Wl,-soname,libmmaplock_spawner.so"],
    );
    let out = dir.join("spawner.node");
    let lib_dir = format!("-L{}", dir.display());
    gcc(
        &out,
        "addon/spawner.c",
        &[&lib_dir, "-lmmaplock_spawner", "-Wl,-rpath,$ORIGIN"],
    );
    out
}

/// Compiles the fixture `source` into the shared object `out` (with Node's headers).
pub(crate) fn gcc(out: &Path, source: &str, link: &[&str]) {
    let status = Command::new("gcc")
        .args([
            "-shared",
            "-fPIC",
            "-O2",
            "-pthread",
            "-I/usr/include/node",
            "-o",
        ])
        .arg(out)
        .arg(fixture(source))
        .args(link)
        .status()
        .expect("gcc");
    assert!(status.success(), "building {source} failed");
}
