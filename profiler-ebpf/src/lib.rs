//! Present so that `profiler` can name this crate as a build dependency (cargo then rebuilds the
//! eBPF object when it changes); the programs themselves are the `mmaplock` binary.
#![no_std]
