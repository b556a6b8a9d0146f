//! Which code takes the lock for write: sampled user stacks (`--stack-sample`, `--stacks`),
//! unwound and symbolized (see `unwind`), charged to the code that asked for memory.
//!
//! Each write is charged to a DSO: the first frame, from the innermost, outside the C and C++
//! runtimes (libc, ld.so, libstdc++, libgcc_s, libpthread): the code that called malloc or
//! mmap. That is the node binary, a `*.node` addon, another library, or `[jit]` for V8's
//! generated code (anonymous executable memory).

use std::{
    collections::{BTreeMap, HashMap},
    fmt::Write as _,
    path::Path,
};

use profiler_common::{SampleDone, StackSample, stack_record};

use crate::{
    aggregation::SideStats,
    unwind::{Frame, ProcessUnwinder, Shared},
};

/// Deepest stack kept.
const MAX_FRAMES: usize = 64;

/// The C and C++ runtimes: frames in them are skipped when charging a write.
fn is_runtime(dso: &Path) -> bool {
    let Some(name) = dso.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    [
        "libc.so",
        "libc-",
        "ld-linux",
        "ld-",
        "libstdc++",
        "libgcc_s",
        "libpthread",
    ]
    .iter()
    .any(|p| name.starts_with(p))
}

/// How a frame is shown: `function (file)`.
fn frame_label(f: &Frame) -> String {
    let file = f
        .dso
        .as_deref()
        .and_then(|d| d.file_name())
        .map(|n| n.to_string_lossy().into_owned());
    match (&f.symbol, file) {
        (Some(s), Some(file)) => format!("{s} ({file})"),
        (Some(s), None) => s.clone(),
        (None, Some(file)) => format!("{:#x} ({file})", f.addr),
        (None, None) => "[jit]".to_string(),
    }
}

/// The DSO a write is charged to (see the module doc).
pub fn charge(frames: &[Frame]) -> String {
    for f in frames {
        match &f.dso {
            Some(d) if is_runtime(d) => continue,
            Some(d) => return d.display().to_string(),
            None => return "[jit]".to_string(),
        }
    }
    "[unknown]".to_string()
}

/// A distinct stack's totals.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StackAgg {
    pub count: u64,
    pub wait_ns_sum: u64,
}

/// One process's sampled writes by code.
#[derive(Clone, Debug, Default)]
pub struct OwnerStacks {
    pub dsos: BTreeMap<String, SideStats>,
    /// Frames innermost first, symbolized (filled by [`StackAttribution::symbolize`]).
    pub stacks: HashMap<Vec<String>, StackAgg>,
    /// Stacks as addresses of process `tgid`, not yet symbolized.
    raw: HashMap<(u32, Vec<u64>), StackAgg>,
}

struct Pending {
    owner: u32,
    tgid: u32,
    addrs: Vec<u64>,
    dso: String,
}

/// Consumes the STACKS ring buffer and keeps what it says per process. The work per sample
/// is kept small (unwinding, and the mappings for the DSO), so that the ring buffer is
/// drained quickly; symbolizing waits for the report.
#[derive(Default)]
pub struct StackAttribution {
    shared: Shared,
    unwinders: HashMap<u32, Option<ProcessUnwinder>>,
    pending: HashMap<(u32, u32), Pending>,
    owners: BTreeMap<u32, OwnerStacks>,
    /// Samples whose outcome never came (the profiler stopped first, or a record was lost).
    pub unmatched: u64,
}

fn read_record<T: Copy>(bytes: &[u8]) -> Option<T> {
    if bytes.len() < std::mem::size_of::<T>() {
        return None;
    }
    // SAFETY: T is a repr(C) plain-old-data record type and `bytes` is at least that long;
    // the ring buffer only guarantees 8-byte alignment, so read unaligned.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

impl StackAttribution {
    /// One ring buffer record.
    pub fn on_record(&mut self, bytes: &[u8]) {
        let Some(tag) = read_record::<u32>(bytes) else {
            return;
        };
        match tag {
            stack_record::SAMPLE => {
                // Boxed: the record is 16 KiB.
                if let Some(s) = read_record::<StackSample>(bytes).map(Box::new) {
                    self.on_sample(&s);
                }
            }
            stack_record::DONE => {
                if let Some(d) = read_record::<SampleDone>(bytes) {
                    self.on_done(&d);
                }
            }
            _ => {}
        }
    }

    /// Reads a process's unwind information now (it takes a while for a big binary), rather
    /// than when its first sample arrives.
    pub fn prepare(&mut self, pid: u32) {
        let _ = self.unwinder(pid);
    }

    fn unwinder(&mut self, tgid: u32) -> Option<&mut ProcessUnwinder> {
        let shared = &self.shared;
        self.unwinders
            .entry(tgid)
            .or_insert_with(|| match ProcessUnwinder::new(tgid, shared.clone()) {
                Ok(u) => Some(u),
                Err(e) => {
                    log::debug!("no unwinder for {tgid}: {e}");
                    None
                }
            })
            .as_mut()
    }

    fn on_sample(&mut self, s: &StackSample) {
        let len = (s.stack_len as usize).min(s.stack.len());
        let stack = &s.stack[..len];
        let (addrs, dso) = match self.unwinder(s.tgid) {
            Some(u) => {
                // A library mapped since we read the maps (an addon's dlopen): read again.
                if u.mapping(s.ip).is_none() {
                    let _ = u.refresh();
                }
                let addrs = u.unwind(s.ip, s.sp, s.bp, stack, MAX_FRAMES);
                let frames: Vec<Frame> = addrs
                    .iter()
                    .map(|&addr| Frame {
                        addr,
                        symbol: None,
                        dso: u.mapping(addr).and_then(|m| m.path.clone()),
                    })
                    .collect();
                (addrs, charge(&frames))
            }
            None => (vec![s.ip], "[unknown]".to_string()),
        };
        self.pending.insert(
            (s.tid, s.seq),
            Pending {
                owner: s.owner,
                tgid: s.tgid,
                addrs,
                dso,
            },
        );
    }

    fn on_done(&mut self, d: &SampleDone) {
        let Some(p) = self.pending.remove(&(d.tid, d.seq)) else {
            self.unmatched += 1;
            return;
        };
        let o = self.owners.entry(p.owner).or_default();
        let s = o.dsos.entry(p.dso).or_default();
        s.count += 1;
        s.wait.sum += d.wait_ns;
        s.wait.max = s.wait.max.max(d.wait_ns);
        s.wait.add(profiler_common::bucket_index(d.wait_ns), 1);
        s.hold.sum += d.hold_ns;
        s.hold.max = s.hold.max.max(d.hold_ns);
        s.hold.add(profiler_common::bucket_index(d.hold_ns), 1);
        let st = o.raw.entry((p.tgid, p.addrs)).or_default();
        st.count += 1;
        st.wait_ns_sum += d.wait_ns;
    }

    /// Names the stacks gathered so far (on the ELF files, so exited processes are fine).
    pub fn symbolize(&mut self) {
        for o in self.owners.values_mut() {
            for ((tgid, addrs), agg) in o.raw.drain() {
                let frames = match self.unwinders.get_mut(&tgid).and_then(Option::as_mut) {
                    Some(u) => u.symbolize_stack(&addrs),
                    None => addrs
                        .iter()
                        .map(|&addr| Frame {
                            addr,
                            symbol: None,
                            dso: None,
                        })
                        .collect(),
                };
                let labels: Vec<String> = frames.iter().map(frame_label).collect();
                let st = o.stacks.entry(labels).or_default();
                st.count += agg.count;
                st.wait_ns_sum += agg.wait_ns_sum;
            }
        }
    }

    pub fn owner(&self, pid: u32) -> Option<&OwnerStacks> {
        self.owners.get(&pid)
    }

    /// Folded stacks (`process;outermost;...;innermost count`), for flame graph tools. Call
    /// [`symbolize`](Self::symbolize) first.
    pub fn folded(&self, comm_of: impl Fn(u32) -> String) -> String {
        let mut out = String::new();
        for (pid, o) in &self.owners {
            let mut stacks: Vec<_> = o.stacks.iter().collect();
            stacks.sort_by(|a, b| a.0.cmp(b.0));
            for (frames, agg) in stacks {
                let _ = write!(out, "{}-{pid}", comm_of(*pid));
                for f in frames.iter().rev() {
                    out.push(';');
                    // `;` separates frames and a space the count: keep them out of names.
                    out.push_str(&f.replace(';', ":").replace(' ', "_"));
                }
                let _ = writeln!(out, " {}", agg.count);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn f(symbol: Option<&str>, dso: Option<&str>) -> Frame {
        Frame {
            addr: 0x1000,
            symbol: symbol.map(String::from),
            dso: dso.map(PathBuf::from),
        }
    }

    #[test]
    fn writes_are_charged_past_the_c_runtime() {
        let libc = Some("/usr/lib/x86_64-linux-gnu/libc.so.6");
        let frames = [
            f(Some("mmap64"), libc),
            f(Some("sysmalloc"), libc),
            f(
                Some("operator new"),
                Some("/usr/lib/x86_64-linux-gnu/libstdc++.so.6.0.30"),
            ),
            f(Some("churn"), Some("/tmp/a/build/Release/churn.node")),
            f(Some("node::Start"), Some("/usr/bin/node")),
        ];
        assert_eq!(charge(&frames), "/tmp/a/build/Release/churn.node");
        let jit = [
            f(Some("mprotect"), libc),
            f(None, None),
            f(None, Some("/usr/bin/node")),
        ];
        assert_eq!(charge(&jit), "[jit]");
        assert_eq!(charge(&[f(Some("mmap64"), libc)]), "[unknown]");
        assert_eq!(charge(&[]), "[unknown]");
    }

    #[test]
    fn frames_read_naturally() {
        assert_eq!(
            frame_label(&f(Some("uv_fs_read"), Some("/usr/bin/node"))),
            "uv_fs_read (node)"
        );
        assert_eq!(frame_label(&f(None, None)), "[jit]");
        assert_eq!(
            frame_label(&f(None, Some("/lib/libz.so.1"))),
            "0x1000 (libz.so.1)"
        );
    }

    #[test]
    fn outcomes_join_their_stacks_and_fold() {
        let mut a = StackAttribution::default();
        // A pending sample of a process that does not exist: no unwinder, the ip alone.
        a.pending.insert(
            (7, 1),
            Pending {
                owner: 5,
                tgid: 5,
                addrs: vec![0x1234],
                dso: "[jit]".into(),
            },
        );
        a.unwinders.insert(5, None);
        a.on_done(&SampleDone {
            tag: stack_record::DONE,
            tid: 7,
            seq: 1,
            _pad: 0,
            wait_ns: 900,
            hold_ns: 100,
        });
        a.on_done(&SampleDone {
            tag: stack_record::DONE,
            tid: 7,
            seq: 2,
            _pad: 0,
            wait_ns: 1,
            hold_ns: 1,
        });
        assert_eq!(a.unmatched, 1);
        let o = a.owner(5).unwrap();
        assert_eq!(o.dsos["[jit]"].count, 1);
        assert_eq!(o.dsos["[jit]"].wait.sum, 900);
        a.symbolize();
        assert_eq!(a.folded(|_| "node".into()), "node-5;[jit] 1\n");
    }
}
