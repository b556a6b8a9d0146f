//! What the running kernel offers, as `mmaplock-prof --probe-kernel` reports it: tests whose
//! expectations depend on a kernel feature (whether page faults take mmap_lock, whether
//! `--blockers` can run) ask here, never the kernel's version.

use std::sync::OnceLock;

use crate::profiler_bin;

/// The probes' lines and the exit status of `--probe-kernel`.
#[derive(Clone, Debug)]
pub struct KernelFeatures {
    pub text: String,
    /// 0: every mode runs; 1: refused.
    pub status: i32,
}

impl KernelFeatures {
    /// The value of line `name: value`, if printed.
    pub fn value(&self, name: &str) -> Option<&str> {
        self.text
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(": "))
    }

    fn yes(&self, name: &str) -> bool {
        self.value(name)
            .unwrap_or_else(|| panic!("--probe-kernel printed no {name:?}:\n{}", self.text))
            == "yes"
    }

    /// Per-VMA locks: most user page faults do not take mmap_lock (6.4+), so a workload's
    /// read acquisitions are far fewer.
    pub fn per_vma_locks(&self) -> bool {
        self.yes("per-VMA locks (few page faults take mmap_lock)")
    }

    /// Tracepoint programs run preemptible (Linux 7.x): the kernel may skip one, and what
    /// the second copies do not rescue is counted in `lost.skipped`.
    pub fn programs_may_be_skipped(&self) -> bool {
        self.yes("preemptible tracepoint programs (second copies)")
    }

    /// `PROCMAP_QUERY` (6.11+), unless turned off: the profiler looks a mapping it does not
    /// know up alone instead of reading the whole map again.
    pub fn procmap_query(&self) -> bool {
        self.yes("PROCMAP_QUERY (a mapping looked up alone)")
    }

    /// `bpf_loop`, which `--blockers` needs.
    pub fn bpf_loop(&self) -> bool {
        self.yes("bpf_loop (--blockers)")
    }

    /// The architecture whose saved registers and thread pointer the profiler found in the
    /// kernel's BTF (`x86_64`, `arm64`, or `unknown (...)`): causes, stacks and roles by
    /// start routine need one it knows.
    pub fn architecture(&self) -> &str {
        self.value("architecture (causes, stacks, roles by start routine)")
            .unwrap_or_else(|| panic!("--probe-kernel printed no architecture:\n{}", self.text))
    }

    /// The verdict line's text (`every mode runs`, or the refusal).
    pub fn verdict(&self) -> &str {
        self.value("verdict")
            .unwrap_or_else(|| panic!("--probe-kernel printed no verdict:\n{}", self.text))
    }
}

/// The running kernel's features, probed once per test binary.
pub fn kernel_features() -> &'static KernelFeatures {
    static F: OnceLock<KernelFeatures> = OnceLock::new();
    F.get_or_init(|| {
        let out = std::process::Command::new(profiler_bin())
            .arg("--probe-kernel")
            .output()
            .expect("run mmaplock-prof --probe-kernel");
        KernelFeatures {
            text: String::from_utf8_lossy(&out.stdout).into_owned(),
            status: out.status.code().unwrap_or(-1),
        }
    })
}

/// Running inside the kernel matrix's guest (emulated, slow: `cargo xtask test` sets it
/// there), where tests take smaller loads with the same exact assertions.
pub fn in_matrix_guest() -> bool {
    std::env::var_os("MMAPLOCK_PROF_TEST_GUEST").is_some()
}
