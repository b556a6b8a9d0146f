//! Separate debug files: a distribution strips its libraries (libc's `.symtab` is gone, so
//! its internal functions, `start_thread` or the join path, would be bare addresses) and
//! ships their symbols apart (Debian's `libc6-dbg`, `*-dbgsym` packages), each named by the
//! file's GNU build id: `/usr/lib/debug/.build-id/93/ac61ec….debug`, where perf, gdb and
//! blazesym look. The build id names the exact build, so a container's library is named by
//! the host's debug file only when it is the very same build.
//!
//! A debug file keeps the code's virtual addresses but not its file offsets (its sections
//! hold no code), so it is looked up by virtual address (the frame's address less its
//! mapping's load bias), never by file offset.

use std::path::{Path, PathBuf};

/// Where debug files are looked for, in order (blazesym's and gdb's defaults).
pub const DEBUG_DIRS: [&str; 2] = ["/usr/lib/debug", "/lib/debug"];

/// The debug file of the build `build_id` under `dirs` (`DIR/.build-id/xx/rest.debug`), if
/// one is installed. A build id is the target's (untrusted): only its hex digits make the
/// path, so it cannot name a file elsewhere.
pub fn by_build_id(build_id: &[u8], dirs: &[impl AsRef<Path>]) -> Option<PathBuf> {
    if build_id.len() < 2 {
        return None;
    }
    let hex: String = build_id.iter().map(|b| format!("{b:02x}")).collect();
    let (head, rest) = hex.split_at(2);
    dirs.iter()
        .map(|d| {
            d.as_ref()
                .join(".build-id")
                .join(head)
                .join(format!("{rest}.debug"))
        })
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_debug_file_is_found_by_its_build_id_in_the_first_dir_that_has_it() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        let id = [0x93, 0xac, 0x61, 0xec];
        let at = |d: &Path| d.join(".build-id/93/ac61ec.debug");
        assert_eq!(by_build_id(&id, &[&a, &b]), None);
        std::fs::create_dir_all(at(&b).parent().unwrap()).unwrap();
        std::fs::write(at(&b), b"elf").unwrap();
        assert_eq!(by_build_id(&id, &[&a, &b]), Some(at(&b)));
        std::fs::create_dir_all(at(&a).parent().unwrap()).unwrap();
        std::fs::write(at(&a), b"elf").unwrap();
        assert_eq!(
            by_build_id(&id, &[&a, &b]),
            Some(at(&a)),
            "the first dir first"
        );
        assert_eq!(by_build_id(&[0x93], &[&a]), None, "too short to be an id");
    }
}
