//! Helpers for the integration tests: the built binaries, workloads of known behaviour, and a
//! profiler handle, each an RAII guard that kills its child process when dropped (a failing
//! test leaves nothing behind).
//!
//! The tests load the real eBPF programs, so they need root; `cargo xtask test` builds the
//! binaries they run first. Everything a test uses is re-exported here.

mod binaries;
pub mod bpf_objects;
pub mod bpftrace;
mod browser;
mod checks;
pub mod containers;
mod ground_truth;
mod kernel;
pub mod lanes;
mod lookup;
pub mod nodes;
pub mod otelcol;
pub mod pprof;
mod profiler;
pub mod pyroscope;
pub mod scrape;
mod skip;
pub mod speed;
pub mod vitest;
mod workload;
pub mod write_count;

pub(crate) use binaries::built;
pub use binaries::{
    build_addon, build_spawner_addon, churn_bin, fixture, lock_ops_bin, profiler_bin, target_dir,
};
pub use browser::{
    assert_charts, assert_self_contained, charts, page_requests, rendered_charts, rendered_dom,
};
pub use checks::{
    LOST_EVENT_REASONS, assert_churn_total, assert_main_and_workers, assert_mmaps_named,
    check_churn_writes, check_lost, check_stats, churn_slack, mmap_samples, sampled_writes,
    shortfall,
};
pub use ground_truth::{
    RawThreads, exit_now, map_anon, map_anon_populated, map_touch_unmap, numeric_args,
    ready_then_wait_for_go,
};
pub use kernel::{KernelFeatures, in_matrix_guest, kernel_features};
pub use lookup::{
    cause_counts, cause_stats, find, finding, helper_threads, process, read_lines, stats, strings,
    thread, thread_writes,
};
pub use profiler::{
    Finished, Profiler, keep_output, profile_until_done, profile_workload, report_html,
    report_text, run_json, run_ok, run_profiler, stop_when_done,
};
pub use scrape::{metric_f64, metric_gauge, metric_sum, mmap_writes};
pub use skip::{
    SKIP_FILE_ENV, bpf_test, installed_or_skip, require_root_and_tracepoints, skip_because,
    under_ci,
};
pub use speed::scaled;
pub use workload::{Workload, roles_workload, roles_workload_sized, wait_until};
