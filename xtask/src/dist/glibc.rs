//! What the packed binary needs of a host: glibc's own libraries and nothing else, and which
//! glibc at the oldest.

/// Shared libraries a glibc system always has: the C library and its parts, the dynamic
/// loader, the vDSO, and GCC's unwinder (which glibc itself loads for thread cancellation).
const GLIBC_LIBS: [&str; 9] = [
    "linux-vdso.so",
    "ld-linux-x86-64.so",
    "ld-linux-aarch64.so",
    "libc.so",
    "libm.so",
    "libpthread.so",
    "libdl.so",
    "librt.so",
    "libgcc_s.so",
];

/// The libraries `ldd` lists, by file name (`libc.so.6`, `ld-linux-x86-64.so.2`, ...).
pub fn shared_libraries(ldd: &str) -> Vec<String> {
    ldd.lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|l| l.contains(".so"))
        .map(|l| l.rsplit('/').next().unwrap_or(l).to_string())
        .collect()
}

/// The libraries that are not glibc's (nor the vDSO or libgcc_s).
pub fn non_glibc(libs: &[String]) -> Vec<String> {
    libs.iter()
        .filter(|l| !GLIBC_LIBS.iter().any(|g| l.starts_with(g)))
        .cloned()
        .collect()
}

/// The newest `GLIBC_x.y` symbol version that `objdump -T` shows: the oldest glibc that can
/// run the binary.
pub fn newest_glibc(objdump: &str) -> Option<(u32, u32)> {
    objdump
        .split(|c: char| c.is_whitespace() || c == '(' || c == ')')
        .filter_map(|w| w.strip_prefix("GLIBC_"))
        .filter_map(|v| {
            let mut it = v.split('.');
            let major = it.next()?.parse().ok()?;
            let minor = it.next().map_or(Some(0), |m| m.parse().ok())?;
            Some((major, minor))
        })
        .max()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output_is_checked_for_libraries_beyond_glibc() {
        let libs = shared_libraries(crate::ldd::GLIBC_BINARY_LDD);
        assert_eq!(
            libs,
            [
                "linux-vdso.so.1",
                "libgcc_s.so.1",
                "libm.so.6",
                "libc.so.6",
                "ld-linux-x86-64.so.2"
            ]
        );
        assert!(non_glibc(&libs).is_empty());
        let more = shared_libraries(
            "\tlibelf.so.1 => /lib/x86_64-linux-gnu/libelf.so.1 (0x1)\n\
             \tlibz.so.1 => not found\n\tlibc.so.6 => /lib/libc.so.6 (0x2)\n",
        );
        assert_eq!(non_glibc(&more), ["libelf.so.1", "libz.so.1"]);
    }

    #[test]
    fn the_newest_glibc_symbol_version_is_found() {
        let objdump = "0000000000000000      DF *UND*\t0000000000000000 (GLIBC_2.2.5) munmap\n\
                       0000000000000000      DF *UND*\t0000000000000000 (GLIBC_2.34) __libc_start_main\n\
                       0000000000000000      DF *UND*\t0000000000000000  GLIBC_2.28  statx\n\
                       0000000000000000  w   D  *UND*\t0000000000000000  Base        __gmon_start__\n";
        assert_eq!(newest_glibc(objdump), Some((2, 34)));
        assert_eq!(newest_glibc("no versions"), None);
    }
}
