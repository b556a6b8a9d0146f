//! `cargo xtask image`: the agent's OCI image, built with podman from the dist tarball and
//! `deploy/container/Containerfile` (`FROM scratch`): the tarball's binary and the C library
//! it links, as `ldd` resolves them here (the dist step has checked that it links nothing
//! else). Nothing is fetched: no base image, no registry.

use std::{fs, path::Path, process::Command};

use anyhow::{Context as _, Result};

use crate::{ldd::linked_files, run, toolchain::output, workspace_root};

/// The tests' image (of the debug build), which `cargo xtask test` makes for tests/tests/image.rs.
pub const TEST_TAG: &str = "localhost/mmaplock-prof:test";

/// Builds the image from `tarball` as `tag` (default `localhost/mmaplock-prof:VERSION`); the tag.
pub fn build(tarball: &Path, tag: Option<&str>) -> Result<String> {
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
    for lib in linked_files(&output(Command::new("ldd").arg(&bin))?) {
        let dest = rootfs.join(lib.strip_prefix("/").unwrap_or(&lib));
        fs::create_dir_all(dest.parent().unwrap())?;
        // The file, not the host's link to it.
        fs::copy(&lib, &dest).with_context(|| format!("copy {}", lib.display()))?;
    }
    fs::create_dir_all(rootfs.join("tmp"))?;
    run(Command::new("chmod").arg("1777").arg(rootfs.join("tmp")))?;
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
    let size =
        output(Command::new("podman").args(["image", "inspect", "--format", "{{.Size}}", &tag]))?;
    println!("{tag} ({} bytes): {}", size.trim(), tarball.display());
    Ok(tag)
}

fn image_id(tag: &str) -> Option<String> {
    output(Command::new("podman").args(["image", "inspect", "--format", "{{.Id}}", tag]))
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}
