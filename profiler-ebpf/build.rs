//! Rebuild the eBPF object when bpf-linker changes (for example after `cargo xtask` rebuilt it
//! for a new nightly's LLVM), since cargo does not track the linker.
fn main() {
    match which::which("bpf-linker") {
        Ok(path) => println!("cargo:rerun-if-changed={}", path.display()),
        Err(_) => println!("cargo:warning=bpf-linker not on PATH: run `cargo xtask bootstrap`"),
    }
}
