//! Real files, links, a FIFO, sparse and replaced files, another owner, and paths under a
//! process's root: each read or refused as the module doc says.

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
    let through = PathBuf::from(format!("/proc/{me}/root")).join(link.strip_prefix("/").unwrap());
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
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    assert_eq!(euid_in(&status), Some(me()));
}
