//! The host's BPF programs, seen without bpftool: enumerated with `BPF_PROG_GET_NEXT_ID`,
//! named with `BPF_OBJ_GET_INFO_BY_FD`, and which of them a live process holds (a program or
//! link descriptor's `prog_id` in `/proc/*/fdinfo`). A program nobody holds any more is
//! freed by the kernel within moments; one still there after that was left in the kernel.

use std::collections::{BTreeMap, BTreeSet};

const BPF_PROG_GET_NEXT_ID: libc::c_long = 11;
const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;

fn bpf(cmd: libc::c_long, attr: &mut [u8; 128]) -> libc::c_long {
    // SAFETY: `attr` is a zero-padded bpf_attr of the size passed.
    unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len()) }
}

/// Every BPF program on the host: id -> name (the kernel keeps 15 bytes of it).
pub fn programs() -> BTreeMap<u32, String> {
    let mut out = BTreeMap::new();
    let mut id = 0u32;
    loop {
        let mut attr = [0u8; 128];
        attr[..4].copy_from_slice(&id.to_ne_bytes());
        if bpf(BPF_PROG_GET_NEXT_ID, &mut attr) != 0 {
            return out;
        }
        id = u32::from_ne_bytes(attr[4..8].try_into().unwrap());
        let mut attr = [0u8; 128];
        attr[..4].copy_from_slice(&id.to_ne_bytes());
        let fd = bpf(BPF_PROG_GET_FD_BY_ID, &mut attr);
        if fd < 0 {
            continue; // freed meanwhile
        }
        let mut info = [0u8; 256];
        let mut attr = [0u8; 128];
        attr[..4].copy_from_slice(&(fd as u32).to_ne_bytes());
        attr[4..8].copy_from_slice(&(info.len() as u32).to_ne_bytes());
        attr[8..16].copy_from_slice(&(info.as_mut_ptr() as u64).to_ne_bytes());
        let ok = bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr) == 0;
        // SAFETY: closing the descriptor the kernel just gave us.
        unsafe { libc::close(fd as i32) };
        if ok {
            // struct bpf_prog_info: name[16] at offset 64.
            let name = &info[64..80];
            let end = name.iter().position(|&b| b == 0).unwrap_or(16);
            out.insert(id, String::from_utf8_lossy(&name[..end]).into_owned());
        }
    }
}

/// The program ids that live processes hold (programs and links), by process.
pub fn held() -> BTreeMap<u32, BTreeSet<u32>> {
    let mut out: BTreeMap<u32, BTreeSet<u32>> = BTreeMap::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(p.path().join("fdinfo")) else {
            continue;
        };
        for fd in fds.flatten() {
            let text = std::fs::read_to_string(fd.path()).unwrap_or_default();
            for l in text.lines() {
                if let Some(id) = l.strip_prefix("prog_id:")
                    && let Ok(id) = id.trim().parse()
                {
                    out.entry(pid).or_default().insert(id);
                }
            }
        }
    }
    out
}

/// The names of the programs process `pid` holds.
pub fn names_held_by(pid: u32) -> BTreeSet<String> {
    let all = programs();
    held()
        .remove(&pid)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|id| all.get(&id).cloned())
        .collect()
}

/// Programs named in `names` that no live process holds, after giving the kernel up to
/// `grace` on the reference machine ([`crate::scaled`]) to free what was just released.
pub fn orphans(names: &BTreeSet<String>, grace: std::time::Duration) -> Vec<(u32, String)> {
    let deadline = std::time::Instant::now() + crate::scaled(grace);
    loop {
        let holders: BTreeSet<u32> = held().into_values().flatten().collect();
        let left: Vec<(u32, String)> = programs()
            .into_iter()
            .filter(|(id, n)| names.contains(n) && !holders.contains(id))
            .collect();
        if left.is_empty() || std::time::Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}
