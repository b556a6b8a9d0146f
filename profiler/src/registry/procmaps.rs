//! A process's memory map (`/proc/PID/maps`): which file, if any, backs an address, and at
//! which file offset. Thread roles and stack attribution both need it. When it is read again,
//! and how (`PROCMAP_QUERY`), is `live`'s: each read may take the process's `mmap_lock`.

mod live;
mod query;

pub use live::{Keep, Lookup, Lookups, Proc, forget_shared};

use std::{
    collections::HashMap,
    fs::File,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    sync::Mutex,
};

use crate::registry::untrusted;

/// A device as `/proc/PID/maps` writes it ("%02x:%02x"): the key mappings and files are
/// matched by, with the inode.
pub fn dev_name(major: u32, minor: u32) -> String {
    format!("{major:02x}:{minor:02x}")
}

/// One line of `/proc/PID/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub exec: bool,
    /// File offset of `start`.
    pub offset: u64,
    pub dev: String,
    pub inode: u64,
    /// File-backed mappings only (a " (deleted)" suffix is stripped).
    pub path: Option<PathBuf>,
    /// The name of a special mapping (`[stack]`, `[vdso]`, `[heap]`), or empty.
    pub label: String,
}

impl Mapping {
    pub fn parse(line: &str) -> Option<Self> {
        let mut it = line.splitn(6, ' ');
        let (range, perms, offset, dev, inode) =
            (it.next()?, it.next()?, it.next()?, it.next()?, it.next()?);
        let name = it.next().unwrap_or("").trim_start();
        let (start, end) = range.split_once('-')?;
        let inode: u64 = inode.parse().ok()?;
        let path = (inode != 0 && name.starts_with('/'))
            .then(|| PathBuf::from(name.strip_suffix(" (deleted)").unwrap_or(name)));
        Some(Mapping {
            start: u64::from_str_radix(start, 16).ok()?,
            end: u64::from_str_radix(end, 16).ok()?,
            exec: perms.as_bytes().get(2) == Some(&b'x'),
            offset: u64::from_str_radix(offset, 16).ok()?,
            dev: dev.to_owned(),
            inode,
            label: if path.is_none() {
                name.to_owned()
            } else {
                String::new()
            },
            path,
        })
    }

    /// File offset of `addr` (inside this mapping).
    pub fn file_offset(&self, addr: u64) -> u64 {
        addr - self.start + self.offset
    }
}

/// A snapshot of a process's mappings, sorted by address.
#[derive(Clone, Debug, Default)]
pub struct Maps(Vec<Mapping>);

/// Where this process can read the file that process `pid` maps in `m`, safely: a path to a
/// descriptor of ours on that very file (`/proc/self/fd/N`), opened through
/// [`untrusted`](crate::registry::untrusted) (no symbolic link followed, a regular file, at
/// most `MAX_ELF_BYTES`) and checked by identity (the mapping's inode). The file is looked
/// for through `/proc/PID/root` (a container, or a path our own sandbox hides), then
/// `/proc/PID/map_files` (a replaced or deleted file; needs root or
/// CAP_CHECKPOINT_RESTORE), then at the path itself (the process has exited since).
///
/// The symbolizer is handed that path, never the target's own: a target cannot swap a link
/// in between the check and the symbolizer's open, and the path keeps naming the file after
/// the process is gone. The descriptors are kept for the life of the profiler (the
/// symbolizer caches by path), one per distinct file, at most [`MAX_HELD_FILES`].
pub fn readable_path(pid: u32, m: &Mapping) -> Option<PathBuf> {
    let path = m.path.as_deref()?;
    let key = (pid, m.start, m.inode);
    let mut memo = READABLE.lock().unwrap_or_else(|p| p.into_inner());
    let memo = memo.get_or_insert_with(HashMap::new);
    if let Some(found) = memo.get(&key) {
        return found.clone();
    }
    let found = find_readable(pid, m, path);
    if memo.len() >= MAX_MEMO {
        memo.clear();
    }
    memo.insert(key, found.clone());
    found
}

/// The most distinct files kept open for symbolization (and a quarter of the open-file limit
/// at most: the kernel side needs its descriptors).
pub const MAX_HELD_FILES: usize = 4096;

fn max_held() -> usize {
    let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX);
    MAX_HELD_FILES.min(usize::try_from(soft / 4).unwrap_or(usize::MAX))
}
const MAX_MEMO: usize = 16_384;

/// (pid, mapping start, inode) -> the path found for it (None: none could be).
type Memo = HashMap<(u32, u64, u64), Option<PathBuf>>;
static READABLE: Mutex<Option<Memo>> = Mutex::new(None);
/// The files kept open, by (device, inode) as opened.
static HELD: Mutex<Option<HashMap<(u64, u64), File>>> = Mutex::new(None);

fn find_readable(pid: u32, m: &Mapping, path: &Path) -> Option<PathBuf> {
    // The very file may be held already, opened through another of its mappings (V8 maps
    // node's builtins a second time, elsewhere): then it needs no path at all, which matters
    // once the process is gone and its path names nothing here (a container's file).
    if let Some(held) = held_by_identity(m) {
        return Some(held);
    }
    hold(open_unheld(pid, m, path)?)
}

/// The file that process `pid` maps in `m`, opened as [`readable_path`] finds it but not
/// kept: for a read done once, while the process lives (the libraries' dynamic sections).
pub fn open_mapped(pid: u32, m: &Mapping) -> Option<File> {
    if let Some(held) = held_by_identity(m) {
        return File::open(held).ok();
    }
    Some(open_unheld(pid, m, m.path.as_deref()?)?.file)
}

/// Opens the file of mapping `m` (at `path` in process `pid`) as `readable_path` explains:
/// through /proc/PID/root, then map_files, then the path itself, checked by identity.
fn open_unheld(pid: u32, m: &Mapping, path: &Path) -> Option<untrusted::Opened> {
    let policy = untrusted::Policy::mapped(m.inode);
    for c in candidates(pid, m, path) {
        match untrusted::open(&c, &policy) {
            Ok(o) => return Some(o),
            Err(e) if e.is_suspicious() => {
                untrusted::warn_once(&c, &format_args!("not read as process {pid}'s file: {e}"));
                return None;
            }
            Err(e) => log::debug!("{}: {e}", c.display()),
        }
    }
    None
}

/// Where the file of mapping `m` (named `path` in process `pid`'s maps) is looked for, in
/// order. A mapping named `/` is a file that is the root of a mount attached nowhere: runc
/// maps its own binary so in every container it starts (a read-only copy, bind-mounted, then
/// detached), and only map_files reaches it; a path would name a directory.
fn candidates(pid: u32, m: &Mapping, path: &Path) -> Vec<PathBuf> {
    let map_file = PathBuf::from(format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end));
    match path.strip_prefix("/") {
        Ok(rel) if rel.as_os_str().is_empty() => vec![map_file],
        Ok(rel) => vec![
            Path::new(&format!("/proc/{pid}/root")).join(rel),
            map_file,
            path.to_path_buf(),
        ],
        Err(_) => vec![map_file, path.to_path_buf()],
    }
}

/// The file of mapping `m` if it is among those kept open: same device and inode (an inode
/// is not reused while we hold the file open, so this is the file the process mapped).
fn held_by_identity(m: &Mapping) -> Option<PathBuf> {
    let (major, minor) = m.dev.split_once(':')?;
    let dev = libc::makedev(
        u32::from_str_radix(major, 16).ok()?,
        u32::from_str_radix(minor, 16).ok()?,
    );
    let held = HELD.lock().unwrap_or_else(|p| p.into_inner());
    let f = held.as_ref()?.get(&(dev, m.inode))?;
    Some(PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd())))
}

/// Keeps `o` open (or the same file already kept) and names it by our descriptor.
fn hold(o: untrusted::Opened) -> Option<PathBuf> {
    let mut held = HELD.lock().unwrap_or_else(|p| p.into_inner());
    let held = held.get_or_insert_with(HashMap::new);
    let key = (o.dev, o.inode);
    if !held.contains_key(&key) {
        if held.len() >= max_held() {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                eprintln!(
                    "mmaplock-prof: {} files symbolized already: code in further files is not named",
                    held.len()
                )
            });
            return None;
        }
        held.insert(key, o.file);
    }
    let fd = held[&key].as_raw_fd();
    Some(PathBuf::from(format!("/proc/self/fd/{fd}")))
}

impl Maps {
    /// Read unpreempted (`kernel::priority`): before Linux 6.17 each `read()` holds the
    /// process's lock while a page of lines is written.
    pub fn read(pid: u32) -> std::io::Result<Self> {
        let text = {
            let _unpreempted = crate::kernel::priority::Unpreempted::new();
            std::fs::read_to_string(format!("/proc/{pid}/maps"))?
        };
        Ok(Self::parse(&text))
    }

    /// The executable mappings of `pid` (all that [`Keep`] ever keeps), asked for one by one
    /// (`PROCMAP_QUERY`): on a kernel that reads maps without the process's lock (6.17+),
    /// instead of formatting and parsing the whole map, of which they are about one line in
    /// ten in a node process's. Unpreempted, as [`read`](Self::read).
    pub fn read_executable(pid: u32) -> std::io::Result<Self> {
        let file = query::MapsFile::open(pid)?;
        let found = {
            let _unpreempted = crate::kernel::priority::Unpreempted::new();
            file.executable()?
        };
        Ok(Maps(found))
    }

    /// How many mappings.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The mappings `keep` keeps.
    pub fn retain(mut self, keep: Keep) -> Self {
        self.0.retain(|m| keep.keeps(m));
        self.0.shrink_to_fit();
        self
    }

    /// Adds a mapping read since (a query's answer), in place of those it overlaps (gone
    /// since: two mappings never overlap).
    pub fn insert(&mut self, m: Mapping) {
        self.0.retain(|o| o.end <= m.start || m.end <= o.start);
        let at = self.0.partition_point(|o| o.start < m.start);
        self.0.insert(at, m);
    }

    pub fn parse(text: &str) -> Self {
        let mut v: Vec<Mapping> = text.lines().filter_map(Mapping::parse).collect();
        v.sort_by_key(|m| m.start);
        Maps(v)
    }

    /// The mapping containing `addr`.
    pub fn find(&self, addr: u64) -> Option<&Mapping> {
        let i = self.0.partition_point(|m| m.start <= addr).checked_sub(1)?;
        Some(&self.0[i]).filter(|m| addr < m.end)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Mapping> {
        self.0.iter()
    }

    /// The end of the highest mapping (0: none).
    pub fn highest_end(&self) -> u64 {
        self.0.last().map_or(0, |m| m.end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// runc's init maps its binary from a detached mount, which /proc/PID/maps names `/`: the
    /// file is still found (through map_files), not refused as a path leaving the root.
    #[test]
    fn a_file_mapped_from_a_detached_mount_is_read_through_map_files() {
        use std::os::unix::fs::MetadataExt;
        let me = std::process::id();
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let maps = Maps::read(me).unwrap();
        // The last of our executable's mappings (another test looks at the first).
        let mut m = maps
            .iter()
            .filter(|m| m.path.as_deref() == Some(exe.as_path()))
            .last()
            .expect("our executable is mapped")
            .clone();
        m.path = Some("/".into());
        assert_eq!(
            candidates(me, &m, Path::new("/")),
            [PathBuf::from(format!(
                "/proc/{me}/map_files/{:x}-{:x}",
                m.start, m.end
            ))]
        );
        let p = readable_path(me, &m).expect("found through map_files");
        assert_eq!(std::fs::metadata(&p).unwrap().ino(), m.inode);
    }

    #[test]
    fn mapped_files_are_found_by_identity_and_named_by_our_own_descriptor() {
        use std::os::unix::fs::MetadataExt;
        let me = std::process::id();
        let maps = Maps::read(me).unwrap();
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let m = maps
            .iter()
            .find(|m| m.path.as_deref() == Some(exe.as_path()))
            .expect("our executable is mapped");
        let p = readable_path(me, m).expect("our executable");
        assert!(p.starts_with("/proc/self/fd/"), "{p:?}");
        assert_eq!(
            std::fs::metadata(&p).unwrap().ino(),
            std::fs::metadata(&exe).unwrap().ino()
        );
        // Asked again: the same descriptor.
        assert_eq!(readable_path(me, m), Some(p.clone()));
        // A path that names another file now (replaced on disk): not that file.
        let mut replaced = m.clone();
        replaced.path = Some("/etc/hostname".into());
        replaced.start += 1;
        let other = readable_path(me, &replaced);
        assert!(
            other
                .as_ref()
                .is_none_or(|p| std::fs::metadata(p).unwrap().ino() == m.inode),
            "{other:?}"
        );
        // Another mapping of the same file, under a path that names nothing here (a
        // container's, once the process is gone): the file already held.
        let mut elsewhere = m.clone();
        elsewhere.path = Some("/no/such/dir/exe".into());
        elsewhere.start += 2;
        assert_eq!(readable_path(me, &elsewhere), Some(p.clone()));
        // Anonymous memory: nothing to read.
        let mut anon = m.clone();
        anon.path = None;
        assert_eq!(readable_path(me, &anon), None);
    }

    const SAMPLE: &str = "\
00400000-00401000 r--p 00000000 fe:01 1234                               /usr/bin/node
00401000-02a00000 r-xp 00001000 fe:01 1234                               /usr/bin/node
7f0000000000-7f0000021000 rw-p 00000000 00:00 0 
7f1000000000-7f1000010000 r-xp 00002000 fe:01 99                         /tmp/addon/build/churn.node (deleted)
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
";

    #[test]
    fn parses_and_finds_mappings() {
        let maps = Maps::parse(SAMPLE);
        let m = maps.find(0x0040_2000).unwrap();
        assert!(m.exec);
        assert_eq!(
            m.path.as_deref(),
            Some(std::path::Path::new("/usr/bin/node"))
        );
        assert_eq!(m.file_offset(0x0040_2000), 0x2000);
        let addon = maps.find(0x7f10_0000_0010).unwrap();
        assert_eq!(
            addon.path.as_deref(),
            Some(std::path::Path::new("/tmp/addon/build/churn.node"))
        );
        let anon = maps.find(0x7f00_0000_0000).unwrap();
        assert!(anon.path.is_none() && !anon.exec);
        assert_eq!(maps.find(0x7ffd_0000_0000).unwrap().label, "[stack]");
        assert!(maps.find(0x10).is_none());
        assert!(maps.find(0x7f00_0002_1000).is_none());
    }

    #[test]
    fn reads_our_own_maps() {
        let maps = Maps::read(std::process::id()).unwrap();
        let here = reads_our_own_maps as *const () as u64;
        let m = maps.find(here).expect("our code is mapped");
        assert!(m.exec);
        assert_eq!(m.path.as_deref(), std::env::current_exe().ok().as_deref());
    }
}
