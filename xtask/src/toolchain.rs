//! Makes sure the eBPF programs can be built: nightly with rust-src (for `-Z build-std=core`),
//! and a bpf-linker that uses the same LLVM as nightly's rustc. No LLVM package is needed:
//! bpf-linker is built against the libLLVM shared library that the nightly toolchain ships,
//! once per nightly, and cached outside the work tree (`$MMAPLOCK_PROF_CACHE`, else
//! `$XDG_CACHE_HOME/mmaplock-prof`, else `~/.cache/mmaplock-prof`).

use std::{
    fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

/// The bpf-linker release known to work with aya-ebpf 0.2 and LLVM 21 to 23.
const BPF_LINKER_VERSION: &str = "0.13.0";

/// Runs `cmd`; its standard output, or an error naming it with its standard error.
pub fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn rustup() -> Command {
    let mut c = Command::new("rustup");
    // Inside `cargo xtask` these would pin every rustup call to the stable toolchain.
    c.env_remove("RUSTUP_TOOLCHAIN");
    c
}

fn nightly_rustc(args: &[&str]) -> Result<String> {
    output(rustup().args(["run", "nightly", "rustc"]).args(args))
}

pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("MMAPLOCK_PROF_CACHE") {
        return PathBuf::from(d);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    base.join("mmaplock-prof")
}

fn ensure_nightly_with_rust_src() -> Result<()> {
    let toolchains = output(rustup().args(["toolchain", "list"]))?;
    if !toolchains.lines().any(|l| l.starts_with("nightly")) {
        eprintln!("xtask: installing the nightly toolchain (eBPF needs it)");
        crate::run(rustup().args([
            "toolchain",
            "install",
            "nightly",
            "--profile",
            "minimal",
            "--component",
            "rust-src",
        ]))?;
    }
    let installed =
        output(rustup().args(["component", "list", "--installed", "--toolchain", "nightly"]))?;
    if !installed.lines().any(|l| l.starts_with("rust-src")) {
        eprintln!("xtask: adding rust-src to nightly (needed for -Z build-std=core)");
        crate::run(rustup().args(["component", "add", "rust-src", "--toolchain", "nightly"]))?;
    }
    Ok(())
}

/// Nightly's LLVM: its major version and the shared library rustc ships.
fn nightly_llvm() -> Result<(u32, PathBuf)> {
    let vv = nightly_rustc(&["-vV"])?;
    let major: u32 = vv
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.trim().parse().ok())
        .context("no LLVM version in `rustc +nightly -vV`")?;
    let sysroot = PathBuf::from(nightly_rustc(&["--print", "sysroot"])?.trim());
    let lib_dir = sysroot.join("lib");
    let lib = fs::read_dir(&lib_dir)
        .with_context(|| format!("cannot list {}", lib_dir.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libLLVM.so.") && n.contains("-rust-"))
        })
        .with_context(|| {
            format!(
                "nightly ships no libLLVM.so.*-rust-* in {}",
                lib_dir.display()
            )
        })?;
    Ok((major, lib))
}

fn linker_works(bin: &Path) -> bool {
    Command::new(bin)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Ensures everything is installed; returns the directory holding `bpf-linker`.
pub fn bootstrap() -> Result<PathBuf> {
    ensure_nightly_with_rust_src()?;
    let (major, lib) = nightly_llvm()?;
    let lib_name = lib
        .file_name()
        .and_then(|n| n.to_str())
        .context("libLLVM file name")?;
    // e.g. libLLVM.so.22.1-rust-1.97.0-nightly -> llvm-22.1-rust-1.97.0-nightly
    let tag = format!("llvm-{}", lib_name.trim_start_matches("libLLVM.so."));
    let prefix = cache_dir().join("bpf-linker").join(tag);
    let bin_dir = prefix.join("bin");
    let bin = bin_dir.join("bpf-linker");
    if linker_works(&bin) {
        return Ok(bin_dir);
    }
    eprintln!(
        "xtask: building bpf-linker {BPF_LINKER_VERSION} against nightly's LLVM {major} into {} (once)",
        prefix.display()
    );
    let lib_out = prefix.join("lib");
    fs::create_dir_all(&lib_out).with_context(|| format!("cannot create {}", lib_out.display()))?;
    // llvm-sys links `libLLVM.so` from $LLVM_PREFIX/lib and records that directory as the
    // binary's runpath; at run time the binary asks for the library's own soname there.
    for name in ["libLLVM.so", lib_name] {
        let link = lib_out.join(name);
        let _ = fs::remove_file(&link);
        symlink(&lib, &link).with_context(|| format!("cannot link {}", link.display()))?;
    }
    let feature = format!("llvm-{major}");
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.env_remove("RUSTUP_TOOLCHAIN")
        .env("LLVM_PREFIX", &prefix)
        .args(["install", "--locked", "--force", "--root"])
        .arg(&prefix)
        .arg(format!("bpf-linker@{BPF_LINKER_VERSION}"))
        .args(["--no-default-features", "--features", &feature]);
    crate::run(&mut cmd).with_context(|| {
        format!("building bpf-linker (does bpf-linker {BPF_LINKER_VERSION} support LLVM {major}?)")
    })?;
    if !linker_works(&bin) {
        bail!("{} was built but does not run", bin.display());
    }
    Ok(bin_dir)
}
