//! Reading a glibc thread's start routine from outside: another process's memory (at the
//! offset `kernel::pthread` calibrates), and which C library a process maps. Thread roles
//! (`attribution`) are decided from what is read here.

use std::path::Path;
#[cfg(test)]
use std::path::PathBuf;

pub use crate::kernel::pthread::{read_memory, start_routine_offset};
use crate::registry::{procmaps::Maps, untrusted};

/// What makes two C libraries the same build, so that the start-routine offset calibrated on
/// ours applies to another process's: the ELF build id (a byte-identical copy in a container's
/// image is another file, on another device, but the same build), or, for a library built
/// without one, the very file (device, inode).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LibcIdentity {
    BuildId(Vec<u8>),
    File { dev: u64, inode: u64 },
}

/// The C library mapped into a process, identified by what it is rather than where it lies.
pub fn libc_identity(pid: u32, maps: &Maps) -> Option<LibcIdentity> {
    libc_identity_known(pid, maps, &mut KnownLibcs::new())
}

/// The identities of the C libraries already read, by the (device, inode) they were mapped
/// from: every process on a host maps the same one or two, and reading one is an open of the
/// target's file and a read of its notes.
pub type KnownLibcs = std::collections::HashMap<(String, u64), Option<LibcIdentity>>;

/// [`libc_identity`], read once per file mapped (`known`).
pub fn libc_identity_known(pid: u32, maps: &Maps, known: &mut KnownLibcs) -> Option<LibcIdentity> {
    let m = maps.iter().find(|m| {
        m.path
            .as_ref()
            .and_then(|p| p.file_name()?.to_str())
            .is_some_and(|name| name.starts_with("libc.so") || name.starts_with("libc-"))
    })?;
    let key = (m.dev.clone(), m.inode);
    if let Some(id) = known.get(&key) {
        return id.clone();
    }
    let path = m.path.as_ref()?;
    // Through /proc/PID/root, so that a process in another mount namespace (a container) is
    // read from its own file; no link followed on the way (a target's file:
    // registry::untrusted), and it must be the very inode the process mapped.
    let root = format!("/proc/{pid}/root{}", path.display());
    let id = file_identity(Path::new(&root), &untrusted::Policy::mapped(m.inode));
    // Not known when it could not be read (the process gone first): tried again.
    if id.is_some() {
        known.insert(key, id.clone());
    }
    id
}

/// The identity of the ELF file at `path` (opened under `policy`).
pub fn file_identity(path: &Path, policy: &untrusted::Policy) -> Option<LibcIdentity> {
    let o = untrusted::open(path, policy).ok()?;
    Some(match elf_build_id(&o.file) {
        Some(id) => LibcIdentity::BuildId(id),
        None => LibcIdentity::File {
            dev: o.dev,
            inode: o.inode,
        },
    })
}

/// The GNU build id (`NT_GNU_BUILD_ID` note) of an ELF file, read through its program
/// headers' notes (a few hundred bytes: the file is not read whole).
pub fn elf_build_id(file: &std::fs::File) -> Option<Vec<u8>> {
    use object::Object as _;
    let data = object::ReadCache::new(file);
    let elf = object::read::elf::ElfFile64::<object::Endianness, _>::parse(&data).ok()?;
    let id = elf.build_id().ok()??;
    (!id.is_empty()).then(|| id.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn our_libc() -> (PathBuf, LibcIdentity) {
        let maps = Maps::read(std::process::id()).unwrap();
        let id = libc_identity(std::process::id(), &maps).expect("our C library");
        let path = maps
            .iter()
            .filter_map(|m| m.path.clone())
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("libc.so") || n.starts_with("libc-"))
            })
            .unwrap();
        (path, id)
    }

    /// A byte-identical copy of our C library (as a container image holds it: another file,
    /// maybe on another device) is the same library; another library is not.
    #[test]
    fn a_copy_of_our_c_library_is_recognised_by_its_build_id() {
        let (path, ours) = our_libc();
        assert!(
            matches!(ours, LibcIdentity::BuildId(ref id) if id.len() >= 16),
            "Debian's glibc has a build id: {ours:?}"
        );
        let dir = tempfile::tempdir().unwrap();
        let copy = dir.path().join("libc.so.6");
        std::fs::copy(&path, &copy).unwrap();
        use std::os::unix::fs::MetadataExt as _;
        assert_ne!(
            std::fs::metadata(&path).unwrap().ino(),
            std::fs::metadata(&copy).unwrap().ino()
        );
        assert_eq!(
            file_identity(&copy, &untrusted::Policy::ELF).as_ref(),
            Some(&ours)
        );
        // Another library (another build id) is another C library.
        let libm = path.with_file_name("libm.so.6");
        if libm.exists() {
            let m = file_identity(&libm, &untrusted::Policy::ELF).unwrap();
            assert_ne!(m, ours);
        }
    }

    /// A file with no build id is identified by the file itself: two copies differ.
    #[test]
    fn without_a_build_id_the_file_itself_is_the_identity() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&a, b"not an ELF file").unwrap();
        std::fs::copy(&a, &b).unwrap();
        let (ia, ib) = (
            file_identity(&a, &untrusted::Policy::ELF).unwrap(),
            file_identity(&b, &untrusted::Policy::ELF).unwrap(),
        );
        assert!(matches!(ia, LibcIdentity::File { .. }), "{ia:?}");
        assert_ne!(ia, ib);
        assert_eq!(
            file_identity(&a, &untrusted::Policy::ELF),
            Some(ia),
            "the same file twice"
        );
    }
}
