use super::*;

#[test]
fn a_name_is_searched_on_path_as_execvp_does() {
    let d = tempfile::tempdir().unwrap();
    let (a, b) = (d.path().join("a"), d.path().join("b"));
    std::fs::create_dir_all(a.join("tool")).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    std::fs::write(b.join("tool"), "").unwrap();
    let path = format!("{}:{}:/nonexistent", a.display(), b.display());
    // A directory of that name is passed over.
    assert_eq!(
        search(OsStr::new("tool"), Some(OsStr::new(&path))),
        [b.join("tool")]
    );
    assert!(search(OsStr::new("nothing-of-this-name"), Some(OsStr::new(&path))).is_empty());
    // A name with a slash is itself.
    assert_eq!(search(OsStr::new("./x/y"), None), [PathBuf::from("./x/y")]);
}

#[test]
fn statuses_as_shells_give_them() {
    assert_eq!(Status::Exited(3).code(), 3);
    assert_eq!(Status::Signalled(libc::SIGINT).code(), 130);
    assert_eq!(Status::Signalled(libc::SIGKILL).code(), 137);
    assert!(Status::Exited(0).success() && !Status::Signalled(15).success());
    assert!(
        Status::Signalled(15)
            .to_string()
            .starts_with("killed by signal 15")
    );
}

/// A real child: the gate holds it until released, the status and a failed exec are
/// reported.
#[test]
fn the_child_waits_at_the_gate_then_runs() {
    let d = tempfile::tempdir().unwrap();
    let mark = d.path().join("ran");
    let words: Vec<OsString> = ["sh", "-c", &format!("touch {}; exit 7", mark.display())]
        .iter()
        .map(OsString::from)
        .collect();
    let mut g = Prepared::new(&words).unwrap().fork().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(!mark.exists(), "ran before the gate opened");
    g.release().unwrap();
    assert_eq!(g.wait(), Status::Exited(7));
    assert!(mark.exists());
    // Not executable: said, and 126.
    let script = d.path().join("script");
    std::fs::write(&script, "echo").unwrap();
    let mut g = Prepared::new(&[script.into_os_string()])
        .unwrap()
        .fork()
        .unwrap();
    let e = g.release().unwrap_err();
    assert_eq!(e.exit_code(), 126, "{e}");
    // Never released: it exits, reaped on drop.
    let g = Prepared::new(&[OsString::from("true")])
        .unwrap()
        .fork()
        .unwrap();
    let pid = g.pid;
    drop(g);
    assert!(!Path::new(&format!("/proc/{pid}")).exists());
    assert_eq!(
        Prepared::new(&[OsString::from("no-such-command-here")])
            .err()
            .map(|e| e.exit_code()),
        Some(127)
    );
}
