//! The agent's selectors as the kernel matches them when a process execs or forks (see
//! `profiler-ebpf/src/selection.rs`): command names, executables by the last components of
//! their path, and cgroup v2 subtrees by the id and depth of their root.

use std::{
    io,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use profiler_common::{COMM_LEN, CgroupSelector, EXE_COMPONENT_LEN, EXE_COMPONENTS, ExeSelector};

/// What the kernel matches: each list small (the maps hold 64 comms, 16 executables and 16
/// cgroups).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelSelectors {
    pub comms: Vec<[u8; COMM_LEN]>,
    pub exes: Vec<ExeSelector>,
    pub cgroups: Vec<CgroupSelector>,
}

/// A command name as the kernel stores it (NUL-padded); None if it cannot be one (15 bytes
/// at most).
pub fn comm_key(name: &str) -> Option<[u8; COMM_LEN]> {
    let b = name.as_bytes();
    if b.is_empty() || b.len() >= COMM_LEN {
        return None;
    }
    let mut k = [0u8; COMM_LEN];
    k[..b.len()].copy_from_slice(b);
    Some(k)
}

/// The name exec gives a process running `exe` (as `/proc/PID/exe` reads): its file name, cut
/// to the 15 bytes the kernel keeps. For a process running when a selection begins, which
/// may have renamed itself since (Node's `process.title`), this is the name it was exec'd
/// under (unless exec'd through a link of another name).
pub fn exec_name(exe: &str) -> &[u8] {
    // A replaced binary reads as "/usr/bin/node (deleted)".
    let exe = exe.strip_suffix(" (deleted)").unwrap_or(exe);
    let base = exe.rsplit('/').next().unwrap_or(exe).as_bytes();
    &base[..base.len().min(COMM_LEN - 1)]
}

/// The kernel's form of an executable pattern: a basename (`node`), a path (`/usr/bin/node`,
/// matched from its file system's root), or a path's last components (`*/bin/node`). None
/// for a pattern it cannot match (other wildcards, more than 4 components, one of 32 bytes
/// or more): userspace matches those, when a process is found or execs.
pub fn exe_selector(pattern: &str) -> Option<ExeSelector> {
    let (anchored, rest) = if let Some(r) = pattern.strip_prefix("*/") {
        (false, r)
    } else if let Some(r) = pattern.strip_prefix('/') {
        (true, r)
    } else {
        (false, pattern)
    };
    let comps: Vec<&str> = rest.split('/').collect();
    if comps.is_empty() || comps.len() > EXE_COMPONENTS {
        return None;
    }
    let mut sel = ExeSelector {
        n: comps.len() as u32,
        anchored: anchored as u32,
        lens: [0; EXE_COMPONENTS],
        comps: [[0; EXE_COMPONENT_LEN]; EXE_COMPONENTS],
    };
    // Innermost first.
    for (i, c) in comps.iter().rev().enumerate() {
        let b = c.as_bytes();
        if b.is_empty()
            || b.len() >= EXE_COMPONENT_LEN
            || c.contains(['*', '?', '[', ']', '{', '}'])
            || *c == "."
            || *c == ".."
        {
            return None;
        }
        sel.lens[i] = b.len() as u32;
        sel.comps[i][..b.len()].copy_from_slice(b);
    }
    Some(sel)
}

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("no cgroup v2 hierarchy is mounted (see /proc/self/mountinfo)")]
    NoCgroup2,
    #[error("cgroup {path}: {source}")]
    Stat {
        path: String,
        #[source]
        source: io::Error,
    },
}

/// Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified`
/// on hosts with both hierarchies).
pub fn cgroup2_mount() -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mount_of(&text)
}

fn mount_of(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|l| {
        // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
        let (left, right) = l.split_once(" - ")?;
        if right.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        left.split_whitespace().nth(4).map(PathBuf::from)
    })
}

/// The kernel's form of a cgroup subtree (`/system.slice/api.service`, as `/proc/PID/cgroup`
/// names it): its root's id (the directory's inode in the cgroup v2 file system) and depth.
pub fn cgroup_selector(path: &str) -> Result<CgroupSelector, CgroupError> {
    let mount = cgroup2_mount().ok_or(CgroupError::NoCgroup2)?;
    cgroup_selector_under(&mount, path)
}

fn cgroup_selector_under(mount: &Path, path: &str) -> Result<CgroupSelector, CgroupError> {
    let rel = path.trim_start_matches('/');
    let meta = std::fs::metadata(mount.join(rel)).map_err(|source| CgroupError::Stat {
        path: path.to_string(),
        source,
    })?;
    Ok(CgroupSelector {
        id: meta.ino(),
        level: rel.split('/').filter(|c| !c.is_empty()).count() as u32,
        _pad: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn comps(s: &ExeSelector) -> Vec<String> {
        (0..s.n as usize)
            .map(|i| String::from_utf8_lossy(&s.comps[i][..s.lens[i] as usize]).into_owned())
            .collect()
    }

    #[test]
    fn exe_patterns_become_components_innermost_first() {
        let node = exe_selector("node").unwrap();
        assert_eq!((comps(&node), node.anchored), (vec!["node".into()], 0));
        let any = exe_selector("*/bin/node").unwrap();
        assert_eq!(
            (comps(&any), any.anchored),
            (vec!["node".to_string(), "bin".into()], 0)
        );
        let abs = exe_selector("/usr/local/bin/node").unwrap();
        assert_eq!(comps(&abs), ["node", "bin", "local", "usr"]);
        assert_eq!(abs.anchored, 1);
        // What the kernel cannot match is left to userspace.
        for p in [
            "node*",
            "*node",
            "/a/b/c/d/e",
            "",
            "a//b",
            "/usr/../bin/node",
            &"x".repeat(32),
        ] {
            assert!(exe_selector(p).is_none(), "{p:?}");
        }
        assert!(exe_selector(&"x".repeat(31)).is_some());
    }

    #[test]
    fn the_exec_name_is_the_executables_file_name_cut_as_exec_cuts_it() {
        assert_eq!(exec_name("/usr/local/bin/node"), b"node");
        assert_eq!(exec_name("/usr/bin/node (deleted)"), b"node");
        assert_eq!(exec_name("/opt/a-long-exe-name-indeed"), b"a-long-exe-name");
        assert_eq!(exec_name("node"), b"node");
    }

    #[test]
    fn comm_keys_are_nul_padded_and_bounded() {
        assert_eq!(&comm_key("node").unwrap()[..5], b"node\0");
        assert!(comm_key("").is_none());
        assert!(comm_key("exactly-16-bytes").is_none());
        assert!(comm_key("fifteen-bytes-x").is_some());
    }

    #[test]
    fn the_cgroup2_mount_is_found_in_mountinfo() {
        let hybrid = "25 1 0:23 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro\n\
                      26 25 0:24 / /sys/fs/cgroup/unified rw,nosuid shared:9 - cgroup2 cgroup2 rw\n\
                      27 25 0:25 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
        assert_eq!(mount_of(hybrid), Some("/sys/fs/cgroup/unified".into()));
        assert_eq!(mount_of("1 0 0:1 / / rw - ext4 /dev/vda rw\n"), None);
    }

    /// This process's own cgroup, through the real hierarchy: its id is what the kernel
    /// reports for it (`bpf_get_current_cgroup_id` is the same inode number).
    #[test]
    fn a_cgroup_path_resolves_to_its_directory_inode_and_depth() {
        let Some(mount) = cgroup2_mount() else {
            profiler_common::skip::skip_because("no cgroup v2 hierarchy");
            return;
        };
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let path = own
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .expect("a v2 line");
        let sel = cgroup_selector_under(&mount, path).unwrap();
        let want = std::fs::metadata(mount.join(path.trim_start_matches('/')))
            .unwrap()
            .ino();
        assert_eq!(sel.id, want);
        assert_eq!(
            sel.level as usize,
            path.split('/').filter(|c| !c.is_empty()).count()
        );
        assert!(cgroup_selector_under(&mount, "/does/not/exist").is_err());
    }
}
