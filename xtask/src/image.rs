//! `cargo xtask image`: the agent's OCI image, built with podman from the dist tarball and
//! `deploy/container/Containerfile` (`FROM scratch`): the tarball's binary and the C library
//! it links, as `ldd` resolves them here (the dist step has checked that it links nothing
//! else). Nothing is fetched: no base image, no registry. One image per architecture (the
//! arm64 one holds Debian's arm64 C library, from the cross packages, where an arm64 system
//! keeps it), and a manifest list naming both, which a registry serves to each node as its
//! own: the DaemonSet needs no change between architectures.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result};

use crate::cross::Target;
use crate::{ldd::linked_files, run, toolchain::output, workspace_root};

/// The tests' image (of the debug build), which `cargo xtask test` makes for tests/tests/image.rs.
pub const TEST_TAG: &str = "localhost/mmaplock-prof:test";

/// The default name: `localhost/mmaplock-prof:VERSION`, from a tarball's name.
pub fn default_tag(tarball: &Path) -> Result<String> {
    let version = tarball
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("mmaplock-prof-"))
        .and_then(|r| r.split('-').next())
        .context("a tarball named mmaplock-prof-VERSION-...")?;
    Ok(format!("localhost/mmaplock-prof:{version}"))
}

/// The images of every tarball (one per architecture, each tagged `TAG-ARCH`, Debian's
/// architecture name) and a manifest list `TAG` naming them all: the tag.
pub fn build_multi(tarballs: &[(Target, PathBuf)], tag: Option<&str>) -> Result<String> {
    let first = &tarballs.first().context("no tarball")?.1;
    let tag = tag.map_or_else(|| default_tag(first), |t| Ok(t.to_string()))?;
    let mut images = Vec::new();
    for (target, tarball) in tarballs {
        images.push(build(
            tarball,
            Some(&format!("{tag}-{}", target.debian)),
            *target,
        )?);
    }
    // Made again from scratch: a list of an earlier run would keep its old images.
    let _ = output(Command::new("podman").args(["manifest", "rm", &tag]));
    let _ = output(Command::new("podman").args(["rmi", &tag]));
    output(Command::new("podman").args(["manifest", "create", &tag]))?;
    for image in &images {
        let image = format!("containers-storage:{image}");
        output(Command::new("podman").args(["manifest", "add", &tag, &image]))?;
    }
    let arches: Vec<&str> = tarballs.iter().map(|(t, _)| t.debian).collect();
    println!(
        "{tag}: a manifest list of {} ({}); push it with `podman manifest push --all {tag} docker://REGISTRY/mmaplock-prof:VERSION`",
        images.join(", "),
        arches.join(", ")
    );
    Ok(tag)
}

/// Builds the image of `target` from `tarball` as `tag` (default
/// `localhost/mmaplock-prof:VERSION`); the tag.
pub fn build(tarball: &Path, tag: Option<&str>, target: Target) -> Result<String> {
    let root = workspace_root();
    let ctx = root.join("target/image-build");
    let _ = fs::remove_dir_all(&ctx);
    fs::create_dir_all(&ctx)?;
    run(Command::new("tar")
        .arg("-C")
        .arg(&ctx)
        .arg("-xzf")
        .arg(tarball))?;
    let name = tarball
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_suffix(".tar.gz"))
        .context("a tarball named NAME.tar.gz")?;
    let unpacked = ctx.join(name);
    let version = name
        .strip_prefix("mmaplock-prof-")
        .and_then(|r| r.split('-').next())
        .context("mmaplock-prof-VERSION-...")?
        .to_string();
    let rootfs = ctx.join("rootfs");
    let bin = rootfs.join("usr/bin/mmaplock-prof");
    fs::create_dir_all(bin.parent().unwrap())?;
    fs::rename(unpacked.join("bin/mmaplock-prof"), &bin)?;
    for lib in linked_files(&output(&mut crate::dist::ldd(&bin, target))?) {
        let at = in_image(&lib, target);
        let dest = rootfs.join(at.strip_prefix("/").unwrap_or(&at));
        fs::create_dir_all(dest.parent().unwrap())?;
        // The file, not the host's link to it.
        fs::copy(&lib, &dest).with_context(|| format!("copy {}", lib.display()))?;
    }
    fs::create_dir_all(rootfs.join("tmp"))?;
    run(Command::new("chmod").arg("1777").arg(rootfs.join("tmp")))?;
    if !target.is_host() {
        runs_in(&rootfs, target, &version)?;
    }
    let tag = tag.map_or_else(
        || format!("localhost/mmaplock-prof:{version}"),
        str::to_string,
    );
    let before = image_id(&tag);
    run(Command::new("podman")
        .args([
            "build",
            "--quiet",
            "--format",
            "oci",
            "--pull=never",
            // FROM scratch and COPY: nothing runs, no emulation needed for another arch.
            "--platform",
            &format!("linux/{}", target.debian),
            "--tag",
        ])
        .arg(&tag)
        .args([
            "--label",
            "org.opencontainers.image.title=mmaplock-prof",
            "--label",
        ])
        .arg(format!("org.opencontainers.image.version={version}"))
        .arg("--file")
        .arg(root.join("deploy/container/Containerfile"))
        .arg(&ctx))?;
    let after = image_id(&tag).context("the image was not built")?;
    // The image this tag named before is of no more use (the tests rebuild theirs each run).
    if let Some(old) = before.filter(|b| *b != after) {
        let _ = output(Command::new("podman").args(["rmi", &old]));
    }
    let _ = fs::remove_dir_all(&ctx);
    let arch = output(Command::new("podman").args([
        "image",
        "inspect",
        "--format",
        "{{.Architecture}}",
        &tag,
    ]))?;
    if arch.trim() != target.debian {
        anyhow::bail!("{tag} was built for {}, not {}", arch.trim(), target.debian);
    }
    let size =
        output(Command::new("podman").args(["image", "inspect", "--format", "{{.Size}}", &tag]))?;
    println!("{tag} ({} bytes): {}", size.trim(), tarball.display());
    Ok(tag)
}

/// The image's root file system runs its binary for another architecture under qemu-user,
/// with nothing but the image's own files (its loader, at the path the binary names, and its
/// C library, where that loader looks): what a host of that architecture will do.
fn runs_in(rootfs: &Path, target: Target, version: &str) -> Result<()> {
    let out = output(
        Command::new(crate::cross::qemu_user(target))
            .arg("-L")
            .arg(rootfs)
            .arg(rootfs.join("usr/bin/mmaplock-prof"))
            .arg("--version"),
    )
    .with_context(|| {
        format!(
            "the {} image's binary does not run from its own files",
            target.debian
        )
    })?;
    if out.trim() != format!("mmaplock-prof {version}") {
        anyhow::bail!("the {} image's binary says {out:?}", target.debian);
    }
    Ok(())
}

/// Where a library `ldd` found at `lib` goes in the image: where it is for the host's own
/// architecture; for another, from the cross packages' directory
/// (`/usr/aarch64-linux-gnu/lib/libc.so.6`) to where that architecture's Debian keeps it
/// (`/lib/aarch64-linux-gnu/libc.so.6`, its loader at `/lib/ld-linux-aarch64.so.1`: the
/// cross packages are Debian's own arm64 builds, whose loader looks there).
fn in_image(lib: &Path, target: Target) -> PathBuf {
    if target.is_host() {
        return lib.to_path_buf();
    }
    let Some(name) = lib
        .strip_prefix(target.sysroot_lib())
        .ok()
        .and_then(|r| r.to_str())
    else {
        return lib.to_path_buf();
    };
    if name.starts_with("ld-linux") {
        Path::new("/lib").join(name)
    } else {
        Path::new("/lib").join(target.gnu).join(name)
    }
}

fn image_id(tag: &str) -> Option<String> {
    output(Command::new("podman").args(["image", "inspect", "--format", "{{.Id}}", tag]))
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn arm64_libraries_go_where_debian_arm64_keeps_them() {
        let arm = crate::cross::AARCH64;
        assert_eq!(
            in_image(Path::new("/usr/aarch64-linux-gnu/lib/libc.so.6"), arm),
            Path::new("/lib/aarch64-linux-gnu/libc.so.6")
        );
        assert_eq!(
            in_image(
                Path::new("/usr/aarch64-linux-gnu/lib/ld-linux-aarch64.so.1"),
                arm
            ),
            Path::new("/lib/ld-linux-aarch64.so.1")
        );
        let host = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
        assert_eq!(in_image(host, crate::cross::X86_64), host);
        assert_eq!(
            default_tag(Path::new("/t/mmaplock-prof-0.1.0-aarch64-linux.tar.gz")).unwrap(),
            "localhost/mmaplock-prof:0.1.0"
        );
    }
}
