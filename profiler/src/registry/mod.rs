//! Per-process state, keyed by (pid, start time) and (tid, start time): names, thread roles
//! (start routines), mappings, unwinders and sampled stacks. Filled while processes live,
//! evicted when they exit; it attributes what the kernel side counted.

pub mod addonlibs;
pub mod cgroups;
pub mod cpus;
pub mod exes;
pub mod names;
pub mod perfmap;
pub mod procmaps;
pub mod reads;
pub mod role;
pub mod roles;
pub mod stacks;
pub mod start_names;
pub mod threadstart;
pub mod untrusted;
pub mod unwind;
pub mod v8;

use names::ProcessNames;
use roles::Roles;

/// The registry's caches that reports draw on: process names, cgroups and executables,
/// thread roles.
#[derive(Default)]
pub struct Registry {
    pub names: ProcessNames,
    pub cgroups: cgroups::CgroupNames,
    pub exes: exes::Executables,
    pub cpus: cpus::CpuAllowances,
    pub roles: Roles,
}
