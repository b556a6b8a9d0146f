//! An OpenTelemetry Collector for the push tests: built by `cargo xtask test` from the
//! Collector's published Go modules (tests/fixtures/otelcol, xtask/src/packages.rs) into
//! `~/.cache/mmaplock-prof/otelcol/otelcol`. Started with its OTLP receiver on a free loopback
//! port (TLS with the test's certificate, a bearer token required), profiles enabled by the
//! feature gate `service.profilesSupport`, and a file exporter per signal, whose JSON lines
//! (one per request received, pdata's JSON) the tests read back. Killed on drop.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use serde_json::Value;

use crate::{scrape::free_port, wait_until};

/// The Collector, where `cargo xtask test` builds it.
pub fn otelcol_bin() -> Option<PathBuf> {
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    let bin = home.join(".cache/mmaplock-prof/otelcol/otelcol");
    bin.is_file().then_some(bin)
}

pub struct Collector {
    child: Child,
    pub port: u16,
    dir: PathBuf,
}

impl Collector {
    /// Receives OTLP/HTTP on `https://localhost:PORT` with `cert` and `key` (PEM files),
    /// requiring `Authorization: Bearer TOKEN`; writes what it receives under `dir`.
    pub fn start(bin: &Path, dir: &Path, cert: &Path, key: &Path, token: &str) -> Self {
        let port = free_port();
        let config = dir.join("otelcol.yaml");
        let yaml = format!(
            "extensions:\n  bearertokenauth:\n    token: \"{token}\"\n\
             receivers:\n  otlp:\n    protocols:\n      http:\n        endpoint: 127.0.0.1:{port}\n\
             \x20       tls:\n          cert_file: {cert}\n          key_file: {key}\n\
             \x20       auth:\n          authenticator: bearertokenauth\n\
             exporters:\n  file/profiles:\n    path: {profiles}\n  file/metrics:\n    path: {metrics}\n\
             service:\n  extensions: [bearertokenauth]\n  telemetry:\n    metrics:\n      level: none\n\
             \x20 pipelines:\n    profiles:\n      receivers: [otlp]\n      exporters: [file/profiles]\n\
             \x20   metrics:\n      receivers: [otlp]\n      exporters: [file/metrics]\n",
            cert = cert.display(),
            key = key.display(),
            profiles = dir.join("profiles.jsonl").display(),
            metrics = dir.join("metrics.jsonl").display(),
        );
        std::fs::write(&config, yaml).unwrap();
        let log = std::fs::File::create(dir.join("otelcol.log")).unwrap();
        let child = Command::new(bin)
            .arg("--config")
            .arg(&config)
            .arg("--feature-gates=service.profilesSupport")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start the Collector");
        let mut c = Collector {
            child,
            port,
            dir: dir.to_path_buf(),
        };
        wait_until(
            crate::scaled(Duration::from_secs(60)),
            Duration::from_millis(100),
            || {
                if let Ok(Some(s)) = c.child.try_wait() {
                    panic!("the Collector ended: {s:?}\n{}", c.log());
                }
                std::net::TcpStream::connect(("127.0.0.1", port))
                    .map(drop)
                    .map_err(|e| format!("the Collector's port {port}: {e}"))
            },
        );
        c
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("otelcol.log")).unwrap_or_default()
    }

    /// Stops it (SIGTERM: its exporters flush), then what it wrote: the profiles' and the
    /// metrics' requests, one JSON value each.
    pub fn stop(mut self) -> (Vec<Value>, Vec<Value>) {
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = crate::workload::wait_child(&mut self.child);
        let read = |f: &str| -> Vec<Value> {
            std::fs::read_to_string(self.dir.join(f))
                .unwrap_or_default()
                .lines()
                .map(|l| serde_json::from_str(l).expect("a JSON line"))
                .collect()
        };
        (read("profiles.jsonl"), read("metrics.jsonl"))
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An int64 of pdata's JSON (a string, or a number).
pub fn int(v: &Value) -> i64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        v => v.as_i64().unwrap_or(0),
    }
}

/// One sample of a pushed profile: its profile's sample type, its value, its stack's
/// function names (innermost first) and its attributes.
pub type PushedSample = (String, i64, Vec<String>, Vec<(String, String)>);

/// One OTLP profiles request as the Collector wrote it: every sample of every profile of
/// every resource.
pub fn samples_by_type(req: &Value) -> Vec<PushedSample> {
    let d = &req["dictionary"];
    let s = |i: &Value| -> String {
        d["stringTable"][i.as_u64().unwrap_or(0) as usize]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    let names = |stack: &Value| -> Vec<String> {
        let st = &d["stackTable"][stack.as_u64().unwrap_or(0) as usize];
        (st["locationIndices"]
            .as_array()
            .cloned()
            .unwrap_or_default())
        .iter()
        .map(|l| {
            let loc = &d["locationTable"][l.as_u64().unwrap_or(0) as usize];
            let f = &loc["lines"][0]["functionIndex"];
            s(&d["functionTable"][f.as_u64().unwrap_or(0) as usize]["nameStrindex"])
        })
        .collect()
    };
    let attrs = |x: &Value| -> Vec<(String, String)> {
        (x["attributeIndices"]
            .as_array()
            .cloned()
            .unwrap_or_default())
        .iter()
        .map(|i| {
            let a = &d["attributeTable"][i.as_u64().unwrap_or(0) as usize];
            let v = a["value"]["stringValue"].as_str().unwrap_or("").to_string();
            (s(&a["keyStrindex"]), v)
        })
        .collect()
    };
    let mut out = Vec::new();
    for rp in req["resourceProfiles"].as_array().into_iter().flatten() {
        for sp in rp["scopeProfiles"].as_array().into_iter().flatten() {
            for p in sp["profiles"].as_array().into_iter().flatten() {
                let t = s(&p["sampleType"]["typeStrindex"]);
                for x in p["samples"].as_array().into_iter().flatten() {
                    let v: i64 = x["values"].as_array().into_iter().flatten().map(int).sum();
                    out.push((t.clone(), v, names(&x["stackIndex"]), attrs(x)));
                }
            }
        }
    }
    out
}
