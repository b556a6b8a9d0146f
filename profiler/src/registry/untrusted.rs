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

use std::{
    collections::HashSet,
    fmt,
    fs::File,
    io,
    os::{
        fd::{AsFd, OwnedFd},
        unix::ffi::OsStrExt,
    },
    path::{Component, Path, PathBuf},
    sync::Mutex,
};

use rustix::fs::{self as rfs, FileType, Mode, OFlags, ResolveFlags};

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

/// How a path is resolved: the shapes of path the profiler reads targets' files by.
enum Shape<'a> {
    /// `/proc/PID/root/REST`: REST inside the process's root.
    InRoot { root: PathBuf, rest: &'a Path },
    /// `/proc/PID/map_files/START-END`: the kernel's link to the mapped file itself (the
    /// target cannot redirect it), followed.
    MapFile,
    /// Any other absolute path, from this process's root.
    Host(&'a Path),
}

fn shape(path: &Path) -> Shape<'_> {
    let mut c = path.components();
    if let (Some(Component::RootDir), Some(Component::Normal(proc_)), Some(Component::Normal(pid))) =
        (c.next(), c.next(), c.next())
        && proc_ == "proc"
        && pid.as_bytes().iter().all(u8::is_ascii_digit)
    {
        match c.next() {
            Some(Component::Normal(k)) if k == "root" => {
                return Shape::InRoot {
                    root: Path::new("/proc").join(pid).join("root"),
                    rest: c.as_path(),
                };
            }
            Some(Component::Normal(k)) if k == "map_files" => return Shape::MapFile,
            _ => {}
        }
    }
    Shape::Host(path.strip_prefix("/").unwrap_or(path))
}

/// Opens `rest` (relative) under `dir` as `O_PATH`, following no symbolic link; `in_root`
/// also resolves `..` and absolute names inside `dir`.
fn open_path_beneath(dir: &OwnedFd, rest: &Path, in_root: bool) -> Result<OwnedFd, Refused> {
    if rest.as_os_str().is_empty()
        || rest
            .components()
            .any(|c| !matches!(c, Component::Normal(_)))
    {
        // Paths from /proc/PID/maps are canonical: `..` or `.` means someone made one up.
        return Err(Refused::BadPath);
    }
    let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut resolve = ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    if in_root {
        resolve |= ResolveFlags::IN_ROOT;
    }
    match rfs::openat2(dir, rest, flags, Mode::empty(), resolve) {
        Ok(fd) => Ok(fd),
        // No openat2 (a seccomp filter, an old kernel): one component at a time.
        Err(rustix::io::Errno::NOSYS | rustix::io::Errno::PERM) => {
            let mut cur: Option<OwnedFd> = None;
            let mut parts = rest.components().peekable();
            while let Some(Component::Normal(name)) = parts.next() {
                let last = parts.peek().is_none();
                let f = if last {
                    flags
                } else {
                    flags | OFlags::DIRECTORY
                };
                let at = cur.as_ref().map_or(dir.as_fd(), |c| c.as_fd());
                let fd = rfs::openat(at, name, f, Mode::empty())?;
                if last && rfs::fstat(&fd)?.st_mode & libc::S_IFMT == libc::S_IFLNK {
                    return Err(Refused::Symlink);
                }
                cur = Some(fd);
            }
            cur.ok_or(Refused::BadPath)
        }
        Err(e) => Err(e.into()),
    }
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
    let located = match shape(path) {
        Shape::InRoot { root, rest } => {
            let root = rfs::open(
                &root,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            open_path_beneath(&root, rest, true)?
        }
        Shape::MapFile => rfs::open(path, OFlags::PATH | OFlags::CLOEXEC, Mode::empty())?,
        Shape::Host(rest) => {
            let root = rfs::open(
                "/",
                OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            open_path_beneath(&root, rest, false)?
        }
    };
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

/// The effective uid of a process (`/proc/PID/status`, `Uid:` real, effective, ...).
pub fn euid_of(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let uids = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    uids.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt, symlink};

    use super::*;

    fn me() -> u32 {
        rustix::process::geteuid().as_raw()
    }

    fn any_owner(max: u64) -> Policy {
        Policy {
            owner: None,
            max_size: max,
            inode: None,
        }
    }

    #[test]
    fn a_regular_file_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a");
        std::fs::write(&p, "hello\n").unwrap();
        let o = open(&p, &any_owner(100)).unwrap();
        assert_eq!(o.size, 6);
        assert_eq!(read_at(&o.file, 1, 3).unwrap(), b"ell");
        assert_eq!(read_at(&o.file, 4, 100).unwrap(), b"o\n");
        assert_eq!(o.inode, std::fs::metadata(&p).unwrap().ino());
    }

    #[test]
    fn links_fifos_large_and_replaced_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, "x").unwrap();
        // A link as the file, and as a directory on the path.
        let link = dir.path().join("link");
        symlink(&target, &link).unwrap();
        assert!(matches!(open(&link, &any_owner(10)), Err(Refused::Symlink)));
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        std::fs::write(sub.join("f"), "x").unwrap();
        let sublink = dir.path().join("sublink");
        symlink(&sub, &sublink).unwrap();
        assert!(matches!(
            open(&sublink.join("f"), &any_owner(10)),
            Err(Refused::Symlink)
        ));
        assert!(open(&sub.join("f"), &any_owner(10)).is_ok());
        // A FIFO: refused at once, without blocking on it.
        let fifo = dir.path().join("fifo");
        rfs::mknodat(rfs::CWD, &fifo, FileType::Fifo, Mode::RUSR, 0).unwrap();
        assert!(matches!(
            open(&fifo, &any_owner(10)),
            Err(Refused::NotRegular("FIFO"))
        ));
        assert!(matches!(
            open(dir.path(), &any_owner(10)),
            Err(Refused::NotRegular("directory"))
        ));
        // Sparse and huge.
        let huge = dir.path().join("huge");
        File::create(&huge)
            .unwrap()
            .set_len(5 * 1024 * 1024 * 1024)
            .unwrap();
        let e = open(&huge, &any_owner(1 << 20)).err().unwrap();
        assert!(
            e.is_suspicious() && e.to_string().contains("5368709120 bytes"),
            "{e}"
        );
        // Another inode than the mapping's.
        let ino = std::fs::metadata(&target).unwrap().ino();
        assert!(open(&target, &Policy::mapped(ino)).is_ok());
        assert!(matches!(
            open(&target, &Policy::mapped(ino + 1)),
            Err(Refused::NotMapped)
        ));
        let missing = open(&dir.path().join("nothing"), &any_owner(1))
            .err()
            .unwrap();
        assert!(missing.is_not_found() && !missing.is_suspicious());
        assert!(matches!(
            open(Path::new("/tmp/../etc/passwd"), &any_owner(1 << 20)),
            Err(Refused::BadPath)
        ));
    }

    #[test]
    fn the_owner_is_checked() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("owned");
        std::fs::write(&p, "x").unwrap();
        let mine = Policy {
            owner: Some(me()),
            max_size: 10,
            inode: None,
        };
        assert!(open(&p, &mine).is_ok());
        if me() == 0 {
            // Root's file passes for anyone; nobody's does not pass for another user.
            let other = Policy {
                owner: Some(12345),
                ..mine
            };
            assert!(open(&p, &other).is_ok(), "root owns it");
            rfs::chown(&p, Some(rustix::fs::Uid::from_raw(65534)), None).unwrap();
            let e = open(&p, &other).err().unwrap();
            assert!(
                e.to_string()
                    .contains("owned by uid 65534, neither the process's user (uid 12345)"),
                "{e}"
            );
        }
    }

    #[test]
    fn paths_under_a_process_root_resolve_inside_it() {
        let me = std::process::id();
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, "inside").unwrap();
        let through = PathBuf::from(format!("/proc/{me}/root")).join(p.strip_prefix("/").unwrap());
        let o = open(&through, &any_owner(100)).unwrap();
        assert_eq!(read_at(&o.file, 0, 100).unwrap(), b"inside");
        // An absolute link inside the root is refused, not resolved against ours.
        let link = dir.path().join("l");
        symlink("/etc/hostname", &link).unwrap();
        let through =
            PathBuf::from(format!("/proc/{me}/root")).join(link.strip_prefix("/").unwrap());
        assert!(matches!(
            open(&through, &any_owner(1 << 20)),
            Err(Refused::Symlink)
        ));
    }

    #[test]
    fn warnings_are_said_once_per_file() {
        let p = Path::new("/nonexistent/warned-once");
        assert!(!warned(p));
        warn_once(p, &"reason");
        warn_once(p, &"reason");
        assert!(warned(p));
    }

    #[test]
    fn our_own_euid() {
        assert_eq!(euid_of(std::process::id()), Some(me()));
    }
}
