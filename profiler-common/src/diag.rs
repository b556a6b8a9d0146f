//! The eBPF programs' rare diagnostics, logged with aya-log (docs/cli.md, `--log-level`).

/// Their `log` target: under the binary's own (`mmaplock_prof`), so that
/// `RUST_LOG=mmaplock_prof=debug` takes them in with the rest.
pub const LOG_TARGET: &str = "mmaplock_prof::ebpf";
/// Each diagnostic is logged once a run: one flag per [`crate::counter`] (their first
/// non-zero), then [`ITER_LEFT_PENDING`], then one per syscall number from
/// [`SYSCALLS_AT`] (the last one standing for every larger number).
pub const ITER_LEFT_PENDING: u32 = crate::counter::COUNT;
pub const SYSCALLS_AT: u32 = 32;
pub const SYSCALLS: u32 = 512;
/// Entries of the eBPF side's once-flags map.
pub const FLAGS: u32 = SYSCALLS_AT + SYSCALLS;
const _: () = assert!(ITER_LEFT_PENDING < SYSCALLS_AT);
