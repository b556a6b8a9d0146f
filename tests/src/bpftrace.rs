//! An independent count of contended waits on a process's own mmap_lock: a bpftrace script on
//! `lock:contention_begin/end`, written here from the kernel's BTF (the offset of
//! `mm_struct.mmap_lock` read with btf-rs, not with the profiler's code), run beside the
//! profiler, its maps parsed when it is stopped. The ground truth of contention mode.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Read},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
};

use serde_json::Value;

use crate::{
    check_lost, installed_or_skip, require_root_and_tracepoints, skip_because, write_count::STOP,
};

/// Waits counted, by (pid, tid, op): `op` 2 for a read, 4 for a write, as the tracepoint's
/// flags say.
pub type Counted = BTreeMap<(u32, u32, u32), Wait>;

/// Wait charged to holders, by (pid, holder tid, op), ns.
pub type Charged = BTreeMap<(u32, u32, u32), u64>;

/// What bpftrace counted, when stopped.
pub struct Tally {
    /// Contended waits, by (pid, tid, op).
    pub waits: Counted,
    /// Wait charged to each holder: by (pid, the holder's tid, op), the waits of each op that
    /// began while that writer held the lock (tid 0: readers held it, or the owner word named
    /// nobody).
    pub charged: Charged,
    /// The runs of its programs the kernel skipped (`recursion_misses`), any lock's: where
    /// tracepoint programs run preemptible (7.x) a run is skipped while another of the same
    /// program is in on that CPU, and a skipped begin or end is a wait it did not count. The
    /// profiler rescues such waits with its second copies (`lost.skipped` counts the rest).
    pub missed: u64,
}

/// The runs the kernel skipped of the BPF programs process `pid` holds, as their fdinfo says
/// (`recursion_misses`: a raw tracepoint's since 5.12, a perf-event tracepoint's, which is
/// what bpftrace attaches, since about 6.8; 0 where the kernel does not count them).
pub fn recursion_misses(pid: u32) -> u64 {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    let mut missed = 0;
    for fd in fds.flatten() {
        let is_prog = std::fs::read_link(fd.path())
            .is_ok_and(|l| l.to_string_lossy() == "anon_inode:bpf-prog");
        if !is_prog {
            continue;
        }
        let info = std::fs::read_to_string(format!(
            "/proc/{pid}/fdinfo/{}",
            fd.file_name().to_string_lossy()
        ))
        .unwrap_or_default();
        missed += info
            .lines()
            .filter_map(|l| l.strip_prefix("recursion_misses:"))
            .filter_map(|v| v.trim().parse::<u64>().ok())
            .sum::<u64>();
    }
    missed
}

/// Contended waits of one thread and op: how many, and their wait in all (ns).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Wait {
    pub count: u64,
    pub wait_ns: u64,
}

/// The offset of `mmap_lock` in the running kernel's `struct mm_struct` (inside an anonymous
/// struct there, whose fields the kernel may reorder).
pub fn mm_lock_offset() -> u64 {
    use btf_rs::{Btf, Type};
    fn find(btf: &Btf, s: &btf_rs::Struct, want: &str) -> Option<u32> {
        for m in &s.members {
            let name = btf.resolve_name(m).unwrap_or_default();
            if name == want {
                return Some(m.bit_offset());
            }
            if name.is_empty()
                && let Ok(Type::Struct(inner) | Type::Union(inner)) = btf.resolve_chained_type(m)
                && let Some(off) = find(btf, &inner, want)
            {
                return Some(m.bit_offset() + off);
            }
        }
        None
    }
    let btf = Btf::from_file("/sys/kernel/btf/vmlinux").expect("the kernel's BTF");
    btf.resolve_types_by_name("mm_struct")
        .expect("mm_struct")
        .into_iter()
        .find_map(|t| match t {
            Type::Struct(s) => find(&btf, &s, "mmap_lock"),
            _ => None,
        })
        .map(|bits| u64::from(bits / 8))
        .expect("mm_struct.mmap_lock in the kernel's BTF")
}

/// Does the running kernel have the lock contention tracepoints (Linux 5.19+)? If not, the
/// calling test is recorded as skipped (a failure under CI).
pub fn require_contention_tracepoints() -> bool {
    let btf = std::fs::read("/sys/kernel/btf/vmlinux").unwrap_or_default();
    let needle = b"btf_trace_contention_begin";
    if btf.windows(needle.len()).any(|w| w == needle) {
        return true;
    }
    skip_because("this kernel has no lock contention tracepoints (Linux 5.19+)");
    false
}

/// bpftrace running `script`, its output's lines on a channel that closes when it ends (its
/// errors echoed); killed by the caller.
pub fn spawn(bin: &Path, script: &str) -> (Child, mpsc::Receiver<String>) {
    let mut child = Command::new(bin)
        .args(["-e", script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start bpftrace");
    let (tx, out) = mpsc::channel();
    let stdout = child.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for l in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let mut stderr = child.stderr.take().expect("stderr");
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        if !s.trim().is_empty() {
            eprintln!("bpftrace: {}", s.trim());
        }
    });
    (child, out)
}

/// Where bpftrace is installed (`cargo xtask test` installs it).
pub fn bpftrace_bin() -> Option<PathBuf> {
    ["/usr/bin/bpftrace", "/usr/local/bin/bpftrace"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// bpftrace counting the contended waits of the processes `filter` selects (a bpftrace
/// predicate such as `pid == 123` or `comm == "cont-churn"`) on their own mmap_lock; killed
/// on drop.
pub struct ContentionCount {
    child: Child,
    out: mpsc::Receiver<String>,
}

impl ContentionCount {
    /// Started and attached; None when bpftrace is missing (the test is then skipped).
    pub fn start(filter: &str) -> Option<Self> {
        let bin = installed_or_skip(bpftrace_bin(), "bpftrace")?;
        if !std::path::Path::new("/sys/kernel/tracing/events/lock").exists() {
            skip_because(
                "tracefs is not mounted at /sys/kernel/tracing (cargo xtask test mounts it)",
            );
            return None;
        }
        // A wait is the thread's own lock's, from its begin to the end of the same lock: an
        // rwsem's internal spinlock contends inside the wait, and ends first. Its holder is
        // the writer the rwsem's owner word names as it begins (0: readers, or none).
        let script = format!(
            r#"tracepoint:lock:contention_begin
/ (args->flags == 2 || args->flags == 4) && ({filter}) && args->lock_addr == (uint64)curtask->mm + {off} /
{{
  @start[tid] = nsecs; @op[tid] = args->flags; @lock[tid] = args->lock_addr;
  $o = ((struct rw_semaphore *)args->lock_addr)->owner.counter;
  @holder[tid] = ($o & 1) || ($o & ~7) == 0 ? 0 : ((struct task_struct *)($o & ~7))->pid;
}}
tracepoint:lock:contention_end
/ @start[tid] && args->lock_addr == @lock[tid] /
{{
  @n[pid, tid, @op[tid]] = count();
  @w[pid, tid, @op[tid]] = sum(nsecs - @start[tid]);
  @hw[pid, @holder[tid], @op[tid]] = sum(nsecs - @start[tid]);
  delete(@start[tid]); delete(@op[tid]); delete(@lock[tid]); delete(@holder[tid]);
}}
tracepoint:syscalls:sys_enter_getpgid / pid == {me} && args->pid == {STOP} /
{{ exit(); }}
"#,
            off = mm_lock_offset(),
            me = std::process::id(),
        );
        let (mut child, out) = spawn(&bin, &script);
        // It attaches or ends (stdout then closes): no bound on how long it compiles (with
        // LLVM, in an emulated guest on a slow host, a minute or more).
        loop {
            match out.recv() {
                Ok(l) if l.starts_with("Attaching") => break,
                Ok(_) => {}
                Err(_) => panic!("bpftrace did not attach: {:?}", child.wait()),
            }
        }
        Some(ContentionCount { child, out })
    }

    /// Stops it (it prints its maps as it ends) and returns what it counted.
    pub fn stop(mut self) -> Tally {
        // Read while its programs are still loaded: after the workload, so every wait it
        // could have missed is in.
        let missed = recursion_misses(self.child.id());
        if missed > 0 {
            eprintln!("bpftrace: the kernel skipped its programs {missed} times");
        }
        // Told to end (it then prints its maps) by a `getpgid` of a pid that cannot exist,
        // not by a signal: a SIGINT before its handler was in was lost now and then, and
        // bpftrace 0.17 now and then did not end after one (write_count.rs). Asked again every
        // second until it ends ("Attaching" comes before every probe is in). No bound on its
        // end: a hang is caught by the suite's and the matrix's per-test limits, which name
        // the test.
        loop {
            // SAFETY: no process has that pid; the call only makes the probe fire.
            unsafe { libc::getpgid(STOP) };
            let again = std::time::Instant::now() + std::time::Duration::from_secs(1);
            while std::time::Instant::now() < again {
                if self.child.try_wait().expect("try_wait").is_some() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            if self.child.try_wait().expect("try_wait").is_some() {
                break;
            }
        }
        let (mut counted, mut charged) = (Counted::new(), Charged::new());
        // Every line it printed: the reader ends at its output's end.
        for l in self.out.iter() {
            match parse_entry(&l) {
                Some((Entry::Count, key, value)) => counted.entry(key).or_default().count = value,
                Some((Entry::Wait, key, value)) => counted.entry(key).or_default().wait_ns = value,
                Some((Entry::Holder, key, value)) => {
                    charged.insert(key, value);
                }
                None => {}
            }
        }
        Tally {
            waits: counted,
            charged,
            missed,
        }
    }
}

impl Drop for ContentionCount {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `@n[12, 13, 4]: 7` -> ((12, 13, 4), 7, true); `@w[...]` -> the wait sum.
/// Which of the script's maps a line is of.
enum Entry {
    Count,
    Wait,
    Holder,
}

fn parse_entry(line: &str) -> Option<(Entry, (u32, u32, u32), u64)> {
    let (map, rest) = line.split_once('[')?;
    let entry = match map {
        "@n" => Entry::Count,
        "@w" => Entry::Wait,
        "@hw" => Entry::Holder,
        _ => return None,
    };
    let (key, value) = rest.split_once("]:")?;
    let k: Vec<u32> = key
        .split(',')
        .map(|x| x.trim().parse().ok())
        .collect::<Option<_>>()?;
    let [pid, tid, op] = k[..] else { return None };
    Some((entry, (pid, tid, op), value.trim().parse().ok()?))
}

// What a contention-mode report says against what bpftrace counted.

/// Both counts' ops: the tracepoint's flags and the report's side.
pub const OPS: [(u32, &str); 2] = [(2, "read"), (4, "write")];

/// `a` is `b` within 1% (the same count, unless a wait began as the programs attached).
pub fn within(a: u64, b: u64, pct: f64) -> bool {
    (a as f64 - b as f64).abs() <= b as f64 * pct / 100.0
}

/// The process's own threads' contended waits in a contention-mode report (the profiler's
/// reads and foreign takers apart, as bpftrace's count of its own threads has them), by
/// (tid, op).
pub fn reported_waits(p: &Value) -> BTreeMap<(u32, u32), Wait> {
    let mut m = BTreeMap::new();
    for t in p["threads"].as_array().unwrap() {
        if t["role"] == "foreign" || t["role"] == "profiler" {
            continue;
        }
        for (op, side) in OPS {
            let count = t[side]["count"].as_u64().unwrap();
            if count > 0 {
                let w = Wait {
                    count,
                    wait_ns: t[side]["wait_ns"]["sum"].as_u64().unwrap(),
                };
                m.insert((t["tid"].as_u64().unwrap() as u32, op), w);
            }
        }
    }
    m
}

/// bpftrace's count of process `pid`, by (tid, op).
pub fn counted_of(counted: &Counted, pid: u32) -> BTreeMap<(u32, u32), Wait> {
    counted
        .iter()
        .filter(|((p, ..), _)| *p == pid)
        .map(|(&(_, tid, op), &w)| ((tid, op), w))
        .collect()
}

/// Every thread's contended waits, per op, as bpftrace counted them: the same count within
/// 1% (a wait may begin as one of the two programs attaches), and no thread in one count
/// missing from the other; the process's wait in all within what the two clocks can differ
/// by. Returns the total count.
///
/// `missed` is what is left of the runs the kernel skipped of bpftrace's programs
/// ([`Tally::missed`]): a thread may have more waits reported than bpftrace counted by up to
/// that many in all (each such wait taken from it), never fewer, and its sum is then not
/// compared (the waits bpftrace missed may be any length).
///
/// Both programs time the same interval, from `contention_begin` to `contention_end` of the
/// same thread, each with its own clock reads. A wait's two times differ only by what runs
/// between the two programs at each end: the other program (a few microseconds of BPF), an
/// interrupt, or, in an emulated guest, the host descheduling the vCPU between them. The
/// first two are a small share of the waits, hence 2%; the last has no bound of its own but
/// grows as the machine is slower, hence a per-wait allowance of 50 us on the reference
/// machine, scaled by the measured speed factor.
pub fn assert_same_waits(
    report: &BTreeMap<(u32, u32), Wait>,
    bpf: &BTreeMap<(u32, u32), Wait>,
    missed: &mut u64,
) -> u64 {
    let keys: std::collections::BTreeSet<_> = report.keys().chain(bpf.keys()).collect();
    let (mut total, mut compared, mut waited, mut timed) = (0, 0, 0, 0);
    for k in keys {
        let (r, b) = (
            report.get(k).copied().unwrap_or_default(),
            bpf.get(k).copied().unwrap_or_default(),
        );
        total += b.count;
        if within(r.count, b.count, 1.0) {
            compared += b.count;
            waited += b.wait_ns;
            timed += r.wait_ns;
            continue;
        }
        let more = r.count.saturating_sub(b.count);
        assert!(
            more > 0 && more <= *missed,
            "thread {} op {}: {} contended waits reported, {} counted by bpftrace \
             (whose programs the kernel skipped {} more times)",
            k.0,
            k.1,
            r.count,
            b.count,
            *missed
        );
        *missed -= more;
    }
    // A single stall can outweigh a few short waits (65 us over one 4 us wait, once), so the
    // sums are compared where there are enough waits to mean something.
    let per_wait_ns = crate::scaled(std::time::Duration::from_micros(50)).as_nanos() as f64;
    assert!(
        compared < 20
            || timed.abs_diff(waited) as f64
                <= waited as f64 * 0.02 + per_wait_ns * compared as f64,
        "{timed} ns of wait reported, {waited} ns timed by bpftrace, in {compared} waits \
         (allowed: 2% and {per_wait_ns} ns a wait)"
    );
    total
}

/// A contention-mode summary is said to be one, has no hold, and lost nothing.
pub fn assert_contention_summary(s: &Value) {
    assert_eq!(s["mode"], "contention", "{s}");
    assert!(!s.to_string().contains("hold_ns"), "no hold is measured");
    assert_eq!(check_lost(s), 0, "{}", s["lost"]);
}

pub fn contention_ready() -> bool {
    require_root_and_tracepoints() && require_contention_tracepoints()
}
