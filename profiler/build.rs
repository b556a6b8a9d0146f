//! Builds the eBPF programs (`profiler-ebpf`, nightly, bpfel target) with aya-build; the
//! object lands in OUT_DIR and is embedded by `collector` with `include_bytes_aligned!`.
//! Needs `bpf-linker` on PATH: `cargo xtask` puts the one it bootstraps there.
//!
//! aya-build runs its cargo in a target directory under OUT_DIR, and OUT_DIR differs between
//! `cargo clippy`, `cargo build` and `cargo test` (each its own build script run): the same
//! eBPF object (core built from source included) would be built three times in the suite,
//! some 45 s each on 2 cores. That directory is made a link to one shared by every profile,
//! so the inner cargo finds its own fingerprints there and builds only what changed; it locks
//! the directory itself while it builds. It is one per source tree: git worktrees sharing a
//! target directory would otherwise share the uplifted object (`release/mmaplock`), which the
//! inner cargo does not copy again when its own build is fresh, and one tree's binary would
//! embed another's programs.
use std::path::{Path, PathBuf};

const PACKAGE: &str = "profiler-ebpf";

fn main() -> anyhow::Result<()> {
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    share_ebpf_target_dir(&out_dir)?;
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../profiler-ebpf");
    aya_build::build_ebpf(
        [aya_build::Package {
            name: PACKAGE,
            root_dir: root,
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    )
}

/// Links aya-build's target directory for [`PACKAGE`] (`OUT_DIR/aya-build/target/NAME`) to
/// `TARGET/aya-build/NAME-TREE`, TARGET being the directory that holds this profile's `build`
/// (`target`, or `target/TRIPLE`) and TREE a hash of this source tree's path. Left as it is
/// when OUT_DIR is not under a `build` directory (then aya-build builds in OUT_DIR, as it
/// would anyway).
fn share_ebpf_target_dir(out_dir: &Path) -> anyhow::Result<()> {
    let Some(target) = out_dir
        .ancestors()
        .find(|a| a.file_name().is_some_and(|n| n == "build"))
        .and_then(|build| build.parent()?.parent())
    else {
        return Ok(());
    };
    let tree = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        env!("CARGO_MANIFEST_DIR").hash(&mut h);
        h.finish()
    };
    let shared = target
        .join("aya-build")
        .join(format!("{PACKAGE}-{tree:016x}"));
    std::fs::create_dir_all(&shared)?;
    let parent = out_dir.join("aya-build").join("target");
    std::fs::create_dir_all(&parent)?;
    let link = parent.join(PACKAGE);
    match std::fs::read_link(&link) {
        Ok(to) if to == shared => Ok(()),
        _ => {
            // A directory or another link from an earlier run of this script: replaced.
            if link.is_dir() && !link.is_symlink() {
                std::fs::remove_dir_all(&link)?;
            } else {
                let _ = std::fs::remove_file(&link);
            }
            std::os::unix::fs::symlink(&shared, &link)?;
            Ok(())
        }
    }
}
