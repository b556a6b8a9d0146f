//! Files read on behalf of a target process are an adversary's data. The profiler runs as
//! root (or with CAP_DAC_READ_SEARCH and CAP_SYS_PTRACE), and what it reads for a target (its
//! perf map in a world-writable /tmp, its binaries through `/proc/PID/root`, a container's
//! files) may be planted by another local user or by the target itself. So every such file is
//! opened here, and only:
//!
//! - without following a symbolic link anywhere on its path (`openat2` with
//!   `RESOLVE_NO_SYMLINKS`; a path under `/proc/PID/root` is resolved inside that root with
//!   `RESOLVE_IN_ROOT`, so `..` cannot leave it): a link is refused, never followed;
//! - first as `O_PATH`, so that nothing is opened for reading before it is known to be a
//!   regular file (a FIFO would block the reader forever, a device could have side effects);
//! - with its owner checked when the caller says whose it must be;
//! - with its size bounded, and, for a mapped file, its identity (inode) checked against the
//!   mapping, so that a file replaced since it was mapped is not taken for it.
//!
//! Refusals that say something about the file (a link, not a regular file, another owner,
//! too large) are worth one warning on standard error per file ([`warn_once`]); a file that is
//! simply absent is not.
//!
//! How a path is resolved without following a link: `resolve`.

mod resolve;
#[cfg(test)]
mod tests;

use std::{
    collections::HashSet,
    fmt,
    fs::File,
    io,
    path::{Path, PathBuf},
    sync::Mutex,
};

use resolve::locate;
use rustix::fs::{self as rfs, FileType, Mode, OFlags};

/// The largest ELF file read for unwinding or symbolization: node is about 100 MB, a binary
/// with full debug info a few hundred; 2 GiB leaves room and refuses absurd (sparse) files.
pub const MAX_ELF_BYTES: u64 = 2 << 30;
/// The largest unwind section (`.eh_frame`, `.eh_frame_hdr`) copied into memory: node's is
/// under 3 MB.
pub const MAX_UNWIND_SECTION: u64 = 256 << 20;

/// Why a file was not read.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("it, or a directory on its path, is a symbolic link")]
    Symlink,
    #[error("it is not a regular file but a {0}")]
    NotRegular(&'static str),
    #[error("it is owned by uid {owner}, neither the process's user (uid {expected}) nor root")]
    Owner { owner: u32, expected: u32 },
    #[error("it is {size} bytes, more than the {max} read from such a file")]
    TooLarge { size: u64, max: u64 },
    #[error("it is not the file the process mapped (replaced since)")]
    NotMapped,
    #[error("its path leaves the process's root")]
    BadPath,
    #[error("{0}")]
    Io(#[source] io::Error),
}

impl Refused {
    /// Does the refusal say something about the file (worth a warning), rather than that it
    /// is not there or not readable to us?
    pub fn is_suspicious(&self) -> bool {
        matches!(
            self,
            Refused::Symlink
                | Refused::NotRegular(_)
                | Refused::Owner { .. }
                | Refused::TooLarge { .. }
                | Refused::BadPath
        )
    }

    pub fn is_not_found(&self) -> bool {
        matches!(self, Refused::Io(e) if e.kind() == io::ErrorKind::NotFound)
    }
}

impl From<rustix::io::Errno> for Refused {
    fn from(e: rustix::io::Errno) -> Self {
        match e {
            // RESOLVE_NO_SYMLINKS and O_NOFOLLOW say ELOOP; a link met where a directory was
            // expected (the component-wise fallback) says ENOTDIR.
            rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR => Refused::Symlink,
            rustix::io::Errno::XDEV => Refused::BadPath,
            e => Refused::Io(e.into()),
        }
    }
}

/// What a file must be to be read.
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    /// The uid that may own it besides root (None: any owner, e.g. a library the process
    /// mapped, whose identity is checked instead).
    pub owner: Option<u32>,
    /// Its largest size.
    pub max_size: u64,
    /// The inode it must be (a mapped file's, from /proc/PID/maps).
    pub inode: Option<u64>,
}

impl Policy {
    /// A file the process mapped: any owner, this inode, at most [`MAX_ELF_BYTES`].
    pub fn mapped(inode: u64) -> Self {
        Policy {
            owner: None,
            max_size: MAX_ELF_BYTES,
            inode: Some(inode),
        }
    }

    /// An ELF file whose inode is not known here (tests).
    #[cfg(test)]
    pub const ELF: Policy = Policy {
        owner: None,
        max_size: MAX_ELF_BYTES,
        inode: None,
    };
}

/// A file opened under a [`Policy`], with what fstat said of it.
pub struct Opened {
    pub file: File,
    pub size: u64,
    pub inode: u64,
    pub dev: u64,
    /// Last modification, seconds since the epoch.
    pub mtime: i64,
}

fn kind_name(t: FileType) -> &'static str {
    match t {
        FileType::Directory => "directory",
        FileType::Symlink => "symbolic link",
        FileType::Fifo => "FIFO",
        FileType::Socket => "socket",
        FileType::CharacterDevice => "character device",
        FileType::BlockDevice => "block device",
        _ => "special file",
    }
}

/// Opens `path` for reading under `policy` (see the module doc).
pub fn open(path: &Path, policy: &Policy) -> Result<Opened, Refused> {
    let located = locate(path)?;
    let st = rfs::fstat(&located)?;
    let kind = FileType::from_raw_mode(st.st_mode);
    if kind != FileType::RegularFile {
        return Err(if kind == FileType::Symlink {
            Refused::Symlink
        } else {
            Refused::NotRegular(kind_name(kind))
        });
    }
    if let Some(uid) = policy.owner
        && st.st_uid != uid
        && st.st_uid != 0
    {
        return Err(Refused::Owner {
            owner: st.st_uid,
            expected: uid,
        });
    }
    let size = st.st_size as u64;
    if size > policy.max_size {
        return Err(Refused::TooLarge {
            size,
            max: policy.max_size,
        });
    }
    if policy.inode.is_some_and(|i| i != st.st_ino) {
        return Err(Refused::NotMapped);
    }
    // Now open that very file for reading: through our own descriptor, so that nothing can
    // be swapped in between.
    let fd = rfs::open(
        format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&located)
        ),
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK,
        Mode::empty(),
    )?;
    Ok(Opened {
        file: File::from(fd),
        size,
        inode: st.st_ino,
        dev: st.st_dev,
        mtime: st.st_mtime,
    })
}

/// Reads at most `max` bytes of `file` from `offset` (fewer at its end).
pub fn read_at(file: &File, offset: u64, max: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; max];
    let mut got = 0;
    while got < max {
        match rustix::io::pread(file, &mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    buf.truncate(got);
    Ok(buf)
}

/// Files already warned about (bounded: past it, one last line says warnings stop).
static WARNED: Mutex<Option<HashSet<PathBuf>>> = Mutex::new(None);
const MAX_WARNED: usize = 1024;

/// Says once per file, on standard error, that `path` is not read and why.
pub fn warn_once(path: &Path, why: &dyn fmt::Display) {
    let mut w = WARNED.lock().unwrap_or_else(|p| p.into_inner());
    let set = w.get_or_insert_with(HashSet::new);
    if set.len() > MAX_WARNED || set.contains(path) {
        return;
    }
    set.insert(path.to_path_buf());
    if set.len() > MAX_WARNED {
        eprintln!("mmaplock-prof: more than {MAX_WARNED} files ignored; no more such warnings");
    } else {
        eprintln!("mmaplock-prof: ignoring {}: {why}", path.display());
    }
}

#[cfg(test)]
pub fn warned(path: &Path) -> bool {
    let w = WARNED.lock().unwrap_or_else(|p| p.into_inner());
    w.as_ref().is_some_and(|s| s.contains(path))
}

/// The effective uid a process's status says (`/proc/PID/status`, `Uid:` real, effective,
/// ...).
pub fn euid_in(status: &str) -> Option<u32> {
    let uids = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    uids.split_whitespace().nth(1)?.parse().ok()
}
