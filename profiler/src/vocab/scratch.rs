//! Files for tests that write them: a path in a fresh temporary directory, removed with it.

use std::path::PathBuf;

/// `name` in a new temporary directory; the directory goes when the guard is dropped.
pub fn scratch(name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join(name);
    (dir, path)
}
