//! The OTLP encodings, decoded back: the profiles' types, sides, names and resources; the
//! metrics' families as the exposition has them.

use prost::Message as _;

use super::*;
use crate::output::{
    fixtures::{process, summary},
    pprof::Summaries,
    report::{FrameReport, SampleCut, SampleReport, SampledStacks},
};
use crate::registry::roles::Role;
use crate::vocab::Mode;
use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;

/// A Worker's write through `viaReadFile` (3, 900 ns), main's write (2, 40 ns) that another
/// wait began behind (a holder row, 1 charged 70 ns), and a cut holder.
fn a_summary(mode: Mode) -> crate::output::report::Report {
    let row = |frames: Vec<u32>, role, count, wait, holder| SampleReport {
        frames,
        role,
        comm: "node".into(),
        cause: "mprotect".into(),
        op: "write".into(),
        count,
        wait_ns_sum: wait,
        hold_ns_sum: Some(5),
        holder,
    };
    let mut p = process(7, "node", 5000, false);
    p.cgroup = Some("/system.slice/api.service".into());
    p.exe = Some("/usr/bin/node".into());
    p.samples = Some(SampledStacks {
        frames: vec![
            FrameReport {
                function: "mprotect".into(),
                dso: Some("/usr/lib/libc.so.6".into()),
                build_id: Some("ab12".into()),
                ..FrameReport::default()
            },
            FrameReport {
                function: "viaReadFile".into(),
                script: Some("/srv/jsapis.js".into()),
                line: Some(46),
                column: Some(22),
                ..FrameReport::default()
            },
        ],
        stacks: vec![
            row(vec![0, 1], Role::Worker, 3, 900, false),
            row(vec![0], Role::Main, 2, 40, false),
            row(vec![0], Role::Main, 1, 70, true),
        ],
        cut: SampleCut {
            stacks: 1,
            holder_count: 4,
            holder_wait_ns_sum: 8,
            ..SampleCut::default()
        },
    });
    let mut r = summary(vec![p]);
    r.mode = mode;
    r.stack_sample = Some(64);
    r
}

fn decoded(mode: Mode) -> ExportProfilesServiceRequest {
    let r = a_summary(mode);
    let req = profiles::request(&Summaries(vec![&r]), &[kv("host.name", "h1")]);
    // What goes on the wire decodes to the same.
    ExportProfilesServiceRequest::decode(req.encode_to_vec().as_slice()).unwrap()
}

#[test]
fn each_sample_type_is_a_profile_of_its_side_only() {
    for mode in [Mode::Full, Mode::Contention] {
        let req = decoded(mode);
        let d = req.dictionary.as_ref().unwrap();
        let s = |i: i32| d.string_table[i as usize].as_str();
        // Entry 0 of every table is the empty one.
        assert_eq!(s(0), "");
        assert_eq!(d.stack_table[0].location_indices.len(), 0);
        let [rp] = &req.resource_profiles[..] else {
            panic!("one process")
        };
        let profiles = &rp.scope_profiles[0].profiles;
        let types: Vec<&str> = (profiles.iter())
            .map(|p| s(p.sample_type.unwrap().type_strindex))
            .collect();
        let want: Vec<&str> = (crate::output::pprof::sample_types(mode).iter())
            .map(|(t, _)| *t)
            .collect();
        assert_eq!(types, want);
        let total = |name: &str| -> i64 {
            let p = &profiles[types.iter().position(|t| *t == name).unwrap()];
            assert_eq!(p.period, 64);
            p.samples.iter().map(|x| x.values[0]).sum()
        };
        assert_eq!((total("contentions"), total("delay")), (5, 940), "{mode:?}");
        assert_eq!(
            (total("holder_contentions"), total("holder_delay")),
            (1 + 4, 70 + 8)
        );
        // The holders' samples are in no waiters' profile, and the reverse.
        for p in profiles {
            let holder_type = s(p.sample_type.unwrap().type_strindex).starts_with("holder_");
            for x in &p.samples {
                let side = (x.attribute_indices.iter())
                    .map(|&i| &d.attribute_table[i as usize])
                    .find(|a| s(a.key_strindex) == "side")
                    .and_then(|a| a.value.clone())
                    .unwrap();
                let want = if holder_type { "holder" } else { "waiter" };
                assert_eq!(
                    side.value,
                    Some(
                        opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(
                            want.into()
                        )
                    )
                );
            }
        }
    }
}

#[test]
fn functions_and_resources_are_named() {
    let req = decoded(Mode::Contention);
    let d = req.dictionary.as_ref().unwrap();
    let s = |i: i32| d.string_table[i as usize].as_str();
    // The Worker's stack, innermost first: libc's mprotect (its file and build id), then the
    // JavaScript function with its script, line and column.
    let delay = &req.resource_profiles[0].scope_profiles[0].profiles[1];
    let worker = (delay.samples.iter()).find(|x| x.values == [900]).unwrap();
    let stack = &d.stack_table[worker.stack_index as usize];
    let frames: Vec<(&str, &str, i64, i64)> = (stack.location_indices.iter())
        .map(|&l| {
            let loc = &d.location_table[l as usize];
            let f = &d.function_table[loc.lines[0].function_index as usize];
            let file = match loc.mapping_index {
                0 => s(f.filename_strindex),
                m => s(d.mapping_table[m as usize].filename_strindex),
            };
            (
                s(f.name_strindex),
                file,
                loc.lines[0].line,
                loc.lines[0].column,
            )
        })
        .collect();
    assert_eq!(
        frames,
        [
            ("mprotect", "/usr/lib/libc.so.6", 0, 0),
            ("viaReadFile", "/srv/jsapis.js", 46, 22)
        ]
    );
    let resource = req.resource_profiles[0].resource.as_ref().unwrap();
    let attrs: Vec<(String, String)> = (resource.attributes.iter())
        .map(|a| {
            let v = match a.value.as_ref().and_then(|v| v.value.clone()) {
                Some(common::v1::any_value::Value::StringValue(s)) => s,
                Some(common::v1::any_value::Value::IntValue(i)) => i.to_string(),
                v => format!("{v:?}"),
            };
            (a.key.clone(), v)
        })
        .collect();
    for want in [
        ("service.name", "node"),
        ("process.executable.name", "node"),
        ("process.pid", "7"),
        ("process.linux.cgroup", "/system.slice/api.service"),
        ("process.executable.path", "/usr/bin/node"),
        ("host.name", "h1"),
    ] {
        assert!(
            attrs.contains(&(want.0.to_string(), want.1.to_string())),
            "{want:?} not in {attrs:?}"
        );
    }
}

use opentelemetry_proto::tonic::common;

#[test]
fn metrics_are_the_expositions_families() {
    use crate::output::prometheus::{Metrics, Shared, registry};
    use opentelemetry_proto::tonic::metrics::v1::metric::Data;
    let m = Shared(std::sync::Arc::new(std::sync::Mutex::new(Metrics::new(
        false,
        "6.18".into(),
        "6.8".into(),
    ))));
    let families = prometheus_client::encoding::prometheus_protobuf::encode(&registry(m)).unwrap();
    let t = metrics::Times {
        start_ns: 1,
        now_ns: 2,
    };
    let req = metrics::request(&families, vec![kv("service.name", "mmaplock-prof")], t);
    let got = &req.resource_metrics[0].scope_metrics[0].metrics;
    let names: Vec<&str> = got.iter().map(|m| m.name.as_str()).collect();
    for f in families.iter().filter(|f| !f.metric.is_empty()) {
        assert!(
            names.contains(&f.name.as_str()),
            "{} not in {names:?}",
            f.name
        );
    }
    let info = got
        .iter()
        .find(|m| m.name == "mmaplock_build_info")
        .unwrap();
    let Some(Data::Gauge(g)) = &info.data else {
        panic!("{info:?}")
    };
    assert_eq!(g.data_points.len(), 1);
    assert!(
        (g.data_points[0].attributes.iter()).any(|a| a.key == "kernel"),
        "{g:?}"
    );
    let lost = got
        .iter()
        .find(|m| m.name == "mmaplock_lost_total")
        .unwrap();
    let Some(Data::Sum(s)) = &lost.data else {
        panic!("{lost:?}")
    };
    assert!(s.is_monotonic);
    assert_eq!(s.data_points[0].start_time_unix_nano, 1);
}
