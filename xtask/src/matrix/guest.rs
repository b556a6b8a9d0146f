//! A kernel booted under QEMU with virtme-ng (PyPI, in a virtualenv of the project's own):
//! the host's root file system, read-only with a writable overlay, and one shared directory
//! (`--rwdir`) through which a script's results come back. KVM where it runs a guest, TCG
//! otherwise, decided by trying once per machine: /dev/kvm may exist and still hang or abort
//! the guest.

use std::{
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};

use super::{fetch::Fetched, watch::Killed};
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

/// The guests' memory: the tests' largest load (Node, the profiler and a helper) fits in
/// a quarter of it.
const MEMORY: &str = "2G";

/// How a guest run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ended {
    /// It powered off (or crashed: `crash_line`); what its command did is in the rwdir.
    Exited,
    /// Its watch killed it.
    Killed(Killed),
}

/// A guest run: `command` inside `kernel`, `rwdir` shared read-write, on one vCPU; `watch`
/// is asked every 200 ms whether the guest must be killed.
pub fn run(
    venv_bin: &Path,
    kernel: &Fetched,
    accel: Accel,
    cpus: u32,
    rwdir: &Path,
    command: &str,
    watch: &mut dyn FnMut(Instant) -> Option<Killed>,
) -> Result<Ended> {
    let log = std::fs::File::create(rwdir.join("console.log"))?;
    let mut cmd = Command::new(venv_bin.join("vng"));
    let path = std::env::var("PATH").unwrap_or_default();
    cmd.env("PATH", format!("{}:{path}", venv_bin.display()))
        .arg("--run")
        .arg(&kernel.vmlinuz)
        // The kernel's vCPUs (`Kernel::cpus`): one where it can, since the guests run side
        // by side, one host core each at best, and a single vCPU has no other CPU to see
        // a half-patched text (under QEMU's multi-threaded TCG Linux 7.3 died at an `int3`
        // of its own live patching, `crash_line`); two for Linux 7.x, whose tracepoint
        // programs run preemptible: on one vCPU both copies of a program were skipped
        // often enough to lose a test's exits and acquisitions (`lost.nested`), a
        // one-CPU limit the crash's second boot costs less than.
        .args(["--memory", MEMORY, "--cpus", &cpus.to_string()])
        .arg(format!("--rwdir={}", rwdir.display()))
        // The kernel's own console in console.log, and any oops a panic that ends the guest
        // at once: an emulated guest kernel can crash on its own (`crash_line`), and a test
        // left running on a broken kernel would hang until its limit.
        .args(["--verbose", "--append", "oops=panic"])
        .args(["--exec", command])
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    if accel == Accel::Tcg {
        cmd.arg("--disable-kvm");
    }
    supervise(&mut cmd, watch)
}

/// Runs a guest's command (in a process group of its own) until it exits, or until `watch`,
/// asked every 200 ms, says it must be killed.
pub fn supervise(
    cmd: &mut Command,
    watch: &mut dyn FnMut(Instant) -> Option<Killed>,
) -> Result<Ended> {
    // Its own process group: a kill takes QEMU (and vng's other children) with it.
    let mut child = cmd
        .process_group(0)
        .spawn()
        .with_context(|| format!("cannot run {:?}", cmd.get_program()))?;
    loop {
        if child.try_wait()?.is_some() {
            // The guest's own status says little (vng's is 255 after a clean power-off):
            // the command's results are in the rwdir.
            return Ok(Ended::Exited);
        }
        if let Some(killed) = watch(Instant::now()) {
            // SAFETY: kill has no preconditions; the group is the guest's alone.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            return Ok(Ended::Killed(killed));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The first line of a guest kernel's crash in its console, if it crashed. With two vCPUs
/// under TCG (QEMU 7.2's multi-threaded emulation) Linux 7.3 died now and then at an `int3`
/// of its own live code patching (a static key flipped while the other vCPU ran that code),
/// at boot or when a tracepoint was enabled: the emulator's fault, not the profiler's. The
/// guests now have one vCPU, and any crash still boots the kernel once more. This line tells
/// a crashed kernel from a failed test, not whose fault the crash was: a crash the profiler
/// caused would crash the second boot too, and both boots' lines would be in the report.
pub fn crash_line(console: &str) -> Option<String> {
    // With `oops=panic` every crash ends in a panic; a warning the guest survives (a soft
    // lockup under slow emulation, `BUG: soft lockup`) is not one. The crash's first line
    // says more than the panic's.
    const FIRST: [&str; 3] = ["Oops:", "kernel BUG at", "general protection fault"];
    let panic = console
        .lines()
        .find(|l| l.contains("Kernel panic - not syncing"))?;
    let first = console
        .lines()
        .find(|l| FIRST.iter().any(|s| l.contains(s)))
        .unwrap_or(panic);
    Some(first.trim().to_string())
}

/// KVM if a guest comes up under it within a short time, else TCG. Tried with the first
/// kernel at hand, once per machine: the verdict is kept in `~/.cache/mmaplock-prof/matrix`
/// with what it depends on (the host's kernel and CPU, QEMU's and virtme-ng's versions), and
/// tried again when any of them changed. Where /dev/kvm exists and cannot run a guest (QEMU
/// aborts on an MSR on this machine kind), the trial was a boot of its own in every run.
pub fn choose_accel(venv_bin: &Path, kernel: &Fetched, scratch: &Path) -> Result<Accel> {
    if !Path::new("/dev/kvm").exists() {
        return Ok(Accel::Tcg);
    }
    let cache = packages::cache_dir("matrix").join("kvm-verdict");
    let key = machine_key();
    if let Some(a) = std::fs::read_to_string(&cache)
        .ok()
        .and_then(|c| cached_verdict(&c, &key))
    {
        return Ok(a);
    }
    std::fs::create_dir_all(scratch)?;
    let marker = scratch.join("up");
    let _ = std::fs::remove_file(&marker);
    let cmd = format!("uname -r > {}", marker.display());
    let deadline = Instant::now() + Duration::from_secs(30);
    let ended = run(venv_bin, kernel, Accel::Kvm, 1, scratch, &cmd, &mut |now| {
        (now > deadline).then(|| Killed {
            step: None,
            why: "no KVM guest within 30 s".into(),
        })
    })?;
    let up = ended == Ended::Exited
        && std::fs::read_to_string(&marker).is_ok_and(|r| r.trim() == kernel.release);
    let accel = if up { Accel::Kvm } else { Accel::Tcg };
    if let Some(dir) = cache.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&cache, format!("{key}\n{accel}\n"))?;
    Ok(accel)
}

/// What a KVM verdict holds for: the host's kernel and CPU, QEMU, virtme-ng.
fn machine_key() -> String {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("model name"))
        .unwrap_or_default()
        .to_string();
    let qemu = Command::new("qemu-system-x86_64")
        .arg("--version")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .unwrap_or_default()
                .to_string()
        })
        .unwrap_or_default();
    format!("{} | {cpu} | {qemu} | {VIRTME_NG}", release.trim()).replace('\n', " ")
}

/// The verdict cached for `key`, if the cache holds one for it.
fn cached_verdict(cache: &str, key: &str) -> Option<Accel> {
    let mut lines = cache.lines();
    if lines.next()? != key {
        return None;
    }
    match lines.next()? {
        "KVM" => Some(Accel::Kvm),
        "TCG" => Some(Accel::Tcg),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On the console of a 7.3.4 guest that died at boot under TCG, and of one that did not.
    #[test]
    fn a_kvm_verdict_holds_for_its_machine_only() {
        let key = "6.18.1 | model name : AMD EPYC | QEMU emulator version 7.2.15 | virtme-ng==1.42";
        let cache = format!("{key}\nTCG\n");
        assert_eq!(cached_verdict(&cache, key), Some(Accel::Tcg));
        assert_eq!(
            cached_verdict(&cache, "6.19.0 | model name : AMD EPYC"),
            None
        );
        assert_eq!(
            cached_verdict(&format!("{key}\nKVM"), key),
            Some(Accel::Kvm)
        );
        assert_eq!(cached_verdict(&format!("{key}\n"), key), None);
        assert!(!machine_key().contains('\n'));
    }

    #[test]
    fn a_crashed_guest_kernel_is_told_from_a_clean_power_off() {
        let crashed = "[    1.454056] VFS: Dquot-cache hash table entries: 512 (4096 bytes)\n\
            [    1.455854] Oops: int3: 0000 [#1] SMP NOPTI\n\
            [    1.456445] CPU: 1 UID: 0 PID: 48 Comm: kworker/1:1 Not tainted 7.3.4+deb13-amd64 #1\n\
            [    1.457232] RIP: 0010:set_next_task_fair+0x609/0x780\n\
            [    1.457232] Kernel panic - not syncing: Fatal exception in interrupt\n";
        assert_eq!(
            crash_line(crashed).as_deref(),
            Some("[    1.455854] Oops: int3: 0000 [#1] SMP NOPTI")
        );
        let clean = "[    1.443983] PCI: Using host bridge windows from ACPI; if necessary, use \"pci=nocrs\" and report a bug\n\
            [    6.304595] virtme-ng-init: script exited with code 0\n\
            [    6.311590] reboot: Power down\n";
        assert_eq!(crash_line(clean), None);
        let survived = "[   40.1] watchdog: BUG: soft lockup - CPU#1 stuck for 23s! [node:812]\n\
            [   61.2] virtme-ng-init: script exited with code 0\n";
        assert_eq!(crash_line(survived), None);
        let sysrq = "[    8.517120] Kernel panic - not syncing: sysrq triggered crash\n";
        assert_eq!(
            crash_line(sysrq).as_deref(),
            Some("[    8.517120] Kernel panic - not syncing: sysrq triggered crash")
        );
    }
}
