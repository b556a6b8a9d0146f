//! A kernel booted under QEMU with virtme-ng (PyPI, in a virtualenv of the project's own):
//! the host's root file system, read-only with a writable overlay, and one shared directory
//! (`--rwdir`) through which a script's results come back. KVM where it runs a guest, TCG
//! otherwise, decided by trying: /dev/kvm may exist and still hang or abort the guest.

use std::{
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};

use super::fetch::Fetched;
use crate::packages;

const VIRTME_NG: &str = "virtme-ng==1.42";

/// How the guests run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accel {
    Kvm,
    Tcg,
}

impl std::fmt::Display for Accel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Accel::Kvm => "KVM",
            Accel::Tcg => "TCG",
        })
    }
}

/// virtme-ng and what it runs: Debian's QEMU, busybox (its initramfs) and kmod (depmod for
/// the unpacked modules), installed when missing. The virtualenv's bin directory.
pub fn ensure_virtme_ng() -> Result<PathBuf> {
    packages::ensure("qemu-system-x86", &["/usr/bin/qemu-system-x86_64"])?;
    packages::ensure("busybox-static", &["/bin/busybox"])?;
    packages::ensure("kmod", &["/sbin/depmod"])?;
    let venv = packages::cache_dir("virtme-ng").join("venv");
    let bin = venv.join("bin");
    if !bin.join("vng").exists() {
        eprintln!(
            "xtask: installing {VIRTME_NG} (PyPI) into {}",
            venv.display()
        );
        crate::run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
        crate::run(
            Command::new(bin.join("pip"))
                .args(["install", "--quiet", "--disable-pip-version-check"])
                .arg(VIRTME_NG),
        )?;
    }
    Ok(bin)
}

/// A guest run: `command` inside `kernel`, `rwdir` shared read-write; the guest is killed
/// after `limit`. Whether it came back within it (the caller reads what the command wrote).
pub fn run(
    venv_bin: &Path,
    kernel: &Fetched,
    accel: Accel,
    rwdir: &Path,
    command: &str,
    limit: Duration,
) -> Result<bool> {
    let log = std::fs::File::create(rwdir.join("console.log"))?;
    let mut cmd = Command::new(venv_bin.join("vng"));
    let path = std::env::var("PATH").unwrap_or_default();
    cmd.env("PATH", format!("{}:{path}", venv_bin.display()))
        .arg("--run")
        .arg(&kernel.vmlinuz)
        .args(["--memory", "2G", "--cpus", "2"])
        .arg(format!("--rwdir={}", rwdir.display()))
        .args(["--exec", command])
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        // Its own process group: a timeout kills QEMU with it.
        .process_group(0);
    if accel == Accel::Tcg {
        cmd.arg("--disable-kvm");
    }
    let mut child = cmd.spawn().context("cannot run vng")?;
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait()?.is_some() {
            // vng's own status says little (255 after a clean power-off): the command's
            // results are in the rwdir.
            return Ok(true);
        }
        if Instant::now() > deadline {
            // SAFETY: kill has no preconditions; the group is the guest's alone.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// KVM if a guest comes up under it within a short time, else TCG. Tried once per run, with
/// the first kernel at hand.
pub fn choose_accel(venv_bin: &Path, kernel: &Fetched, scratch: &Path) -> Result<Accel> {
    if !Path::new("/dev/kvm").exists() {
        return Ok(Accel::Tcg);
    }
    std::fs::create_dir_all(scratch)?;
    let marker = scratch.join("up");
    let _ = std::fs::remove_file(&marker);
    let cmd = format!("uname -r > {}", marker.display());
    let came_back = run(
        venv_bin,
        kernel,
        Accel::Kvm,
        scratch,
        &cmd,
        Duration::from_secs(30),
    )?;
    let up =
        came_back && std::fs::read_to_string(&marker).is_ok_and(|r| r.trim() == kernel.release);
    Ok(if up { Accel::Kvm } else { Accel::Tcg })
}
