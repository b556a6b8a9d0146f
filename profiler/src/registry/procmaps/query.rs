//! `PROCMAP_QUERY` (Linux 6.11+): the one mapping that covers an address, asked of an open
//! `/proc/PID/maps` with an ioctl instead of reading the whole map. What each costs the
//! target's `mmap_lock`:
//! - reading the map: one read acquisition per `read()` (about a page of lines) until 6.16;
//!   none from 6.17 (per-VMA locks; the lock only when a mapping being changed is met);
//! - a query: one read acquisition on 6.11 to 6.16; none from 6.17 (same fallback).
//!
//! Before 6.11 the file has no ioctl (ENOTTY): [`supported`] says so once for the run.

use std::{fs::File, io, os::fd::AsRawFd, path::PathBuf, sync::OnceLock};

use super::Mapping;

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
const VMA_EXECUTABLE: u64 = 0x04;
/// Longest name asked for (the kernel's PATH_MAX).
const NAME_MAX: usize = 4096;

/// `/proc/PID/maps`, opened once: reading it again and asking it go through this descriptor
/// (opening takes no lock, but a reused pid would name another process's map).
pub struct MapsFile(File);

impl MapsFile {
    pub fn open(pid: u32) -> io::Result<Self> {
        File::open(format!("/proc/{pid}/maps")).map(MapsFile)
    }

    /// The mapping that covers `addr` (Ok(None): none does). An error of ENOTTY or EINVAL
    /// means a kernel without the query (see [`supported`]).
    pub fn query(&self, addr: u64) -> io::Result<Option<Mapping>> {
        let mut name = vec![0u8; NAME_MAX];
        let mut q = ProcmapQuery {
            size: std::mem::size_of::<ProcmapQuery>() as u64,
            query_addr: addr,
            vma_name_size: NAME_MAX as u32,
            vma_name_addr: name.as_mut_ptr() as u64,
            ..Default::default()
        };
        // SAFETY: `q` is a live `struct procmap_query` of the size it says, and its name
        // buffer, which outlives the call, is `vma_name_size` bytes long; no build id is asked.
        let r = unsafe { libc::ioctl(self.0.as_raw_fd(), PROCMAP_QUERY as _, &mut q) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ENOENT) => Ok(None),
                _ => Err(e),
            };
        }
        // The kernel sets the name's length, its NUL included (0: no name).
        let len = (q.vma_name_size as usize).min(NAME_MAX);
        let text = String::from_utf8_lossy(&name[..len]);
        let text = text.trim_end_matches('\0');
        Ok(Some(mapping(&q, text)))
    }
}

/// The mapping a query found, as a line of the map would give it.
fn mapping(q: &ProcmapQuery, name: &str) -> Mapping {
    let path = (q.inode != 0 && name.starts_with('/'))
        .then(|| PathBuf::from(name.strip_suffix(" (deleted)").unwrap_or(name)));
    Mapping {
        start: q.vma_start,
        end: q.vma_end,
        exec: q.vma_flags & VMA_EXECUTABLE != 0,
        offset: q.vma_offset,
        // As the map prints it: "%02x:%02x".
        dev: format!("{:02x}:{:02x}", q.dev_major, q.dev_minor),
        inode: q.inode,
        label: if path.is_none() {
            name.to_owned()
        } else {
            String::new()
        },
        path,
    }
}

/// Whether this kernel answers `PROCMAP_QUERY`: asked once, of our own map, for our own code.
pub fn supported() -> bool {
    static SUPPORTED: OnceLock<bool> = OnceLock::new();
    *SUPPORTED.get_or_init(|| {
        let here = supported as *const () as u64;
        let answer = MapsFile::open(std::process::id()).and_then(|f| f.query(here));
        log::debug!("PROCMAP_QUERY: {answer:?}");
        matches!(answer, Ok(Some(m)) if m.start <= here && here < m.end)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::procmaps::Maps;

    /// Where the kernel has the query, it answers as the map reads: the same mapping for our
    /// code, and none for an address nothing maps. Where it has not (before 6.11), it says so
    /// with an error, never with an answer.
    #[test]
    fn a_query_finds_the_mapping_the_map_lists() {
        let me = std::process::id();
        let f = MapsFile::open(me).unwrap();
        let here = a_query_finds_the_mapping_the_map_lists as *const () as u64;
        match f.query(here) {
            Ok(found) => {
                assert!(supported());
                let maps = Maps::read(me).unwrap();
                assert_eq!(found.as_ref(), maps.find(here));
                assert_eq!(f.query(0x1000).unwrap(), None);
            }
            Err(e) => {
                assert!(!supported());
                assert!(
                    matches!(e.raw_os_error(), Some(libc::ENOTTY | libc::EINVAL)),
                    "{e}"
                );
            }
        }
    }
}
