//! What `ldd` says a binary links. Shared by xtask (the project's image) and the tests'
//! harness (the node image of the container tests), which takes this file in as a module of
//! its own (`#[path]`): a build tool and a test harness do not depend on each other.

use std::path::PathBuf;

/// The files `ldd` names (libraries and the loader), as paths on this host.
pub fn linked_files(ldd: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = ldd
        .lines()
        .filter_map(|l| {
            let path = match l.split_once("=>") {
                Some((_, right)) => right.split_whitespace().next()?,
                None => l.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// What `ldd` prints for a binary that links glibc only (the vDSO, GCC's unwinder, libm, libc
/// and the loader), for the tests.
#[cfg(test)]
pub const GLIBC_BINARY_LDD: &str = "\tlinux-vdso.so.1 (0x00007ffc3a5f2000)\n\
    \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f1)\n\
    \tlibm.so.6 => /lib/x86_64-linux-gnu/libm.so.6 (0x00007f2)\n\
    \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f3)\n\
    \t/lib64/ld-linux-x86-64.so.2 (0x00007f4)\n";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loader_and_libraries_are_taken_from_ldd() {
        assert_eq!(
            linked_files(GLIBC_BINARY_LDD),
            [
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib/x86_64-linux-gnu/libgcc_s.so.1"),
                PathBuf::from("/lib/x86_64-linux-gnu/libm.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
            ]
        );
    }
}
