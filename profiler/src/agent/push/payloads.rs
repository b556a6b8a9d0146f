//! Each push's requests, encoded from what the agent already keeps: its ring of sampled
//! stacks (the intervals that ended since the last push) and its metrics. Pyroscope: one
//! `POST URL/ingest` per (process, cgroup) with its pprof profile, the application name the
//! process's name and the labels the agent's own (`process`, `cgroup`, `host`, `pid` with
//! `--pid-label`), in the multipart form Pyroscope's own clients send. OTLP: one
//! `ExportProfilesServiceRequest` and one `ExportMetricsServiceRequest`, protobuf.

use std::time::SystemTime;

use prost::Message as _;

use super::queue::Payload;
use crate::{
    agent::profiles::{Profiles, Window},
    output::{
        Output,
        otlp::{self, kv},
        pprof::{self, Pprof, Samples, Subset},
        prometheus,
    },
};

/// What every push is made from.
pub struct Sources {
    pub profiles: Option<crate::agent::profiles::SharedProfiles>,
    pub metrics: prometheus::Shared,
    /// When the agent started (the metrics' start time).
    pub started: SystemTime,
    /// This host's name (`host` label, `host.name`).
    pub host: String,
}

fn nanos(t: SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The intervals of the ring that ended after `since`, handed to `f`; `since` moves to the
/// last one's end.
fn since_last<T>(
    ring: &Profiles,
    since: &mut SystemTime,
    f: impl FnOnce(&Window<'_>) -> T,
) -> Option<T> {
    let (w, last) = ring.window_since(*since);
    let last = last?;
    let out = f(&w);
    *since = last;
    Some(out)
}

/// Pyroscope's application name (`service_name`): the process's name, in the characters its
/// ingestion takes (others become `_`).
fn app_name(process: &str) -> String {
    let name: String = (process.chars())
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '_' | '.' | '-' | '/' => c,
            _ => '_',
        })
        .collect();
    if name.is_empty() {
        "unknown".into()
    } else {
        name
    }
}

/// A label value as `name{k=v,...}` can carry it (no `,`, `{`, `}`).
fn label_value(v: &str) -> String {
    v.replace([',', '{', '}'], "_")
}

/// The `name` query parameter of `/ingest`: `APP{process=..,cgroup=..,host=..}`.
pub fn ingest_name(labels: &[(&'static str, String)], host: &str) -> String {
    let process = labels
        .iter()
        .find(|(k, _)| *k == "process")
        .map_or("", |(_, v)| v.as_str());
    let mut pairs: Vec<String> = (labels.iter())
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| format!("{k}={}", label_value(v)))
        .collect();
    pairs.push(format!("host={}", label_value(host)));
    format!("{}{{{}}}", app_name(process), pairs.join(","))
}

/// The `sample_type_config` form field: every sample type displayed under the profile name
/// `mmaplock` (Pyroscope names a pprof push's `__name__` after the sample types' display
/// names), as the agent's scrape config names it (docs/agent.md).
fn sample_type_config(mode: crate::vocab::Mode) -> String {
    let entries: Vec<String> = (pprof::sample_types(mode).iter())
        .map(|(t, u)| {
            let units = match *u {
                "nanoseconds" => "lock_nanoseconds",
                _ => "lock_samples",
            };
            format!(
                r#""{t}":{{"units":"{units}","display-name":"mmaplock","aggregation":"sum","sampled":true}}"#
            )
        })
        .collect();
    format!("{{{}}}", entries.join(","))
}

/// The multipart form of `/ingest`: the profile and its sample type config, as files.
fn multipart(profile: &[u8], config: &str, boundary: &str) -> Vec<u8> {
    let mut body = Vec::with_capacity(profile.len() + config.len() + 512);
    for (name, file, ctype, data) in [
        (
            "profile",
            "profile.pprof",
            "application/octet-stream",
            profile,
        ),
        (
            "sample_type_config",
            "sample_type_config.json",
            "application/json",
            config.as_bytes(),
        ),
    ] {
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{file}\"\r\nContent-Type: {ctype}\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(data);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    body
}

/// Pyroscope's requests for what ended since `since`.
pub fn pyroscope(base: &str, src: &Sources, since: &mut SystemTime) -> Vec<Payload> {
    let Some(ring) = &src.profiles else {
        return Vec::new();
    };
    let Ok(ring) = ring.lock() else {
        return Vec::new();
    };
    since_last(&ring, since, |w| {
        let (start, duration) = w.span_ns();
        let from = (start / 1_000_000_000).max(0).to_string();
        let until = ((start + duration) / 1_000_000_000 + 1).to_string();
        let mut groups: Vec<Vec<(&'static str, String)>> = Vec::new();
        for p in w.processes() {
            if !groups.contains(&p.labels) {
                groups.push(p.labels);
            }
        }
        let config = sample_type_config(w.mode());
        let boundary = format!("mmaplock-prof-{:x}", nanos(SystemTime::now()));
        (groups.iter())
            .filter_map(|labels| {
                let mut gz = Vec::new();
                let sub = Subset { of: w, labels };
                Output::<dyn Samples>::emit(&mut Pprof, &sub, &mut gz).ok()?;
                Some(Payload {
                    exporter: "pyroscope",
                    url: format!("{base}/ingest"),
                    query: vec![
                        ("name", ingest_name(labels, &src.host)),
                        ("from", from.clone()),
                        ("until", until.clone()),
                        ("format", "pprof".into()),
                        ("spyName", "mmaplock-prof".into()),
                    ],
                    content_type: format!("multipart/form-data; boundary={boundary}"),
                    body: multipart(&gz, &config, &boundary),
                    attempts: 0,
                })
            })
            .collect()
    })
    .unwrap_or_default()
}

/// The OTLP profiles request for what ended since `since`, if any ended.
pub fn otlp_profiles(base: &str, src: &Sources, since: &mut SystemTime) -> Option<Payload> {
    let ring = src.profiles.as_ref()?.lock().ok()?;
    let req = since_last(&ring, since, |w| {
        otlp::profiles::request(w, &[kv("host.name", src.host.clone())])
    })?;
    if req.resource_profiles.is_empty() {
        return None;
    }
    Some(Payload {
        exporter: "otlp_profiles",
        url: format!("{base}{}", otlp::PROFILES_PATH),
        query: Vec::new(),
        content_type: "application/x-protobuf".into(),
        body: req.encode_to_vec(),
        attempts: 0,
    })
}

/// The OTLP metrics request: every series of `/metrics` as it is now.
pub fn otlp_metrics(base: &str, src: &Sources) -> Option<Payload> {
    let registry = prometheus::registry(src.metrics.clone());
    let families = prometheus_client::encoding::prometheus_protobuf::encode(&registry).ok()?;
    let resource = vec![
        kv("service.name", "mmaplock-prof"),
        kv("service.version", env!("CARGO_PKG_VERSION")),
        kv("host.name", src.host.clone()),
    ];
    let t = otlp::metrics::Times {
        start_ns: nanos(src.started),
        now_ns: nanos(SystemTime::now()),
    };
    let req = otlp::metrics::request(&families, resource, t);
    Some(Payload {
        exporter: "otlp_metrics",
        url: format!("{base}{}", otlp::METRICS_PATH),
        query: Vec::new(),
        content_type: "application/x-protobuf".into(),
        body: req.encode_to_vec(),
        attempts: 0,
    })
}

#[cfg(test)]
mod tests {
    use std::{
        io::Read as _,
        sync::{Arc, Mutex},
        time::Duration,
    };

    use super::*;
    use crate::{
        agent::profiles::{BUDGET_BYTES, ProcessSampled},
        output::report::{FrameReport, SampleReport, SampledStacks},
        registry::roles::Role,
        vocab::{Mode, ids::ProcId},
    };

    /// One stack of process 7, a waiter's or (`holder`) a holder's: `count` waits, `wait` ns.
    fn interval(holder: bool, count: u64, wait: u64) -> Vec<ProcessSampled> {
        let stacks = SampledStacks {
            frames: vec![FrameReport {
                function: if holder { "hold" } else { "wait" }.into(),
                ..FrameReport::default()
            }],
            stacks: vec![SampleReport {
                frames: vec![0],
                role: Role::Worker,
                comm: "node".into(),
                cause: "mmap".into(),
                op: "write".into(),
                count,
                wait_ns_sum: wait,
                hold_ns_sum: Some(0),
                holder,
            }],
            ..SampledStacks::default()
        };
        vec![ProcessSampled {
            proc: ProcId::new(7, 1),
            labels: vec![("process", "node".into()), ("cgroup", "/".into())],
            exe: Some("/usr/bin/node".into()),
            stacks,
        }]
    }

    /// A push's profile, decoded from its form: each sample type's total.
    fn totals(p: &Payload) -> std::collections::HashMap<String, i64> {
        let body = &p.body;
        let start = (body.windows(4)).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        let end = (body[start..].windows(4))
            .position(|w| w == b"\r\n--")
            .unwrap();
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(&body[start..start + end])
            .read_to_end(&mut raw)
            .unwrap();
        let prof = pprof::proto::Profile::decode(raw.as_slice()).unwrap();
        let mut t = std::collections::HashMap::new();
        for s in &prof.sample {
            for (ty, v) in prof.sample_type.iter().zip(&s.value) {
                *t.entry(prof.string_table[ty.r#type as usize].clone())
                    .or_default() += v;
            }
        }
        t
    }

    /// A holder's charge comes at its waiter's end, which may be an interval after the
    /// waiters' samples of the same process, with nothing else: a push of that interval
    /// alone carries it, under the process's labels, and over pushes every wait is pushed
    /// once, the waiters' and the holders'.
    #[test]
    fn holders_are_pushed_whichever_interval_their_charge_comes_in() {
        let ring = Arc::new(Mutex::new(Profiles::new(1, Mode::Contention, BUDGET_BYTES)));
        let src = Sources {
            profiles: Some(ring.clone()),
            metrics: prometheus::Shared(Arc::new(Mutex::new(prometheus::Metrics::new(
                false,
                String::new(),
                String::new(),
            )))),
            started: SystemTime::UNIX_EPOCH,
            host: "h".into(),
        };
        let at = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + s);
        let mut since = SystemTime::UNIX_EPOCH;
        let mut pushed = Vec::new();
        ring.lock()
            .unwrap()
            .push(at(0), at(1), interval(false, 5, 500));
        pushed.extend(pyroscope("http://p", &src, &mut since));
        ring.lock()
            .unwrap()
            .push(at(1), at(2), interval(true, 2, 70));
        let last = pyroscope("http://p", &src, &mut since);
        let [holders] = &last[..] else {
            panic!("{} pushes", last.len())
        };
        assert_eq!(
            holders.query[0].1, "node{process=node,cgroup=/,host=h}",
            "the process's labels"
        );
        pushed.extend(last);
        assert!(pyroscope("http://p", &src, &mut since).is_empty());
        let sum = |ty: &str| -> i64 {
            pushed
                .iter()
                .map(|p| totals(p).get(ty).copied().unwrap_or(0))
                .sum()
        };
        assert_eq!(
            [
                sum("contentions"),
                sum("delay"),
                sum("holder_contentions"),
                sum("holder_delay")
            ],
            [5, 500, 2, 70]
        );
    }

    #[test]
    fn the_ingest_name_is_the_process_with_the_agents_labels() {
        let labels = vec![
            ("process", "node".to_string()),
            ("cgroup", "/system.slice/api,v2.service".to_string()),
        ];
        assert_eq!(
            ingest_name(&labels, "web-1"),
            "node{process=node,cgroup=/system.slice/api_v2.service,host=web-1}"
        );
        let no_cgroup = vec![
            ("process", "my app:1".to_string()),
            ("cgroup", String::new()),
        ];
        assert_eq!(
            ingest_name(&no_cgroup, "h"),
            "my_app_1{process=my app:1,host=h}"
        );
    }

    #[test]
    fn the_form_has_the_profile_and_its_config() {
        let body = multipart(
            b"PPROF",
            &sample_type_config(crate::vocab::Mode::Contention),
            "B",
        );
        let text = String::from_utf8_lossy(&body);
        assert!(text.starts_with("--B\r\nContent-Disposition: form-data; name=\"profile\""));
        assert!(text.contains("\r\n\r\nPPROF\r\n--B\r\n"));
        assert!(
            text.contains(
                r#""holder_delay":{"units":"lock_nanoseconds","display-name":"mmaplock""#
            )
        );
        assert!(text.ends_with("--B--\r\n"));
        let json = text
            .split("\r\n\r\n")
            .nth(2)
            .unwrap()
            .split("\r\n")
            .next()
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(json).unwrap();
        assert_eq!(v.as_object().unwrap().len(), 4);
    }
}
