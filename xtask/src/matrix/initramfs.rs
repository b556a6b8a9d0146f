//! The arm64 guests' initramfs: busybox and the modules that the kernel needs to mount its
//! 9p shares (Debian builds virtio-pci, 9p and overlayfs as modules), with an `/init` that
//! loads them, mounts the shared directory and hands over to the boot script the host wrote
//! there (`qemu::boot_script`). Made for each boot from the kernel's own modules: a few MB,
//! in well under a second.

use std::{
    collections::BTreeSet,
    io::Write as _,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};
use cpio::newc;

/// The modules the boot needs (their dependencies are found in the modules themselves):
/// the PCI transport of the virtio devices, 9p over virtio, and overlayfs (a writable layer
/// over the read-only root file system).
const WANTED: [&str; 4] = ["virtio_pci", "9pnet_virtio", "9p", "overlay"];

/// The 9p tag of the guest's shared directory, which holds its boot script.
pub const MATRIX_TAG: &str = "matrix";

/// 9p mount options: a larger message size than the default 8 KiB reads the root file
/// system's large files (node, libLLVM) several times faster.
pub const NINEP: &str = "trans=virtio,version=9p2000.L,msize=512000";

/// Writes the initramfs for the kernel whose modules are in `modules` to `out`, with
/// `busybox` (a static arm64 build) as its only program.
pub fn write(modules: &Path, busybox: &Path, out: &Path) -> Result<()> {
    let order = load_order(modules)?;
    let mut init = String::from(
        "#!/bin/busybox sh\n\
         # Written by cargo xtask's kernel matrix: loads what the 9p shares need, then runs\n\
         # the boot script the host left in the shared directory.\n\
         /bin/busybox --install -s /bin\n\
         mount -t proc proc /proc\n\
         mount -t sysfs sysfs /sys\n\
         mount -t devtmpfs devtmpfs /dev\n",
    );
    for m in &order {
        init.push_str(&format!(
            "insmod /modules/{0}.ko || echo \"matrix-init: cannot load {0}\"\n",
            m.name
        ));
    }
    init.push_str(&format!(
        "mount -t 9p -o {NINEP} {MATRIX_TAG} /matrix && exec sh /matrix/boot.sh\n\
         echo \"matrix-init: no shared directory with a boot script\"\n\
         poweroff -f\n"
    ));
    let mut files: Vec<(String, u32, Vec<u8>)> = Vec::new();
    for d in [
        "bin", "dev", "proc", "sys", "modules", "matrix", "lower", "upper", "newroot",
    ] {
        files.push((d.into(), DIR | 0o755, Vec::new()));
    }
    let busybox =
        std::fs::read(busybox).with_context(|| format!("reading {}", busybox.display()))?;
    files.push(("bin/busybox".into(), FILE | 0o755, busybox));
    files.push(("init".into(), FILE | 0o755, init.into_bytes()));
    for m in order {
        files.push((format!("modules/{}.ko", m.name), FILE | 0o644, m.image));
    }
    let mut w = std::io::BufWriter::new(std::fs::File::create(out)?);
    for (ino, (name, mode, data)) in files.iter().enumerate() {
        let mut e = newc::Builder::new(name)
            .ino(ino as u32 + 1)
            .mode(*mode)
            .nlink(if mode & DIR != 0 { 2 } else { 1 })
            .write(&mut w, data.len() as u32);
        e.write_all(data)?;
        e.finish()?;
    }
    // The console the kernel opens for /init before any devtmpfs is mounted.
    newc::Builder::new("dev/console")
        .ino(files.len() as u32 + 1)
        .mode(CHAR | 0o600)
        .rdev_major(5)
        .rdev_minor(1)
        .write(&mut w, 0)
        .finish()?;
    newc::trailer(&mut w)?;
    w.flush()?;
    Ok(())
}

const DIR: u32 = 0o040000;
const FILE: u32 = 0o100000;
const CHAR: u32 = 0o020000;

/// A module to load, decompressed.
struct Module {
    name: String,
    image: Vec<u8>,
}

/// [`WANTED`] and what they depend on, each after its dependencies; those built into the
/// kernel (`modules.builtin`) are left out.
fn load_order(modules: &Path) -> Result<Vec<Module>> {
    let mut files = std::collections::BTreeMap::new();
    index(&modules.join("kernel"), &mut files)?;
    let builtin: BTreeSet<String> = std::fs::read_to_string(modules.join("modules.builtin"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| module_name(Path::new(l)))
        .collect();
    let mut order = Vec::new();
    let mut seen = BTreeSet::new();
    for m in WANTED {
        visit(m, &files, &builtin, &mut seen, &mut order)?;
    }
    Ok(order)
}

fn visit(
    name: &str,
    files: &std::collections::BTreeMap<String, PathBuf>,
    builtin: &BTreeSet<String>,
    seen: &mut BTreeSet<String>,
    order: &mut Vec<Module>,
) -> Result<()> {
    let name = name.replace('-', "_");
    if builtin.contains(&name) || !seen.insert(name.clone()) {
        return Ok(());
    }
    let path = files
        .get(&name)
        .with_context(|| format!("the kernel has no module {name}, built in or not"))?;
    let image = decompressed(path)?;
    for dep in depends(&image) {
        visit(&dep, files, builtin, seen, order)?;
    }
    order.push(Module { name, image });
    Ok(())
}

/// Every module file under `dir`, by module name.
fn index(dir: &Path, out: &mut std::collections::BTreeMap<String, PathBuf>) -> Result<()> {
    for e in std::fs::read_dir(dir).with_context(|| dir.display().to_string())? {
        let p = e?.path();
        if p.is_dir() {
            index(&p, out)?;
        } else if let Some(name) = module_name(&p) {
            out.insert(name, p);
        }
    }
    Ok(())
}

/// `kernel/fs/9p/9p.ko.xz` -> `9p`; modules are named with `_` where files have `-`.
fn module_name(p: &Path) -> Option<String> {
    let file = p.file_name()?.to_str()?;
    let stem = file.split_once(".ko").map(|(s, _)| s)?;
    Some(stem.replace('-', "_"))
}

/// The module's ELF image: as is, or decompressed with xz (Debian 13 ships `.ko.xz`).
fn decompressed(path: &Path) -> Result<Vec<u8>> {
    let name = path.to_string_lossy();
    if name.ends_with(".ko") {
        return Ok(std::fs::read(path)?);
    }
    if !name.ends_with(".ko.xz") {
        bail!("{name}: a module compressed otherwise than with xz");
    }
    let out = Command::new("xz")
        .arg("-dc")
        .arg(path)
        .output()
        .context("cannot run xz")?;
    if !out.status.success() {
        bail!(
            "xz -dc {name}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out.stdout)
}

/// The `depends=` field of a module's `.modinfo` (NUL-separated `key=value` strings).
fn depends(image: &[u8]) -> Vec<String> {
    let key = b"\0depends=";
    let Some(at) = image.windows(key.len()).position(|w| w == key) else {
        return Vec::new();
    };
    let value = &image[at + key.len()..];
    let end = value.iter().position(|&b| b == 0).unwrap_or(value.len());
    String::from_utf8_lossy(&value[..end])
        .split(',')
        .filter(|d| !d.is_empty())
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_modules_dependencies_are_read_from_its_modinfo() {
        let image = b"\x7fELF...\0license=GPL\0depends=9pnet,fscache,netfs\0intree=Y\0";
        assert_eq!(depends(image), ["9pnet", "fscache", "netfs"]);
        assert!(depends(b"\0license=GPL\0depends=\0name=x\0").is_empty());
        assert!(depends(b"no modinfo").is_empty());
    }

    #[test]
    fn module_names_are_the_files_stems() {
        assert_eq!(
            module_name(Path::new("kernel/fs/9p/9p.ko.xz")).as_deref(),
            Some("9p")
        );
        assert_eq!(
            module_name(Path::new("kernel/drivers/virtio/virtio_pci-legacy.ko")).as_deref(),
            Some("virtio_pci_legacy")
        );
        assert_eq!(module_name(Path::new("modules.dep")), None);
    }

    /// A tree of modules as Debian 12 ships them (uncompressed, some built in): each after
    /// its dependencies, the built-in ones left out.
    #[test]
    fn modules_load_after_their_dependencies() {
        let dir = std::env::temp_dir().join(format!("xtask-initramfs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let m = |path: &str, deps: &str| {
            let p = dir.join("kernel").join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, format!("ELF\0depends={deps}\0")).unwrap();
        };
        m("fs/9p/9p.ko", "9pnet,fscache,netfs");
        m("net/9p/9pnet.ko", "");
        m("net/9p/9pnet_virtio.ko", "9pnet");
        m("fs/fscache/fscache.ko", "netfs");
        m("fs/netfs/netfs.ko", "");
        m("fs/overlayfs/overlay.ko", "");
        std::fs::write(
            dir.join("modules.builtin"),
            "kernel/drivers/virtio/virtio_pci.ko\n",
        )
        .unwrap();
        let names: Vec<String> = load_order(&dir)
            .unwrap()
            .into_iter()
            .map(|m| m.name)
            .collect();
        assert_eq!(
            names,
            ["9pnet", "9pnet_virtio", "netfs", "fscache", "9p", "overlay"]
        );
        std::fs::remove_file(dir.join("kernel/fs/overlayfs/overlay.ko")).unwrap();
        let e = load_order(&dir).err().unwrap().to_string();
        assert!(e.contains("no module overlay"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
