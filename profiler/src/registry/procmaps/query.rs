//! A process's `/proc/PID/maps`, opened once, asked for the one mapping that covers an
//! address (`PROCMAP_QUERY`, Linux 6.11+: `kernel::procmap_query`). What each read costs the
//! target's `mmap_lock`:
//! - reading the map: one read acquisition per `read()` (about a page of lines) until 6.16;
//!   none from 6.17 (per-VMA locks; the lock only when a mapping being changed is met);
//! - a query: one read acquisition on 6.11 to 6.16; none from 6.17 (same fallback).
//!
//! Before 6.11 the file has no ioctl (ENOTTY): [`supported`] says so once for the run.

use std::{fs::File, io, path::PathBuf};

pub use crate::kernel::procmap_query::supported;
use crate::kernel::procmap_query::{Answer, executable, query};

use super::Mapping;

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
        Ok(query(&self.0, addr)?.map(mapping))
    }

    /// Every executable mapping, in address order (see `procmap_query::executable`).
    pub fn executable(&self) -> io::Result<Vec<Mapping>> {
        Ok(executable(&self.0)?.into_iter().map(mapping).collect())
    }
}

/// The mapping a query found, as a line of the map would give it.
fn mapping(a: Answer) -> Mapping {
    let name = a.name;
    let path = (a.inode != 0 && name.starts_with('/'))
        .then(|| PathBuf::from(name.strip_suffix(" (deleted)").unwrap_or(&name)));
    Mapping {
        start: a.start,
        end: a.end,
        exec: a.exec,
        offset: a.offset,
        dev: super::dev_name(a.dev.0, a.dev.1),
        inode: a.inode,
        label: if path.is_none() { name } else { String::new() },
        path,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::procmaps::{Keep, Maps};

    /// Where the kernel has the query, it answers as the map reads: the same mapping for our
    /// code, and none for an address nothing maps. Where it has not (before 6.11), it says so
    /// with an error, never with an answer.
    #[test]
    fn a_query_finds_the_mapping_the_map_lists() {
        let me = std::process::id();
        let f = MapsFile::open(me).unwrap();
        let here = a_query_finds_the_mapping_the_map_lists as *const () as u64;
        let off = std::env::var_os("MMAPLOCK_PROF_NO_PROCMAP_QUERY").is_some();
        match f.query(here) {
            Ok(found) => {
                assert!(supported() || off);
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

    /// The executable mappings asked for one by one are the map's executable lines, the
    /// gate page (not a mapping of the process's) aside: path, device, inode, offset and
    /// range alike. Read twice until two reads agree (another test may map code meanwhile).
    #[test]
    fn the_executable_mappings_asked_for_are_the_maps_executable_lines() {
        if !supported() {
            eprintln!("skipped: no PROCMAP_QUERY here");
            return;
        }
        let me = std::process::id();
        let f = MapsFile::open(me).unwrap();
        let mut last = None;
        for _ in 0..5 {
            let asked = f.executable().unwrap();
            let listed: Vec<Mapping> = (Maps::read(me).unwrap().retain(Keep::Exec).iter())
                .filter(|m| m.label != "[vsyscall]")
                .cloned()
                .collect();
            if asked == listed {
                assert!(asked.iter().any(|m| m.path.is_some()), "{asked:?}");
                return;
            }
            last = Some((asked, listed));
        }
        panic!("asked and listed differ: {last:?}");
    }
}
