//! What the profiler read of a process, counted by kind, because each read may take the
//! process's `mmap_lock` (which reads do on which kernel: `procmaps::query`, `v8::memory`).
//! Counted where the reads are made (thread roles, each unwinder); the run adds them up per
//! process for the summary (`read_by_profiler` in docs/report-format.md).

use std::ops::AddAssign;

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reads {
    /// `/proc/PID/maps` read whole: once per reader at first (thread roles, stack
    /// unwinding), then again only as `procmaps::live` allows.
    pub maps: u64,
    /// Mappings asked for alone (`PROCMAP_QUERY`, Linux 6.11+).
    pub map_queries: u64,
    /// `process_vm_readv` calls: V8's heap (names of JavaScript frames) and threads' start
    /// routines.
    pub memory: u64,
    /// The ranges those calls read: the kernel takes the lock for each (more than once for a
    /// range of many pages).
    pub memory_ranges: u64,
    /// V8 objects not read but taken from the copies the eBPF side made at the samples, from
    /// the sampled thread's own memory (no acquisition): what `memory_ranges` would have
    /// been higher by, about.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub v8_copied: u64,
    /// Application scripts whose line ends were those of the same source read whole in
    /// another isolate: only its two ends read (`v8::scripts`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub v8_sources_shared: u64,
    /// V8 functions named from one sample's copies (their name, Script and the Script's
    /// name copied at the sample): not read again now.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub v8_named_at_sample: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Reads {
    pub fn is_empty(&self) -> bool {
        *self == Reads::default()
    }
}

impl AddAssign for Reads {
    fn add_assign(&mut self, o: Reads) {
        self.maps += o.maps;
        self.map_queries += o.map_queries;
        self.memory += o.memory;
        self.memory_ranges += o.memory_ranges;
        self.v8_copied += o.v8_copied;
        self.v8_sources_shared += o.v8_sources_shared;
        self.v8_named_at_sample += o.v8_named_at_sample;
    }
}
