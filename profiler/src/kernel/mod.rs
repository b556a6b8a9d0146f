//! The kernel side, as userspace sees it: what the running kernel offers (BTF offsets,
//! tracepoint layout, version), loading and attaching the eBPF programs, and reading their
//! maps and ring buffers. Everything downstream gets plain data from here.

mod batch;
pub mod btf;
pub mod collector;
pub mod ebpf_log;
pub mod load;
pub mod minkernel;
pub mod selectors;
