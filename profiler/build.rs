//! Builds the eBPF programs (`profiler-ebpf`, nightly, bpfel target) with aya-build; the
//! object lands in OUT_DIR and is embedded by `collector` with `include_bytes_aligned!`.
//! Needs `bpf-linker` on PATH: `cargo xtask` puts the one it bootstraps there.
fn main() -> anyhow::Result<()> {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../profiler-ebpf");
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "profiler-ebpf",
            root_dir: root,
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    )
}
