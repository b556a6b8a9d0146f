//! The kernel side, as userspace sees it: what the running kernel offers (BTF offsets,
//! tracepoint layout, version), loading and attaching the eBPF programs, and reading their
//! maps and ring buffers. Everything downstream gets plain data from here, through the
//! [`Kernel`] trait, which unit tests replace by a scripted kernel (`fake`).

mod batch;
pub mod btf;
pub mod collector;
pub mod ebpf_log;
#[cfg(test)]
pub mod fake;
pub mod features;
pub mod load;
pub mod priority;
pub mod privilege;
pub mod procmap_query;
pub mod programs;
pub mod pthread;
mod rates;
pub mod readings;
pub mod regs;
pub mod selection;
pub mod selectors;
pub mod skipped;
mod stopwatch;
pub mod vmlinux;
pub mod vmread;

pub use readings::Kernel;
