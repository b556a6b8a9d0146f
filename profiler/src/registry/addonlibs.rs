//! Which shared libraries a process reached only through a native addon. A thread started
//! in such a library (libvips's workers, behind sharp's `.node`) is the addon's: role `addon`,
//! with the library and the addon named. A library is behind an addon when it is in the
//! DT_NEEDED closure of a mapped `.node` file and not in that of the main executable (so
//! never the C library, libstdc++ or anything else node itself needs).
//!
//! The closures are followed among the files the process maps, matched by file name or
//! DT_SONAME: the library is mapped, so no search path needs emulating. A library an addon
//! `dlopen`s at run time is in no DT_NEEDED list, and nothing the process keeps says who
//! loaded it: it is not recognised.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    fs::File,
    path::{Path, PathBuf},
    sync::Arc,
};

use object::read::elf::{FileHeader as _, SectionTable};

use crate::registry::procmaps::{Maps, open_mapped};

/// Where an `addon` thread's code came from: its addon, and the library its start routine
/// lies in when that is not the addon itself but a library the addon needs. Paths as the
/// process maps them.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AddonOrigin {
    pub addon: PathBuf,
    pub library: Option<PathBuf>,
}

/// A native addon's file (`*.node`).
pub fn is_addon(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.ends_with(".node"))
}

/// A process's mapped libraries, each with the addon it is behind (None: not behind one).
pub type Behind = HashMap<PathBuf, Option<Arc<AddonOrigin>>>;

/// The addon behind the file `mapped` of process `pid` (mapped in `maps`): the file itself
/// if it is one, else the addon whose DT_NEEDED closure alone holds it. Decided once per
/// process and library (`behind`), and only in a process that maps an addon.
pub fn origin(
    pid: u32,
    maps: &Maps,
    behind: &mut Behind,
    mapped: &Path,
) -> Option<Arc<AddonOrigin>> {
    if is_addon(mapped) {
        return Some(Arc::new(AddonOrigin {
            addon: mapped.to_path_buf(),
            library: None,
        }));
    }
    if let Some(known) = behind.get(mapped) {
        return known.clone();
    }
    let has_addon = maps.iter().any(|m| m.path.as_deref().is_some_and(is_addon));
    if !has_addon {
        return None;
    }
    // Every library mapped now is decided at once (a thread of another library may follow).
    let began = std::time::Instant::now();
    let objects = linked_objects(pid, maps);
    let found = executable(pid)
        .map(|exe| behind_addons(&objects, &exe))
        .unwrap_or_default();
    log::debug!(
        "pid {pid}: libraries behind addons (of {} files, {:?}): {found:?}",
        objects.len(),
        began.elapsed()
    );
    for o in objects {
        let origin = found.get(&o.path).map(|addon| {
            Arc::new(AddonOrigin {
                addon: addon.clone(),
                library: Some(o.path.clone()),
            })
        });
        behind.insert(o.path, origin);
    }
    behind.entry(mapped.to_path_buf()).or_default().clone()
}

/// One mapped ELF file as the dynamic linker sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Linked {
    /// As mapped.
    pub path: PathBuf,
    pub soname: Option<String>,
    /// Its DT_NEEDED entries; None when its dynamic section could not be read.
    pub needed: Option<Vec<String>>,
}

/// The libraries among `objects` that are behind an addon, each with the first addon (in
/// `objects`' order) whose closure holds it. Empty when the main executable `exe` is not
/// among them or its closure cannot be followed to the end (an unreadable file on it): then
/// nothing can be told apart from what node needs itself, and nothing is claimed.
pub fn behind_addons(objects: &[Linked], exe: &Path) -> HashMap<PathBuf, PathBuf> {
    let mut by_name: HashMap<&str, usize> = HashMap::new();
    for (i, o) in objects.iter().enumerate() {
        if let Some(n) = o.path.file_name().and_then(|n| n.to_str()) {
            by_name.entry(n).or_insert(i);
        }
        if let Some(s) = &o.soname {
            by_name.entry(s).or_insert(i);
        }
    }
    let own = match objects.iter().position(|o| o.path == exe) {
        Some(e) => match closure(objects, &by_name, e) {
            (own, true) => own,
            (_, false) => return HashMap::new(),
        },
        None => return HashMap::new(),
    };
    let mut behind = HashMap::new();
    for (a, addon) in objects.iter().enumerate() {
        if !is_addon(&addon.path) {
            continue;
        }
        // An unreadable file in an addon's closure only hides what lies behind it.
        for i in closure(objects, &by_name, a).0 {
            let lib = &objects[i].path;
            if !own.contains(&i) && !is_addon(lib) {
                behind
                    .entry(lib.clone())
                    .or_insert_with(|| addon.path.clone());
            }
        }
    }
    behind
}

/// The objects `from` needs, directly or not (itself included), and whether every one of
/// them could be read (else some may be missing).
fn closure(
    objects: &[Linked],
    by_name: &HashMap<&str, usize>,
    from: usize,
) -> (HashSet<usize>, bool) {
    let (mut seen, mut queue) = (HashSet::from([from]), VecDeque::from([from]));
    let mut complete = true;
    while let Some(i) = queue.pop_front() {
        let Some(needed) = &objects[i].needed else {
            complete = false;
            continue;
        };
        for name in needed {
            // A DT_NEEDED entry may be a path (a library linked without -l).
            let base = Path::new(name).file_name().and_then(|n| n.to_str());
            if let Some(&j) = base.and_then(|b| by_name.get(b))
                && seen.insert(j)
            {
                queue.push_back(j);
            }
        }
    }
    (seen, complete)
}

/// The mapped files of process `pid` (one entry per file, in address order), each with its
/// dynamic section read from the file as mapped (`procmaps::open_mapped`: a container's own
/// file, or a replaced one; not kept open). Only called while the process lives.
pub fn linked_objects(pid: u32, maps: &Maps) -> Vec<Linked> {
    let mut seen = HashSet::new();
    maps.iter()
        .filter(|m| m.path.as_ref().is_some_and(|p| seen.insert(p.clone())))
        .filter_map(|m| {
            let path = m.path.clone()?;
            let dynamic = open_mapped(pid, m).and_then(read_dynamic);
            Some(match dynamic {
                Some((soname, needed)) => Linked {
                    path,
                    soname,
                    needed: Some(needed),
                },
                None => Linked {
                    path,
                    soname: None,
                    needed: None,
                },
            })
        })
        .collect()
}

/// The main executable of process `pid`, as its maps name it.
pub fn executable(pid: u32) -> Option<PathBuf> {
    let link = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    let s = link.to_str()?;
    Some(PathBuf::from(s.strip_suffix(" (deleted)").unwrap_or(s)))
}

/// DT_SONAME and the DT_NEEDED entries of an ELF file. Only the section headers, the
/// dynamic section and the strings it names are read, never the whole file (node's is a
/// hundred megabytes).
pub fn read_dynamic(file: File) -> Option<(Option<String>, Vec<String>)> {
    let data = object::ReadCache::new(file);
    let header = object::elf::FileHeader64::<object::Endianness>::parse(&data).ok()?;
    let endian = header.endian().ok()?;
    let sections: SectionTable<'_, _, _> = header.sections(endian, &data).ok()?;
    let table = sections.dynamic_table(endian, &data).ok()?;
    let (mut soname, mut needed) = (None, Vec::new());
    for d in &table {
        let text = || {
            table
                .string(d)
                .ok()
                .map(|s| String::from_utf8_lossy(s).into_owned())
        };
        if d.tag == object::elf::DT_NEEDED {
            needed.push(text()?);
        } else if d.tag == object::elf::DT_SONAME {
            soname = text();
        }
    }
    Some((soname, needed))
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    fn lib(path: &str, soname: Option<&str>, needed: &[&str]) -> Linked {
        Linked {
            path: path.into(),
            soname: soname.map(Into::into),
            needed: Some(needed.iter().map(|n| n.to_string()).collect()),
        }
    }

    const SHARP: &str = "/app/node_modules/@img/sharp-linux-x64/lib/sharp-linux-x64.node";
    const VIPS: &str = "/app/node_modules/@img/sharp-libvips-linux-x64/lib/libvips-cpp.so.8.17.1";

    /// A process as sharp's makes it: node (which needs libstdc++ and the C library), sharp's
    /// addon, the libvips it needs (by soname, a file of another name), and what libvips needs.
    fn sharp_process() -> Vec<Linked> {
        vec![
            lib(
                "/usr/bin/node",
                None,
                &["libstdc++.so.6", "libm.so.6", "libc.so.6"],
            ),
            lib(
                "/usr/lib/x86_64-linux-gnu/libstdc++.so.6.0.33",
                Some("libstdc++.so.6"),
                &["libm.so.6", "libc.so.6", "libgcc_s.so.1"],
            ),
            lib(
                "/usr/lib/x86_64-linux-gnu/libm.so.6",
                Some("libm.so.6"),
                &["libc.so.6"],
            ),
            // No soname: found by its file name.
            lib(
                "/usr/lib/x86_64-linux-gnu/libgcc_s.so.1",
                None,
                &["libc.so.6"],
            ),
            lib(
                "/usr/lib/x86_64-linux-gnu/libc.so.6",
                Some("libc.so.6"),
                &["ld-linux-x86-64.so.2"],
            ),
            lib(
                "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
                Some("ld-linux-x86-64.so.2"),
                &[],
            ),
            lib(
                SHARP,
                None,
                &[
                    "libvips-cpp.so.42",
                    "libstdc++.so.6",
                    "libgcc_s.so.1",
                    "libc.so.6",
                ],
            ),
            lib(
                VIPS,
                Some("libvips-cpp.so.42"),
                &["libglib-2.0.so.0", "libstdc++.so.6", "libc.so.6"],
            ),
            // Needed by path (linked without -l).
            lib(
                "/usr/lib/x86_64-linux-gnu/libglib-2.0.so.0.7400.0",
                Some("libglib-2.0.so.0"),
                &["/opt/extra/libextra.so", "libc.so.6"],
            ),
            lib("/opt/extra/libextra.so", None, &["libc.so.6"]),
            // Another addon, needing glib too: it is the first addon's (in map order).
            lib("/app/build/Release/other.node", None, &["libglib-2.0.so.0"]),
        ]
    }

    #[test]
    fn a_library_only_an_addon_needs_is_the_addons_and_what_node_needs_never_is() {
        let objects = sharp_process();
        let behind = behind_addons(&objects, Path::new("/usr/bin/node"));
        let addon_of = |p: &str| behind.get(Path::new(p)).map(|a| a.to_str().unwrap());
        assert_eq!(addon_of(VIPS), Some(SHARP));
        assert_eq!(
            addon_of("/usr/lib/x86_64-linux-gnu/libglib-2.0.so.0.7400.0"),
            Some(SHARP)
        );
        assert_eq!(addon_of("/opt/extra/libextra.so"), Some(SHARP));
        // What node needs itself, directly or not, is never an addon's, though the addons
        // need it too.
        for own in [
            "/usr/bin/node",
            "/usr/lib/x86_64-linux-gnu/libstdc++.so.6.0.33",
            "/usr/lib/x86_64-linux-gnu/libm.so.6",
            "/usr/lib/x86_64-linux-gnu/libgcc_s.so.1",
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
            "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
        ] {
            assert_eq!(addon_of(own), None, "{own}");
        }
        // An addon is not a library behind itself or another addon.
        assert_eq!(addon_of(SHARP), None);
        assert_eq!(addon_of("/app/build/Release/other.node"), None);
        assert_eq!(behind.len(), 3, "{behind:?}");
    }

    #[test]
    fn nothing_is_claimed_when_what_node_needs_cannot_be_told() {
        let mut objects = sharp_process();
        // The executable is not among the mapped files (or not known).
        assert!(behind_addons(&objects, Path::new("/usr/local/bin/node")).is_empty());
        // A file node needs could not be read: what it needs in turn is unknown, so the C
        // library (needed by the addon too) could look like the addon's own.
        objects[1].needed = None;
        assert!(behind_addons(&objects, Path::new("/usr/bin/node")).is_empty());
        // A file only the addon needs could not be read: only what lies behind it is hidden.
        let mut objects = sharp_process();
        objects[8].needed = None;
        let behind = behind_addons(&objects, Path::new("/usr/bin/node"));
        assert!(behind.contains_key(Path::new(VIPS)));
        assert!(!behind.contains_key(Path::new("/opt/extra/libextra.so")));
    }

    /// The dynamic sections of real files: this test binary needs the C library, whose
    /// soname is its file name; in a process with no addon, nothing is behind one.
    #[test]
    fn dynamic_sections_are_read_from_the_files_as_mapped() {
        let exe = std::env::current_exe().unwrap();
        let (soname, needed) =
            read_dynamic(fs::File::open(&exe).unwrap()).expect("our dynamic section");
        assert_eq!(soname, None);
        assert!(needed.iter().any(|n| n == "libc.so.6"), "{needed:?}");
        let maps = Maps::read(std::process::id())
            .unwrap()
            .retain(crate::registry::procmaps::Keep::Code);
        let objects = linked_objects(std::process::id(), &maps);
        let libc = objects
            .iter()
            .find(|o| o.path.file_name().is_some_and(|n| n == "libc.so.6"))
            .expect("the C library is mapped");
        assert_eq!(libc.soname.as_deref(), Some("libc.so.6"));
        assert!(objects.iter().all(|o| o.needed.is_some()), "{objects:?}");
        assert!(behind_addons(&objects, &exe).is_empty());
        // Not an ELF file.
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.so");
        fs::write(&junk, b"not an ELF file").unwrap();
        assert_eq!(read_dynamic(fs::File::open(&junk).unwrap()), None);
    }
}
