//! Paths resolved to a file without following a symbolic link anywhere on them: `openat2`
//! with `RESOLVE_NO_SYMLINKS` (and `RESOLVE_IN_ROOT` under `/proc/PID/root`), else one
//! component at a time where a seccomp filter or an old kernel has no `openat2`. Apart from
//! the checks on the file found (`open`), which do not care how it was reached.

use std::{
    os::{
        fd::{AsFd, OwnedFd},
        unix::ffi::OsStrExt,
    },
    path::{Component, Path, PathBuf},
};

use rustix::fs::{self as rfs, Mode, OFlags, ResolveFlags};

use super::Refused;

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

/// `path` opened as `O_PATH`, resolved by its shape without following a link (see the module
/// doc): nothing is open for reading yet.
pub(super) fn locate(path: &Path) -> Result<OwnedFd, Refused> {
    Ok(match shape(path) {
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
    })
}
