//! An arm64 guest, booted with QEMU directly (`qemu-system-aarch64 -M virt -cpu max`, TCG:
//! virtme-ng boots the host's own root file system, which an emulated arm64 kernel cannot
//! run). The kernel starts on `initramfs` (busybox and the 9p modules), which mounts the
//! shared directory and runs the boot script written there: the root file system of Debian's
//! arm64 packages (`rootfs`) read-only under a tmpfs overlay, the workspace and target
//! directories read-only at their host paths (the cross-built tests find their fixtures and
//! helpers where cargo put them), the shared directory read-write at its own, and then the
//! guest script.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::Result;

use super::{
    fetch::Fetched,
    guest::{Ended, supervise},
    initramfs::{MATRIX_TAG, NINEP},
    watch::Killed,
};
use crate::packages;

/// QEMU's arm64 system emulator (Debian's `qemu-system-arm`) and xz (the modules of Debian
/// 13's kernels are compressed), installed when missing.
pub fn ensure() -> Result<()> {
    packages::ensure("qemu-system-arm", &["/usr/bin/qemu-system-aarch64"])?;
    packages::ensure("xz-utils", &["/usr/bin/xz"])
}

/// The guests' memory, as the x86 guests'.
const MEMORY: &str = "2G";

/// What an arm64 guest boots: its kernel, the initramfs made for it, the root file system,
/// the directories it sees read-only at their host paths ([`shares`]), and its vCPUs.
pub struct Machine<'a> {
    pub kernel: &'a Fetched,
    pub initramfs: &'a Path,
    pub rootfs: &'a Path,
    pub shares: &'a [PathBuf],
    pub cpus: u32,
}

/// A guest run: `script` (a shell script's path, as the guest sees it) inside `m`, `rwdir`
/// shared read-write at its host path; its console in `rwdir/console.log`. `watch` is asked
/// every 200 ms whether the guest must be killed.
pub fn run(
    m: &Machine,
    rwdir: &Path,
    script: &Path,
    watch: &mut dyn FnMut(Instant) -> Option<Killed>,
) -> Result<Ended> {
    std::fs::write(
        rwdir.join("boot.sh"),
        boot_script(m.shares, &rwdir.canonicalize()?, script),
    )?;
    let log = std::fs::File::create(rwdir.join("console.log"))?;
    let mut cmd = Command::new("qemu-system-aarch64");
    cmd.args(["-M", "virt", "-m", MEMORY, "-smp", &m.cpus.to_string()])
        // Every feature QEMU emulates (pointer authentication, as on Graviton 3 and later,
        // included), with QEMU's own cheap signing algorithm: the architected one (QARMA)
        // makes every signed return several times slower to emulate.
        .args(["-cpu", "max,pauth-impdef=on"])
        // The console on stdout; no network, no default NIC (its boot ROM is not installed).
        .args(["-nographic", "-nic", "none"])
        // A panic (`oops=panic`: every oops) or a reboot ends QEMU at once, as a power-off.
        .arg("-no-reboot")
        .arg("-kernel")
        .arg(&m.kernel.vmlinuz)
        .arg("-initrd")
        .arg(m.initramfs)
        .args(["-append", "console=ttyAMA0 panic=-1 oops=panic"]);
    let mut fs = |tag: &str, path: &Path, readonly: bool| {
        let ro = if readonly { ",readonly=on" } else { "" };
        cmd.arg("-fsdev").arg(format!(
            "local,id={tag},path={},security_model=none{ro}",
            path.display()
        ));
        cmd.arg("-device")
            .arg(format!("virtio-9p-pci,fsdev={tag},mount_tag={tag}"));
    };
    fs(MATRIX_TAG, rwdir, false);
    fs(ROOT_TAG, m.rootfs, true);
    for (i, s) in m.shares.iter().enumerate() {
        fs(&share_tag(i), s, true);
    }
    cmd.stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    supervise(&mut cmd, watch)
}

const ROOT_TAG: &str = "root";

fn share_tag(i: usize) -> String {
    format!("share{i}")
}

/// The directories a guest must see at their host paths: the workspace (the tests' fixtures,
/// named at build time) and the target directory, when it is elsewhere (a link, or
/// `CARGO_TARGET_DIR`); canonical, parents first.
pub fn shares() -> Result<Vec<PathBuf>> {
    let root = crate::workspace_root().canonicalize()?;
    let target = crate::target_dir().canonicalize()?;
    let mut shares = vec![root.clone()];
    if !target.starts_with(&root) {
        shares.push(target);
    }
    Ok(shares)
}

/// The script the initramfs hands over to (busybox's shell, in the initramfs): the root file
/// system read-only under a writable tmpfs layer, the shares, the shared directory moved to
/// its host path, then the new root's shell runs `script` and powers the guest off.
fn boot_script(shares: &[PathBuf], rwdir: &Path, script: &Path) -> String {
    let mut s = format!(
        "# Written by cargo xtask's kernel matrix; run by the arm64 guest's initramfs.\n\
         say() {{ echo \"matrix-boot: $*\"; }}\n\
         mount -t 9p -o {NINEP},ro,cache=loose {ROOT_TAG} /lower || say 'cannot mount the root file system'\n\
         mount -t tmpfs -o mode=0755 tmpfs /upper && mkdir /upper/data /upper/work\n\
         mount -t overlay -o lowerdir=/lower,upperdir=/upper/data,workdir=/upper/work overlay /newroot \
         || say 'cannot mount the overlay'\n"
    );
    for (i, p) in shares.iter().enumerate() {
        s.push_str(&format!(
            "mkdir -p /newroot{p} && mount -t 9p -o {NINEP},ro,cache=loose {tag} /newroot{p} \
             || say 'cannot mount {p}'\n",
            p = p.display(),
            tag = share_tag(i),
        ));
    }
    s.push_str(&format!(
        "mkdir -p /newroot{rw} && mount --move /matrix /newroot{rw} || say 'cannot move {rw}'\n\
         for d in proc sys dev; do mount --move /$d /newroot/$d; done\n\
         # Loopback up (the guest has no other network): the agent's tests scrape it there.\n\
         ip link set lo up || say 'cannot bring up the loopback interface'\n\
         # busybox's tools after the packages' own (the guest script's PATH ends with them).\n\
         mkdir -p /newroot/usr/local/busybox && /bin/busybox --install -s /newroot/usr/local/busybox\n\
         exec switch_root /newroot /bin/sh -c 'sh {script}; echo matrix-boot: powering off; busybox poweroff -f'\n",
        rw = rwdir.display(),
        script = script.display(),
    ));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_boot_script_mounts_each_share_at_its_path() {
        let s = boot_script(
            &[PathBuf::from("/w/repo"), PathBuf::from("/w/target")],
            Path::new("/w/target/matrix/arm64-6.1"),
            Path::new("/w/target/matrix/arm64-6.1/run.sh"),
        );
        assert!(
            s.contains("share0 /newroot/w/repo ||") && s.contains("share1 /newroot/w/target ||"),
            "{s}"
        );
        assert!(
            s.contains("mount --move /matrix /newroot/w/target/matrix/arm64-6.1"),
            "{s}"
        );
        assert!(
            s.contains("switch_root /newroot /bin/sh -c 'sh /w/target/matrix/arm64-6.1/run.sh;"),
            "{s}"
        );
        assert!(s.contains("ip link set lo up"), "{s}");
        // Parents before children: the shared directory is moved last.
        assert!(s.find("share1").unwrap() < s.find("--move /matrix").unwrap());
    }
}
