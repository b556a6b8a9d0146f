//! ROOT-ONLY: the project's own OCI image (`cargo xtask image`; `cargo xtask test` builds it
//! from the debug binary, packed as the dist tarball packs a release one, and names it in
//! MMAPLOCK_PROF_TEST_IMAGE), run by podman as docs/fleet.md says: the host's PID namespace,
//! only the four capabilities, read-only mounts of /sys/kernel/btf, /sys/fs/cgroup and
//! /sys/kernel/tracing. It profiles a node container (and the mmap-churn helper in another)
//! on the same host; two real Prometheus servers scrape it, one keeping classic histograms,
//! one ingesting native histograms instead (Prometheus 2.42's --enable-feature), both with
//! the shipped rules: every dashboard query and every recording rule returns data on both.

use std::{path::Path, time::Duration};

use integration_tests::{
    Workload,
    containers::{self, Container, RUN_ARGS},
    installed_or_skip, require_root_and_tracepoints,
    scrape::{Prometheus, dashboard_queries, free_port, prometheus_bin},
    skip_because, target_dir, wait_until,
};

/// CAP_DAC_READ_SEARCH (2), CAP_SYS_PTRACE (19), CAP_PERFMON (38), CAP_BPF (39).
const FOUR_CAPS: u64 = (1 << 2) | (1 << 19) | (1 << 38) | (1 << 39);

fn deploy(rel: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(rel)
        .canonicalize()
        .unwrap()
        .display()
        .to_string()
}

/// The recording rules of the shipped rules file (their names).
fn recorded_series() -> Vec<String> {
    std::fs::read_to_string(deploy("prometheus/mmaplock-rules.yml"))
        .unwrap()
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- record: "))
        .map(str::to_string)
        .collect()
}

/// Waits until `q` has a value on `prom` that `ok` accepts: a bound on what a broken agent
/// might never serve, 60 s on the reference machine, scaled (`Prometheus::wait_for`).
fn wait_for(prom: &Prometheus, q: &str, ok: impl Fn(f64) -> bool, what: &str) {
    prom.wait_for(q, Duration::from_secs(60), ok, what);
}

#[test]
fn the_image_profiles_a_node_container_for_prometheus_under_either_ingestion() {
    if !require_root_and_tracepoints() {
        return;
    }
    let Ok(image) = std::env::var("MMAPLOCK_PROF_TEST_IMAGE") else {
        skip_because(
            "no image of the project (cargo xtask test builds it: MMAPLOCK_PROF_TEST_IMAGE)",
        );
        return;
    };
    let Some(prom_bin) = installed_or_skip(prometheus_bin(), "prometheus") else {
        return;
    };
    let node_image = match containers::node_image() {
        Ok(t) => t,
        Err(why) => {
            skip_because(&format!("no node image: {why}"));
            return;
        }
    };
    let parent = "/libpod_parent";
    let port = free_port();
    let agent = Container::new_name("agent");
    containers::output(
        containers::podman()
            .args(["run", "-d", "--name", &agent.name])
            .args(RUN_ARGS)
            .args(["--pid=host", "--network=host", "--cgroupns=host"])
            // Podman's default seccomp profile allows bpf(2) only with CAP_SYS_ADMIN.
            .args(["--security-opt", "seccomp=unconfined", "--cap-drop=all"])
            .arg("--cap-add=CAP_BPF,CAP_PERFMON,CAP_SYS_PTRACE,CAP_DAC_READ_SEARCH")
            .args(["-v", "/sys/kernel/btf:/sys/kernel/btf:ro"])
            .args(["-v", "/sys/fs/cgroup:/sys/fs/cgroup:ro"])
            .args(["-v", "/sys/kernel/tracing:/sys/kernel/tracing:ro"])
            .arg(&image)
            .args(["agent", "--listen", &format!("127.0.0.1:{port}")])
            // Full mode: the exact counts below are every acquisition's. (Contention mode,
            // the default, is tested on the dashboard and the rules in contention_views.rs,
            // and with exactly these capabilities in privileges.rs.)
            .args(["--mode", "full"])
            .args(["--cgroup", parent, "-i", "0.5", "--blockers"]),
    )
    .expect("podman run the image");
    let metrics = format!("http://127.0.0.1:{port}/metrics");
    // It serves or ends, its container then stopped: no bound on how long attaching takes.
    while ureq::get(&metrics).call().is_err() {
        if agent.host_pid() == 0 {
            let logs = containers::output(containers::podman().args(["logs", &agent.name]));
            panic!("the agent ended before it served: {logs:?}");
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    // Exactly the four capabilities, effective.
    let pid = agent.host_pid();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .map(|h| u64::from_str_radix(h.trim(), 16).unwrap())
        .unwrap();
    assert_eq!(eff, FOUR_CAPS, "CapEff {eff:016x}");

    let rules = deploy("prometheus/mmaplock-rules.yml");
    let config = format!(
        "  - job_name: mmaplock\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\nrule_files:\n  - {rules}\n"
    );
    let classic = Prometheus::start_scraping(&prom_bin, &config, &[]);
    let native =
        Prometheus::start_scraping(&prom_bin, &config, &["--enable-feature=native-histograms"]);

    // A node container (Workers, threadpool, V8 threads) and mmap-churn in another (writes
    // against reads: contention, failed trylocks), both under podman's cgroup parent.
    let data = tempfile::tempdir().unwrap();
    let node = Container::new_name("node");
    let mut w = Workload::spawn(node.roles_command(&node_image, data.path(), 2000));
    let churn = Container::new_name("churn");
    let mut c = Workload::spawn(churn.run_command(
        &node_image,
        &[
            "-v",
            &format!("{}:/helpers:ro", target_dir().display()),
            "--entrypoint",
            "/helpers/mmap-churn",
        ],
        &["2", "20000", "65536"],
    ));
    w.go();
    c.go();
    assert!(w.wait().success());
    assert!(c.wait().success());
    for (prom, what) in [(&classic, "classic"), (&native, "native")] {
        // node's Workers' writes, labelled node in its container's cgroup.
        wait_for(
            prom,
            "sum(mmaplock_acquisitions_total{process=\"node\",role=\"worker\",op=\"write\",cgroup=~\"/libpod_parent/.+\"})",
            |v| v > 0.0,
            what,
        );
        wait_for(
            prom,
            "sum(mmaplock_acquisitions_total{process=\"mmap-churn\",op=\"write\",cause=\"mmap\"})",
            |v| v >= 40_000.0,
            what,
        );
    }
    let queries = dashboard_queries();
    let records = recorded_series();
    assert!(records.len() >= 30, "{records:?}");
    // Every dashboard query and every recording rule has data, once a few more scrapes and
    // rule evaluations (every second) have come after the work, for every rate(). One that
    // never has is broken: a bound, 60 s on the reference machine, scaled by wait_until.
    for (prom, what) in [(&classic, "classic"), (&native, "native")] {
        let expected: Vec<&str> = queries
            .iter()
            .filter(|(_, optional)| !optional)
            .map(|(q, _)| q.as_str())
            .chain(
                records
                    .iter()
                    .filter(|r| {
                        // The BPF run-time series need the kernel's BPF statistics
                        // (CAP_SYS_ADMIN). And the p99's inputs are kept as classic buckets
                        // or as a native histogram, whichever this Prometheus ingests.
                        let classic_only = r.ends_with("_bucket:rate5m");
                        let native_only = r.ends_with(":mmaplock_write_wait_seconds:rate5m");
                        !(r.contains("bpf")
                            || (what == "native" && classic_only)
                            || (what == "classic" && native_only))
                    })
                    .map(String::as_str),
            )
            .collect();
        wait_until(Duration::from_secs(60), Duration::from_millis(500), || {
            let empty: Vec<&&str> = expected
                .iter()
                .filter(|q| prom.query(q).is_empty())
                .collect();
            match empty.is_empty() {
                true => Ok(()),
                false => Err(format!("{what}: no data for {empty:?}")),
            }
        });
    }
    // The ingestion is what each was told: classic buckets only in one, native only in the other.
    assert!(!classic.query("mmaplock_wait_seconds_bucket").is_empty());
    assert!(
        classic
            .query("histogram_count(mmaplock_wait_seconds)")
            .is_empty()
    );
    assert!(native.query("mmaplock_wait_seconds_bucket").is_empty());
    assert!(
        !native
            .query("histogram_count(mmaplock_wait_seconds)")
            .is_empty()
    );
}
