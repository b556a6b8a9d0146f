//! The shipped deployment files: Prometheus rules checked and unit-tested with promtool (from
//! the Debian `prometheus` package, which `cargo xtask test` installs when missing), and the
//! Grafana dashboard well-formed, every panel with a query.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use integration_tests::{installed_or_skip, skip_because};
use serde_json::Value;

fn deploy(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(rel)
}

fn promtool() -> Option<PathBuf> {
    ["/usr/bin/promtool", "/usr/local/bin/promtool"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// Runs `cmd` to its end: whether it succeeded, and what it printed (standard output, then
/// standard error).
fn outcome(cmd: &mut Command) -> (bool, String) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn run(tool: &Path, args: &[&str]) -> String {
    let (ok, text) = outcome(Command::new(tool).args(args));
    assert!(ok, "promtool {args:?} failed:\n{text}");
    text
}

#[test]
fn the_rules_pass_promtool_check_and_their_unit_tests() {
    let Some(tool) = installed_or_skip(promtool(), "promtool") else {
        return;
    };
    let rules = deploy("prometheus/mmaplock-rules.yml");
    let text = run(&tool, &["check", "rules", rules.to_str().unwrap()]);
    assert!(text.contains("SUCCESS"), "{text}");
    let tests = deploy("prometheus/mmaplock-rules.test.yml");
    let text = run(&tool, &["test", "rules", tests.to_str().unwrap()]);
    assert!(text.contains("SUCCESS"), "{text}");
    let config = deploy("prometheus/prometheus-example.yml");
    run(
        &tool,
        &["check", "config", "--syntax-only", config.to_str().unwrap()],
    );
}

#[test]
fn the_dashboard_is_importable_and_every_panel_has_a_query() {
    let text = std::fs::read_to_string(deploy("grafana/mmaplock-dashboard.json")).unwrap();
    let d: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    assert!(d["schemaVersion"].as_u64().unwrap() >= 36);
    assert!(d["title"].as_str().is_some_and(|t| !t.is_empty()));
    let mut panels = 0;
    fn walk(v: &Value, panels: &mut usize) {
        for p in v.as_array().into_iter().flatten() {
            walk(&p["panels"], panels);
            if p["type"] == "row" {
                continue;
            }
            *panels += 1;
            let exprs: Vec<&str> = p["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t["expr"].as_str())
                .collect();
            assert!(
                !exprs.is_empty() || p["type"] == "text",
                "panel {:?} has no query",
                p["title"]
            );
        }
    }
    walk(&d["panels"], &mut panels);
    assert!(panels >= 15, "{panels} panels");
    // The heatmap of write waits over the kernel's buckets is there.
    assert!(text.contains("mmaplock_wait_seconds_bucket"));
}

/// Runs the Kubernetes validator (`fixtures/validate-k8s.mjs`, on the npm packages
/// `kubernetes-models` and `@kubernetes-models/prometheus-operator`, which `cargo xtask test`
/// installs) on `files`: whether all passed, and what it printed.
fn validate_k8s(dir: &Path, files: &[PathBuf]) -> (bool, String) {
    outcome(
        Command::new("node")
            .env("K8S_VALIDATOR_DIR", dir)
            .arg(integration_tests::fixture("validate-k8s.mjs"))
            .args(files),
    )
}

#[test]
fn the_kubernetes_manifests_pass_schema_validation() {
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    let dir = home.join(".cache/mmaplock-prof/k8s-validator");
    if !dir
        .join("node_modules/kubernetes-models/package.json")
        .exists()
    {
        skip_because("the Kubernetes validator is not installed (cargo xtask test installs it)");
        return;
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(deploy("kubernetes"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    // Kubernetes' own kinds, strictly (no field the API does not know).
    let strict = |files: &[PathBuf]| {
        outcome(
            Command::new(dir.join("venv/bin/kubernetes-validate"))
                .args(["--strict", "--no-warn"])
                .args(files),
        )
    };
    let core: Vec<PathBuf> = ["daemonset.yaml", "service.yaml"]
        .iter()
        .map(|f| deploy(&format!("kubernetes/{f}")))
        .collect();
    let (ok, text) = strict(&core);
    assert!(ok && text.matches("passed").count() == 2, "{text}");
    let (ok, text) = validate_k8s(&dir, &files);
    assert!(ok, "{text}");
    for kind in ["DaemonSet", "Service", "PodMonitor", "ServiceMonitor"] {
        assert!(
            text.contains(&format!(" {kind} mmaplock-prof")),
            "{kind}: {text}"
        );
    }
    // What the DaemonSet must say (docs/fleet.md).
    let ds = std::fs::read_to_string(deploy("kubernetes/daemonset.yaml")).unwrap();
    for needle in [
        "hostPID: true",
        "privileged: false",
        "drop: [\"ALL\"]",
        "add: [\"BPF\", \"PERFMON\", \"SYS_PTRACE\", \"DAC_READ_SEARCH\"]",
        "path: /sys/kernel/btf",
        "path: /sys/fs/cgroup",
        "path: /sys/kernel/tracing",
        "path: /var/lib/mmaplock-prof/captures",
        "\"--escalate-dir\", \"/var/lib/mmaplock-prof/captures\"",
        "livenessProbe:",
        "operator: Exists",
        "values: [\"amd64\", \"arm64\"]",
        "limits:",
    ] {
        assert!(ds.contains(needle), "the DaemonSet lacks {needle}");
    }
    assert_eq!(ds.matches("readOnly: true").count(), 3);
    // The validator rejects what it should: a port that is not a number, a PodMonitor whose
    // endpoints are not a list.
    let tmp = tempfile::tempdir().unwrap();
    let bad_ds = tmp.path().join("ds.yaml");
    std::fs::write(
        &bad_ds,
        ds.replace("containerPort: 9464", "containerPort: \"9464\""),
    )
    .unwrap();
    let pm = std::fs::read_to_string(deploy("kubernetes/podmonitor.yaml")).unwrap();
    let bad_pm = tmp.path().join("pm.yaml");
    let endpoints = pm.find("  podMetricsEndpoints:").unwrap();
    std::fs::write(
        &bad_pm,
        format!("{}  podMetricsEndpoints: metrics\n", &pm[..endpoints]),
    )
    .unwrap();
    for bad in [&bad_ds, &bad_pm] {
        let (ok, text) = validate_k8s(&dir, std::slice::from_ref(bad));
        assert!(!ok && text.contains("invalid"), "{}: {text}", bad.display());
    }
    // And a field the API does not know (a typo the API server would drop).
    let typo = tmp.path().join("typo.yaml");
    std::fs::write(&typo, ds.replace("hostPID: true", "hostPid: true")).unwrap();
    for bad in [bad_ds, typo] {
        let (ok, text) = strict(std::slice::from_ref(&bad));
        assert!(!ok && text.contains("ERROR"), "{}: {text}", bad.display());
    }
}
