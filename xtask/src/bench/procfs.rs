//! What the benchmark reads about a process from the kernel: its BPF programs with the
//! kernel's run statistics, its CPU time and its memory.

use std::{
    collections::HashMap,
    fs,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    process::Child,
    time::Duration,
};

use anyhow::{Context as _, Result};

/// Restores `kernel.bpf_stats_enabled` when dropped.
pub struct BpfStats(String);

impl BpfStats {
    const PATH: &'static str = "/proc/sys/kernel/bpf_stats_enabled";

    pub fn enable() -> Result<Self> {
        let before = fs::read_to_string(Self::PATH).context("kernel.bpf_stats_enabled")?;
        fs::write(Self::PATH, "1").context("enable kernel.bpf_stats_enabled")?;
        Ok(BpfStats(before.trim().to_string()))
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = fs::write(Self::PATH, &self.0);
    }
}

/// Kills a child when dropped (an interrupted benchmark leaves nothing running).
pub struct Guard(pub Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One BPF program held by a process, with the kernel's statistics so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prog {
    pub id: u32,
    /// The kernel's name of the program (at most 15 characters), or `prog ID`.
    pub name: String,
    pub runs: u64,
    pub ns: u64,
}

/// The BPF programs a process holds, from its fdinfo (run count and time are there when
/// `kernel.bpf_stats_enabled` is on), with their names, by program id.
pub fn bpf_programs(pid: u32) -> Vec<Prog> {
    bpf_programs_named(pid, &mut HashMap::new())
}

/// [`bpf_programs`], asking the kernel only for the names not in `names` yet.
pub fn bpf_programs_named(pid: u32, names: &mut HashMap<u32, String>) -> Vec<Prog> {
    let mut progs = fdinfo_programs(pid);
    for p in &mut progs {
        p.name = names
            .entry(p.id)
            .or_insert_with(|| prog_name(p.id).unwrap_or_else(|| format!("prog {}", p.id)))
            .clone();
    }
    progs
}

/// mmap_lock tracepoints the process has attached programs to (its raw tracepoint links):
/// tells a tracer attached without the kernel's BPF statistics.
pub fn mmap_lock_links(pid: u32) -> usize {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return 0;
    };
    dir.flatten()
        .filter_map(|e| fs::read_to_string(e.path()).ok())
        .filter(|info| {
            info.lines().any(|l| {
                l.strip_prefix("tp_name:")
                    .is_some_and(|t| t.trim().starts_with("mmap_lock_"))
            })
        })
        .count()
}

fn fdinfo_programs(pid: u32) -> Vec<Prog> {
    let mut out: Vec<Prog> = Vec::new();
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return out;
    };
    for e in dir.flatten() {
        let Ok(info) = fs::read_to_string(e.path()) else {
            continue;
        };
        if !info.contains("prog_type:") {
            continue;
        }
        let field = |k: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(k))
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        let id = field("prog_id:").unwrap_or(0) as u32;
        // A program held through two fds is one program.
        if out.iter().any(|p| p.id == id) {
            continue;
        }
        out.push(Prog {
            id,
            name: String::new(),
            runs: field("run_cnt:").unwrap_or(0),
            ns: field("run_time_ns:").unwrap_or(0),
        });
    }
    out.sort_by_key(|p| p.id);
    out
}

/// A program's name, from `BPF_OBJ_GET_INFO_BY_FD` (fdinfo does not have it).
fn prog_name(id: u32) -> Option<String> {
    const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
    const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
    #[repr(C)]
    struct GetFdById {
        id: u32,
        next_id: u32,
        open_flags: u32,
    }
    #[repr(C)]
    struct InfoByFd {
        bpf_fd: u32,
        info_len: u32,
        info: u64,
    }
    let attr = GetFdById {
        id,
        next_id: 0,
        open_flags: 0,
    };
    // SAFETY: the attribute is a fully initialized bpf_attr prefix, holding no pointer.
    let fd = unsafe { bpf(BPF_PROG_GET_FD_BY_ID, &attr) };
    if fd < 0 {
        return None;
    }
    // SAFETY: the kernel just gave us this fd; we own it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // struct bpf_prog_info up to and including `char name[16]` at offset 64: the kernel fills
    // only the length asked for.
    let mut info = [0u8; 80];
    let attr = InfoByFd {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: info.len() as u32,
        info: info.as_mut_ptr() as u64,
    };
    // SAFETY: `info` outlives the call and is `info_len` bytes long.
    let r = unsafe { bpf(BPF_OBJ_GET_INFO_BY_FD, &attr) };
    if r < 0 {
        return None;
    }
    let name = &info[64..80];
    let len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    Some(String::from_utf8_lossy(&name[..len]).into_owned()).filter(|n| !n.is_empty())
}

/// The `bpf(2)` command `cmd` with `attr`, a `#[repr(C)]` prefix of `union bpf_attr` (the
/// kernel zero-extends what is not passed).
///
/// # Safety
/// Every pointer in `attr` must be valid for what `cmd` does with it during the call.
unsafe fn bpf<A>(cmd: libc::c_long, attr: &A) -> libc::c_long {
    // SAFETY: `attr` is `size_of::<A>()` readable bytes; its pointers are the caller's promise.
    unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *const A, size_of::<A>() as u32) }
}

fn status_kib(pid: u32, key: &str) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Resident memory now (VmRSS), in KiB.
/// Bytes in the kernel's kmalloc caches' active objects (`/proc/slabinfo`: active objects x
/// object size, summed over `kmalloc-*`): a difference of two readings is what the kernel
/// allocated meanwhile (BPF task storage comes from these caches; dentries, inodes and task
/// structs do not, so reading /proc meanwhile adds little).
pub fn slab_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/slabinfo").ok()?;
    Some(slab_bytes_of(&text))
}

fn slab_bytes_of(text: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with("kmalloc-"))
        .filter_map(|l| {
            let mut f = l.split_whitespace().skip(1);
            let active: u64 = f.next()?.parse().ok()?;
            let _num: u64 = f.next()?.parse().ok()?;
            let size: u64 = f.next()?.parse().ok()?;
            Some(active * size)
        })
        .sum()
}

pub fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS:")
}

/// Peak resident memory (VmHWM), in KiB.
pub fn peak_rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmHWM:")
}

/// CPU time (user and system) of the whole process so far, in clock ticks (10 ms here).
pub fn cpu_time(pid: u32) -> Duration {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name, which may contain spaces: utime is the 12th of them.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slab_usage_is_active_objects_times_their_size() {
        let text = "slabinfo - version: 2.1\n\
# name            <active_objs> <num_objs> <objsize> <objperslab> <pagesperslab> : tunables <limit> <batchcount> <sharedfactor> : slabdata <active_slabs> <num_slabs> <sharedavail>\n\
kmalloc-4k          1000   1008   4096    8    8 : tunables    0    0    0 : slabdata    126    126      0\n\
kmalloc-128          200    256    128   32    1 : tunables    0    0    0 : slabdata      8      8      0\n";
        assert_eq!(slab_bytes_of(text), 1000 * 4096 + 200 * 128);
    }

    #[test]
    fn own_cpu_and_memory_are_read_from_proc() {
        let me = std::process::id();
        let rss = rss_kib(me);
        assert!(rss > 0);
        // Read after: the peak so far is at least what was resident then.
        assert!(peak_rss_kib(me) >= rss);
        let t0 = cpu_time(me);
        let spin = std::time::Instant::now();
        while spin.elapsed() < Duration::from_millis(50) {
            std::hint::black_box(0u64);
        }
        assert!(cpu_time(me) >= t0);
        // This test process holds no BPF programs.
        assert!(bpf_programs(me).is_empty());
    }
}
