//! The sampled stacks of any [`Samples`] as one OTLP `ExportProfilesServiceRequest`
//! (opentelemetry-proto 1.10, `v1development`): a resource per process (its labels as
//! resource attributes), and per resource one profile per sample type of the pprof profile
//! (`output::pprof::sample_types`), since an OTLP profile has one sample type. A sample is
//! in a profile only where its value is not 0, so the waiters' profiles (`contentions`,
//! `delay`) hold no holder's sample and the holders' (`holder_contentions`, `holder_delay`)
//! no waiter's: each wait counted once in each. Strings, mappings, functions, locations,
//! stacks and attributes are kept once in the request's dictionary, whose entry 0 of each
//! table is the empty one, as the format asks.

use std::collections::{BTreeMap, HashMap};

use opentelemetry_proto::tonic::{
    collector::profiles::v1development::ExportProfilesServiceRequest,
    common::v1::{AnyValue, KeyValue, any_value},
    profiles::v1development::{
        Function, KeyValueAndUnit, Line, Link, Location, Mapping, Profile, ProfilesDictionary,
        ResourceProfiles, Sample, ScopeProfiles, Stack, ValueType,
    },
    resource::v1::Resource,
};

use super::{kv, kv_int, scope};
use crate::output::{
    pprof::{Samples, cut_frame, cut_values, row_values, sample_types},
    report::FrameReport,
};

/// The dictionary being built, each entry kept once.
#[derive(Default)]
struct Dictionary {
    d: ProfilesDictionary,
    strings: HashMap<String, i32>,
    mappings: HashMap<(i32, i32), i32>,
    functions: HashMap<(i32, i32, i64), i32>,
    locations: HashMap<(i32, i32, i64, i64), i32>,
    stacks: HashMap<Vec<i32>, i32>,
    attributes: HashMap<(i32, String), i32>,
}

impl Dictionary {
    fn new() -> Self {
        let mut d = Dictionary::default();
        d.string("");
        d.d.mapping_table.push(Mapping::default());
        d.d.location_table.push(Location::default());
        d.d.function_table.push(Function::default());
        d.d.link_table.push(Link::default());
        d.d.attribute_table.push(KeyValueAndUnit::default());
        d.d.stack_table.push(Stack::default());
        d
    }

    fn string(&mut self, s: &str) -> i32 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.d.string_table.len() as i32;
        self.d.string_table.push(s.to_string());
        self.strings.insert(s.to_string(), i);
        i
    }

    fn attribute(&mut self, key: &str, value: &str) -> i32 {
        let k = self.string(key);
        if let Some(&i) = self.attributes.get(&(k, value.to_string())) {
            return i;
        }
        let i = self.d.attribute_table.len() as i32;
        self.d.attribute_table.push(KeyValueAndUnit {
            key_strindex: k,
            value: Some(AnyValue {
                value: Some(any_value::Value::StringValue(value.to_string())),
            }),
            unit_strindex: 0,
        });
        self.attributes.insert((k, value.to_string()), i);
        i
    }

    fn mapping(&mut self, file: &str, build_id: Option<&str>) -> i32 {
        let f = self.string(file);
        let b = build_id.map_or(0, |b| self.attribute("process.executable.build_id.gnu", b));
        let next = self.d.mapping_table.len() as i32;
        let i = *self.mappings.entry((f, b)).or_insert(next);
        if i == next {
            self.d.mapping_table.push(Mapping {
                filename_strindex: f,
                attribute_indices: if b == 0 { Vec::new() } else { vec![b] },
                ..Mapping::default()
            });
        }
        i
    }

    fn location(&mut self, f: &FrameReport) -> i32 {
        let mapping = match &f.dso {
            Some(d) => self.mapping(d, f.build_id.as_deref()),
            None => 0,
        };
        let name = self.string(&f.function);
        let file = self.string(f.script.as_deref().unwrap_or(""));
        let line = i64::from(f.line.unwrap_or(0));
        let next = self.d.function_table.len() as i32;
        let function = *self.functions.entry((name, file, line)).or_insert(next);
        if function == next {
            self.d.function_table.push(Function {
                name_strindex: name,
                system_name_strindex: name,
                filename_strindex: file,
                start_line: line,
            });
        }
        let column = i64::from(f.column.unwrap_or(0));
        let next = self.d.location_table.len() as i32;
        let i = *(self.locations)
            .entry((mapping, function, line, column))
            .or_insert(next);
        if i == next {
            self.d.location_table.push(Location {
                mapping_index: mapping,
                lines: vec![Line {
                    function_index: function,
                    line,
                    column,
                }],
                ..Location::default()
            });
        }
        i
    }

    fn stack(&mut self, locations: Vec<i32>) -> i32 {
        if let Some(&i) = self.stacks.get(&locations) {
            return i;
        }
        let i = self.d.stack_table.len() as i32;
        self.d.stack_table.push(Stack {
            location_indices: locations.clone(),
        });
        self.stacks.insert(locations, i);
        i
    }
}

/// A sample's stack and attributes (indices into the dictionary).
type SampleKey = (i32, Vec<i32>);

/// One resource's samples: by (stack, attributes), their values in the order of the sample
/// types.
#[derive(Default)]
struct Group {
    exe: Option<String>,
    samples: HashMap<SampleKey, Vec<i64>>,
}

impl Group {
    fn add(&mut self, stack: i32, attributes: Vec<i32>, values: Vec<i64>) {
        let sum = (self.samples)
            .entry((stack, attributes))
            .or_insert_with(|| vec![0; values.len()]);
        for (s, v) in sum.iter_mut().zip(values) {
            *s = s.saturating_add(v);
        }
    }
}

/// A process's resource: its labels as OpenTelemetry's resource attributes (`process`:
/// `service.name` and `process.executable.name`; `cgroup`: `process.linux.cgroup`; `pid`:
/// `process.pid`), its executable's path, and the host's attributes.
fn resource(labels: &[(&'static str, String)], exe: Option<&str>, host: &[KeyValue]) -> Resource {
    let mut attributes = Vec::new();
    for (k, v) in labels {
        match *k {
            "process" => {
                attributes.push(kv("service.name", v.clone()));
                attributes.push(kv("process.executable.name", v.clone()));
            }
            "cgroup" if v.is_empty() => {}
            "cgroup" => attributes.push(kv("process.linux.cgroup", v.clone())),
            "pid" => attributes.push(kv_int("process.pid", v.parse().unwrap_or(0))),
            k => attributes.push(kv(k, v.clone())),
        }
    }
    if let Some(e) = exe {
        attributes.push(kv("process.executable.path", e));
    }
    attributes.extend(host.iter().cloned());
    Resource {
        attributes,
        ..Resource::default()
    }
}

/// The request for `s`'s samples; `host` is added to every resource (`host.name`).
pub fn request(s: &dyn Samples, host: &[KeyValue]) -> ExportProfilesServiceRequest {
    let mode = s.mode();
    let mut d = Dictionary::new();
    let mut groups: BTreeMap<Vec<(&'static str, String)>, Group> = BTreeMap::new();
    for p in s.processes() {
        let group = groups.entry(p.labels.clone()).or_default();
        if group.exe.is_none() {
            group.exe = p.exe.map(str::to_string);
        }
        for row in p.stacks {
            let locations = (row.frames.iter())
                .filter_map(|&i| p.frames.frame(i))
                .map(|f| d.location(f))
                .collect();
            let stack = d.stack(locations);
            let attributes = vec![
                d.attribute("role", row.role.as_str()),
                d.attribute("comm", &row.comm),
                d.attribute("cause", &row.cause),
                d.attribute("op", &row.op),
                d.attribute("side", if row.holder { "holder" } else { "waiter" }),
            ];
            group.add(stack, attributes, row_values(mode, row));
        }
        let sides = cut_values(mode, &p.cut);
        if !sides.is_empty() {
            let at = d.location(&cut_frame(&p.cut));
            let stack = d.stack(vec![at]);
            for (holder, values) in sides {
                let side = d.attribute("side", if holder { "holder" } else { "waiter" });
                group.add(stack, vec![side], values);
            }
        }
    }
    let types: Vec<ValueType> = (sample_types(mode).iter())
        .map(|(t, u)| ValueType {
            type_strindex: d.string(t),
            unit_strindex: d.string(u),
        })
        .collect();
    let period_type = types[0];
    let (start, duration) = s.span_ns();
    let resource_profiles = (groups.into_iter())
        .map(|(labels, g)| {
            let mut rows: Vec<(SampleKey, Vec<i64>)> = g.samples.into_iter().collect();
            rows.sort();
            let profiles = (types.iter().enumerate())
                .map(|(i, &sample_type)| Profile {
                    sample_type: Some(sample_type),
                    samples: (rows.iter())
                        .filter(|(_, v)| v[i] != 0)
                        .map(|((stack, attributes), v)| Sample {
                            stack_index: *stack,
                            attribute_indices: attributes.clone(),
                            values: vec![v[i]],
                            ..Sample::default()
                        })
                        .collect(),
                    time_unix_nano: u64::try_from(start).unwrap_or(0),
                    duration_nano: u64::try_from(duration).unwrap_or(0),
                    period_type: Some(period_type),
                    period: i64::from(s.rate().unwrap_or(1)),
                    ..Profile::default()
                })
                .collect();
            ResourceProfiles {
                resource: Some(resource(&labels, g.exe.as_deref(), host)),
                scope_profiles: vec![ScopeProfiles {
                    scope: Some(scope()),
                    profiles,
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            }
        })
        .collect();
    ExportProfilesServiceRequest {
        resource_profiles,
        dictionary: Some(d.d),
    }
}
