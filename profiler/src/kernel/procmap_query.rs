//! `PROCMAP_QUERY` (Linux 6.11+): the one mapping that covers an address, asked of an open
//! `/proc/PID/maps` with an ioctl instead of reading the whole map (`registry::procmaps`
//! decides when). Whether the running kernel answers it is a probed feature (`features`).
//!
//! `MMAPLOCK_PROF_NO_PROCMAP_QUERY` (set, to anything) makes [`supported`] say no, so that a
//! test can run the fallback of older kernels (the whole map read again) on a newer one.

use std::{fs::File, io, os::fd::AsRawFd, sync::OnceLock};

/// `struct procmap_query` of `include/uapi/linux/fs.h` (104 bytes since 6.11).
#[repr(C)]
#[derive(Default)]
struct ProcmapQuery {
    size: u64,
    query_flags: u64,
    query_addr: u64,
    vma_start: u64,
    vma_end: u64,
    vma_flags: u64,
    vma_page_size: u64,
    vma_offset: u64,
    inode: u64,
    dev_major: u32,
    dev_minor: u32,
    vma_name_size: u32,
    build_id_size: u32,
    vma_name_addr: u64,
    build_id_addr: u64,
}

const _: () = assert!(std::mem::size_of::<ProcmapQuery>() == 104);

/// `_IOWR('f', 17, struct procmap_query)`.
const PROCMAP_QUERY: libc::c_ulong = (3 << 30) | (104 << 16) | ((b'f' as libc::c_ulong) << 8) | 17;
/// `PROCMAP_QUERY_VMA_EXECUTABLE`: asked, only executable mappings; answered, the flag.
const VMA_EXECUTABLE: u64 = 0x04;
/// `PROCMAP_QUERY_COVERING_OR_NEXT_VMA`: the mapping that covers the address, or else the
/// next one above it.
const COVERING_OR_NEXT: u64 = 0x10;
/// Longest name asked for (the kernel's PATH_MAX).
const NAME_MAX: usize = 4096;

/// A mapping as the query describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub start: u64,
    pub end: u64,
    pub exec: bool,
    pub offset: u64,
    pub dev: (u32, u32),
    pub inode: u64,
    /// Its name as the map prints it (a path, `[heap]`, empty).
    pub name: String,
}

/// The mapping of `maps` (an open `/proc/PID/maps`) that covers `addr` (Ok(None): none
/// does). An error of ENOTTY or EINVAL means a kernel without the query.
pub fn query(maps: &File, addr: u64) -> io::Result<Option<Answer>> {
    ask(maps, addr, 0, &mut vec![0u8; NAME_MAX])
}

/// Every executable mapping of `maps`, in address order: each asked for as the next one at
/// or after the end of the last. Without formatting the rest of the map (stacks, heaps,
/// guard pages: nine lines in ten of a node process's), nor the gate page (`[vsyscall]`,
/// not a mapping of the process's own). One read acquisition of the process's lock per
/// mapping on 6.11 to 6.16, none from 6.17.
pub fn executable(maps: &File) -> io::Result<Vec<Answer>> {
    let mut name = vec![0u8; NAME_MAX];
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(a) = ask(maps, from, COVERING_OR_NEXT | VMA_EXECUTABLE, &mut name)? {
        // A mapping ends past its start; an answer that did not move on ends the walk.
        if a.end <= from {
            break;
        }
        from = a.end;
        found.push(a);
    }
    Ok(found)
}

/// One query at `addr` with `flags`, the name read into `name` (`NAME_MAX` bytes).
fn ask(maps: &File, addr: u64, flags: u64, name: &mut [u8]) -> io::Result<Option<Answer>> {
    let mut q = ProcmapQuery {
        size: std::mem::size_of::<ProcmapQuery>() as u64,
        query_flags: flags,
        query_addr: addr,
        vma_name_size: name.len() as u32,
        vma_name_addr: name.as_mut_ptr() as u64,
        ..Default::default()
    };
    // SAFETY: `q` is a live `struct procmap_query` of the size it says, and its name
    // buffer, which outlives the call, is `vma_name_size` bytes long; no build id is asked.
    let r = unsafe { libc::ioctl(maps.as_raw_fd(), PROCMAP_QUERY as _, &mut q) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENOENT) => Ok(None),
            _ => Err(e),
        };
    }
    // The kernel sets the name's length, its NUL included (0: no name).
    let len = (q.vma_name_size as usize).min(name.len());
    let text = String::from_utf8_lossy(&name[..len]);
    Ok(Some(Answer {
        start: q.vma_start,
        end: q.vma_end,
        exec: q.vma_flags & VMA_EXECUTABLE != 0,
        offset: q.vma_offset,
        dev: (q.dev_major, q.dev_minor),
        inode: q.inode,
        name: text.trim_end_matches('\0').to_owned(),
    }))
}

/// Whether this kernel answers the query (and it is not turned off for a test): asked once,
/// of our own map, for our own code.
pub fn supported() -> bool {
    static SUPPORTED: OnceLock<bool> = OnceLock::new();
    *SUPPORTED.get_or_init(|| {
        if std::env::var_os("MMAPLOCK_PROF_NO_PROCMAP_QUERY").is_some() {
            log::debug!("PROCMAP_QUERY turned off (MMAPLOCK_PROF_NO_PROCMAP_QUERY)");
            return false;
        }
        let here = supported as *const () as u64;
        let answer = File::open("/proc/self/maps").and_then(|f| query(&f, here));
        log::debug!("PROCMAP_QUERY: {answer:?}");
        matches!(answer, Ok(Some(m)) if m.start <= here && here < m.end)
    })
}
