//! The captures' directories under `--escalate-dir`: named by when they began, the process's
//! name and pid (so that they sort in time order), and pruned oldest first to the budget.
//! Only directories named so are counted and removed: anything else there is the user's.

use std::{
    fs,
    path::{Path, PathBuf},
    time::SystemTime,
};

/// A capture's directory name: the UTC time it began, the process's name and pid
/// (`20261128T140502Z-node-1234`); names sort in time order.
pub fn dir_name(began: SystemTime, comm: &str, pid: u32) -> String {
    let t: String = humantime::format_rfc3339_seconds(began)
        .to_string()
        .chars()
        .filter(|c| !matches!(c, '-' | ':'))
        .collect();
    let comm: String = (comm.chars())
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '.' | '_' => c,
            _ => '_',
        })
        .collect();
    format!("{t}-{comm}-{pid}")
}

/// Whether `name` is a capture's directory (only those are counted and pruned).
fn is_capture(name: &str) -> bool {
    let b = name.as_bytes();
    b.len() > 17
        && b[..8].iter().all(u8::is_ascii_digit)
        && b[8] == b'T'
        && name[15..].starts_with("Z-")
}

/// Bytes in the files of `dir` (a capture's, which has no subdirectory).
pub fn size_of_dir(dir: &Path) -> u64 {
    fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// The captures in `root`, oldest first, with their sizes.
pub fn captures(root: &Path) -> Vec<(PathBuf, u64)> {
    let mut v: Vec<(String, PathBuf)> = fs::read_dir(root)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .filter_map(|e| Some((e.file_name().into_string().ok()?, e.path())))
                .filter(|(n, _)| is_capture(n))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v.into_iter()
        .map(|(_, p)| {
            let n = size_of_dir(&p);
            (p, n)
        })
        .collect()
}

/// Removes the oldest captures (never `keep`) until those left hold at most `budget` bytes
/// plus `room`; returns how many went.
pub fn prune(root: &Path, budget: u64, room: u64, keep: Option<&Path>) -> usize {
    let all = captures(root);
    let mut held: u64 = all.iter().map(|(_, n)| n).sum();
    let mut removed = 0;
    for (p, n) in all {
        if held.saturating_add(room) <= budget {
            break;
        }
        if Some(p.as_path()) == keep {
            continue;
        }
        if fs::remove_dir_all(&p).is_ok() {
            held -= n;
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn directories_are_named_in_time_order_and_only_they_are_pruned() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_000_000);
        let name = dir_name(t, "node (vitest)", 1234);
        assert_eq!(name, "20261118T110640Z-node__vitest_-1234");
        assert!(is_capture(&name));
        assert!(!is_capture("lost+found") && !is_capture("20261118T082640Z"));

        let root = tempfile::tempdir().unwrap();
        let mut made = Vec::new();
        for (i, kib) in [300u64, 200, 100].iter().enumerate() {
            let d = root
                .path()
                .join(dir_name(t + Duration::from_secs(i as u64), "node", 7));
            fs::create_dir(&d).unwrap();
            fs::write(d.join("report.html"), vec![0u8; (*kib as usize) << 10]).unwrap();
            made.push(d);
        }
        let other = root.path().join("notes");
        fs::create_dir(&other).unwrap();
        fs::write(other.join("x"), vec![0u8; 1 << 20]).unwrap();
        // 600 KiB held, a budget of 250 KiB: the two oldest go, the newest stays.
        assert_eq!(prune(root.path(), 250 << 10, 0, None), 2);
        assert_eq!(captures(root.path()), vec![(made[2].clone(), 100 << 10)]);
        assert!(other.exists(), "what is not a capture is never removed");
        // Room for the next: the last goes too, unless it is the one kept.
        assert_eq!(prune(root.path(), 350 << 10, 300 << 10, Some(&made[2])), 0);
        assert_eq!(prune(root.path(), 350 << 10, 300 << 10, None), 1);
    }
}
