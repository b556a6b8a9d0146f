//! `cargo xtask dist`: a tarball that a production host uses as is, with no Rust toolchain:
//! the release binary (debug info stripped; it needs only glibc), the systemd unit, every
//! dashboard and rule file under deploy/, the docs and an install.sh. One per architecture
//! the project ships (x86_64 and aarch64: `cross::TARGETS`), the other's cross-built here;
//! its binary is run here under qemu-user (its `--version`, what it links) as the host's is.
//!
//! target/dist/mmaplock-prof-VERSION-ARCH-linux.tar.gz holds one directory of that name:
//!
//! ```text
//! bin/mmaplock-prof
//! install.sh
//! README.md, CHANGELOG.md, LICENSE* (if any)
//! docs/*.md
//! deploy/...            (every file under deploy/: systemd/, grafana/, prometheus/, ...)
//! ```

mod glibc;

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
};

use crate::toolchain::output;
use anyhow::{Context as _, Result, bail};

use crate::cross::Target;
use crate::{cargo, run, workspace_root};
use glibc::{newest_glibc, non_glibc, shared_libraries};

/// What install.sh does (docs/install.md).
const INSTALL_SH: &str = include_str!("dist/install.sh");

/// The unit install.sh installs; the tarball is useless without it.
const UNIT: &str = "deploy/systemd/mmaplock-prof.service";

/// Builds the release binary for `target` and packs it: the tarball's path.
pub fn dist(linker_dir: &Path, target: Target) -> Result<PathBuf> {
    let root = workspace_root();
    target.ensure_toolchain()?;
    let mut cmd = cargo(linker_dir)?;
    cmd.args([
        "build",
        "--release",
        "-p",
        "profiler",
        "--bin",
        "mmaplock-prof",
    ]);
    if !target.is_host() {
        cmd.args(["--target", target.triple]);
        target.configure(&mut cmd);
    }
    run(&mut cmd)?;
    pack(
        &target.out_dir(true).join("mmaplock-prof"),
        &root.join("target/dist"),
        target,
    )
}

/// `cargo xtask dist [--target T]`: the tarballs of `targets` (every architecture shipped
/// when none is named), one after another.
pub fn dist_all(linker_dir: &Path, targets: &[Target]) -> Result<Vec<PathBuf>> {
    targets.iter().map(|t| dist(linker_dir, *t)).collect()
}

/// Packs `binary` (a release build for `target`, or the tests' debug one for the tests'
/// image) with everything else into `dist`/NAME.tar.gz; its path.
pub fn pack(binary: &Path, dist: &Path, target: Target) -> Result<PathBuf> {
    let root = workspace_root();
    let stage_root = dist.join("stage");
    let _ = fs::remove_dir_all(&stage_root);
    fs::create_dir_all(&stage_root)?;
    // Copied first: the target directory is shared, and another build may replace it.
    let staged_bin = stage_root.join("mmaplock-prof");
    fs::copy(binary, &staged_bin).with_context(|| format!("copy {}", binary.display()))?;
    let version = binary_version(&staged_bin, target)?;
    let name = format!("mmaplock-prof-{version}-{}-linux", target.arch);
    let stage = stage_root.join(&name);

    for (src, dest) in payload(&root)? {
        copy_into(&src, &stage.join(dest))?;
    }
    let bin = stage.join("bin/mmaplock-prof");
    fs::create_dir_all(bin.parent().unwrap())?;
    fs::rename(&staged_bin, &bin)?;
    // Debug info is for our own backtraces and perf, not for hosts: keep the symbol table.
    match Command::new(target.tool("strip"))
        .arg("--strip-debug")
        .arg(&bin)
        .status()
    {
        Ok(s) if s.success() => {}
        other => eprintln!("xtask dist: strip --strip-debug failed ({other:?}): kept as is"),
    }
    let install = stage.join("install.sh");
    fs::write(&install, INSTALL_SH)?;
    fs::set_permissions(&install, fs::Permissions::from_mode(0o755))?;

    let libs = shared_libraries(&output(&mut ldd(&bin, target))?);
    let foreign = non_glibc(&libs);
    if !foreign.is_empty() {
        bail!(
            "bin/mmaplock-prof links libraries a bare glibc host may lack: {}",
            foreign.join(", ")
        );
    }
    let glibc = output(Command::new(target.tool("objdump")).arg("-T").arg(&bin))
        .ok()
        .and_then(|t| newest_glibc(&t));
    // Still runs, stripped.
    output(target.command(&bin).arg("--version"))?;

    fs::create_dir_all(dist)?;
    let tarball = dist.join(format!("{name}.tar.gz"));
    let _ = fs::remove_file(&tarball);
    run(Command::new("tar")
        .arg("-C")
        .arg(&stage_root)
        .args([
            "--sort=name",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            &format!("--mtime=@{}", source_date(&root)),
            "--use-compress-program=gzip -9n",
            "-cf",
        ])
        .arg(&tarball)
        .arg(&name))?;
    let _ = fs::remove_dir_all(&stage_root);

    let size = fs::metadata(&tarball)?.len();
    let shown = tarball.strip_prefix(&root).unwrap_or(&tarball);
    println!("{} ({})", shown.display(), human_size(size));
    println!(
        "  bin/mmaplock-prof {version}, {}: needs glibc{} ({})",
        target.arch,
        glibc.map_or(String::new(), |(a, b)| format!(" >= {a}.{b}")),
        libs.join(", ")
    );
    println!("  install: tar xzf {name}.tar.gz && sudo ./{name}/install.sh (docs/install.md)");
    Ok(tarball)
}

/// The files to ship besides the binary and install.sh: (source, path in the tarball), sorted
/// by the latter. Everything under deploy/ (whatever the dashboards and rules are called by
/// then), docs/*.md, README.md, CHANGELOG.md and any LICENSE, COPYING or NOTICE file; no hidden files nor
/// editor leftovers.
pub fn payload(root: &Path) -> Result<Vec<(PathBuf, PathBuf)>> {
    let mut out = Vec::new();
    for e in fs::read_dir(root)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        let upper = name.to_ascii_uppercase();
        let wanted = name == "README.md"
            || name == "CHANGELOG.md"
            || ["LICENSE", "LICENCE", "COPYING", "NOTICE"]
                .iter()
                .any(|p| upper.starts_with(p));
        if wanted && e.file_type()?.is_file() && shippable(&name) {
            out.push((e.path(), PathBuf::from(name)));
        }
    }
    if !out.iter().any(|(_, d)| d == Path::new("README.md")) {
        bail!("no README.md in {}", root.display());
    }
    let docs = root.join("docs");
    if docs.is_dir() {
        for e in fs::read_dir(&docs)? {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            if name.ends_with(".md") && e.file_type()?.is_file() && shippable(&name) {
                out.push((e.path(), Path::new("docs").join(name)));
            }
        }
    }
    walk(root, Path::new("deploy"), &mut out)?;
    if !out.iter().any(|(_, d)| d == Path::new(UNIT)) {
        bail!("no {UNIT}: the tarball would install no service");
    }
    out.sort_by(|a, b| a.1.cmp(&b.1));
    Ok(out)
}

/// Every shippable file under `root/rel`, recursively.
fn walk(root: &Path, rel: &Path, out: &mut Vec<(PathBuf, PathBuf)>) -> Result<()> {
    let dir = root.join(rel);
    if !dir.is_dir() {
        return Ok(());
    }
    for e in fs::read_dir(&dir).with_context(|| format!("read {}", dir.display()))? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if !shippable(&name) {
            continue;
        }
        let t = e.file_type()?;
        if t.is_dir() {
            walk(root, &rel.join(&name), out)?;
        } else if t.is_file() {
            out.push((e.path(), rel.join(&name)));
        }
    }
    Ok(())
}

/// Not hidden, not an editor's or a merge's leftover.
fn shippable(name: &str) -> bool {
    !name.starts_with('.')
        && !name.ends_with('~')
        && ![".swp", ".orig", ".rej", ".bak"]
            .iter()
            .any(|s| name.ends_with(s))
}

/// Copies a file, keeping whether it is executable; the tarball's modes are 0644 or 0755.
fn copy_into(src: &Path, dest: &Path) -> Result<()> {
    fs::create_dir_all(dest.parent().expect("a path in the stage"))?;
    fs::copy(src, dest).with_context(|| format!("copy {}", src.display()))?;
    let exec = fs::metadata(src)?.permissions().mode() & 0o111 != 0;
    fs::set_permissions(
        dest,
        fs::Permissions::from_mode(if exec { 0o755 } else { 0o644 }),
    )?;
    Ok(())
}

/// What `binary` (built for `target`) links, as `ldd` says it: the host's `ldd`, or for
/// another architecture its own dynamic loader's `--list` (ldd's output), under qemu-user
/// with the target's C library.
pub fn ldd(binary: &Path, target: Target) -> Command {
    if target.is_host() {
        let mut c = Command::new("ldd");
        c.arg(binary);
        return c;
    }
    let lib = target.sysroot_lib();
    let loader = std::fs::read_dir(&lib)
        .ok()
        .and_then(|d| {
            d.filter_map(|e| e.ok()).map(|e| e.path()).find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("ld-linux"))
            })
        })
        .unwrap_or_else(|| lib.join("ld-linux.so"));
    let mut c = target.command(&loader);
    c.arg("--library-path").arg(&lib).arg("--list").arg(binary);
    c
}

/// `mmaplock-prof --version` says `mmaplock-prof 0.1.0`.
fn binary_version(bin: &Path, target: Target) -> Result<String> {
    let out = output(target.command(bin).arg("--version"))?;
    let v = out.split_whitespace().last().unwrap_or_default();
    if v.is_empty()
        || !v
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ".-+".contains(c))
    {
        bail!(
            "cannot read a version from `{} --version`: {out:?}",
            bin.display()
        );
    }
    Ok(v.to_string())
}

/// The tarball's timestamps: SOURCE_DATE_EPOCH, else the last commit's, so that the same
/// commit gives the same archive.
fn source_date(root: &Path) -> u64 {
    std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .or_else(|| {
            output(
                Command::new("git")
                    .arg("-C")
                    .arg(root)
                    .args(["log", "-1", "--format=%ct"]),
            )
            .ok()
        })
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

fn human_size(bytes: u64) -> String {
    if bytes >= 1 << 20 {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    } else {
        format!("{:.1} KiB", bytes as f64 / 1024.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory of its own under the system's temporary directory, removed when dropped.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(tag: &str) -> Self {
            let d = std::env::temp_dir().join(format!("xtask-dist-{}-{tag}", std::process::id()));
            let _ = fs::remove_dir_all(&d);
            fs::create_dir_all(&d).unwrap();
            Scratch(d)
        }

        fn file(&self, rel: &str, text: &str) {
            let p = self.0.join(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, text).unwrap();
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn dests(root: &Path) -> Vec<String> {
        payload(root)
            .unwrap()
            .into_iter()
            .map(|(_, d)| d.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn the_payload_is_deploy_docs_readme_changelog_and_licenses() {
        let w = Scratch::new("payload");
        for f in [
            "README.md",
            "CHANGELOG.md",
            "LICENSE-MIT",
            "LICENSE-APACHE",
            "Cargo.toml",
            "docs/cli.md",
            "docs/privileges.md",
            "docs/notes.txt",
            "docs/img/x.md",
            "docs/.draft.md",
            UNIT,
            "deploy/grafana/mmaplock.json",
            "deploy/prometheus/rules.yml",
            "deploy/prometheus/tests/rules.test.yml",
            "deploy/prometheus/rules.yml~",
            "deploy/.gitkeep",
            "profiler/src/main.rs",
        ] {
            w.file(f, "x");
        }
        assert_eq!(
            dests(&w.0),
            [
                "CHANGELOG.md",
                "LICENSE-APACHE",
                "LICENSE-MIT",
                "README.md",
                "deploy/grafana/mmaplock.json",
                "deploy/prometheus/rules.yml",
                "deploy/prometheus/tests/rules.test.yml",
                "deploy/systemd/mmaplock-prof.service",
                "docs/cli.md",
                "docs/privileges.md",
            ]
        );
    }

    #[test]
    fn no_unit_or_readme_is_an_error() {
        let w = Scratch::new("nounit");
        w.file("README.md", "x");
        w.file("deploy/grafana/a.json", "x");
        let e = payload(&w.0).unwrap_err().to_string();
        assert!(e.contains(UNIT), "{e}");
        let w = Scratch::new("noreadme");
        w.file(UNIT, "x");
        assert!(payload(&w.0).unwrap_err().to_string().contains("README.md"));
    }

    #[test]
    fn the_project_ships_its_unit_and_docs() {
        let d = dests(&workspace_root());
        for f in [UNIT, "README.md", "docs/privileges.md", "docs/install.md"] {
            assert!(d.iter().any(|x| x == f), "{f} not in {d:?}");
        }
    }

    #[test]
    fn install_sh_stages_the_binary_unit_and_docs() {
        let w = Scratch::new("install");
        let pkg = w.0.join("pkg");
        w.file("pkg/bin/mmaplock-prof", "#!/bin/sh\n");
        w.file(
            &format!("pkg/{UNIT}"),
            "ExecStart=/usr/local/bin/mmaplock-prof agent\n\
             Documentation=file:/usr/local/share/doc/mmaplock-prof/privileges.md\n",
        );
        w.file("pkg/README.md", "readme");
        w.file("pkg/docs/privileges.md", "privileges");
        w.file("pkg/install.sh", INSTALL_SH);
        let dest = w.0.join("dest");
        let out = Command::new("sh")
            .arg(pkg.join("install.sh"))
            .env("DESTDIR", &dest)
            .env("PREFIX", "/opt/mlp")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let bin = dest.join("opt/mlp/bin/mmaplock-prof");
        assert_eq!(
            fs::metadata(&bin).unwrap().permissions().mode() & 0o777,
            0o755
        );
        let unit =
            fs::read_to_string(dest.join("etc/systemd/system/mmaplock-prof.service")).unwrap();
        assert!(
            unit.contains("ExecStart=/opt/mlp/bin/mmaplock-prof agent"),
            "{unit}"
        );
        assert!(unit.contains("file:/opt/mlp/share/doc/mmaplock-prof/privileges.md"));
        for d in ["README.md", "privileges.md"] {
            assert!(
                dest.join("opt/mlp/share/doc/mmaplock-prof")
                    .join(d)
                    .is_file()
            );
        }
        assert!(
            stdout.contains("systemctl enable --now mmaplock-prof"),
            "{stdout}"
        );
    }
}
