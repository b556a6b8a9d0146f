//! OTLP (OpenTelemetry's protocol) encodings of what the agent pushes: its sampled stacks as
//! OTLP profiles and its metrics as OTLP metrics, the messages of the `opentelemetry-proto`
//! crate, pinned (Cargo.toml) to the crate release that carries opentelemetry-proto
//! [`PROTO_VERSION`].
//!
//! OTLP profiles are a public **alpha** signal: its messages live in the package
//! `opentelemetry.proto.profiles.v1development` and its wire format changes between proto
//! releases (1.9 to 1.10 moved the dictionary out of each profile and gave each profile one
//! sample type). A receiver built on another proto release may reject or misread these
//! profiles; docs/agent.md ("OTLP") says which receivers were tested.

pub mod metrics;
pub mod profiles;
#[cfg(test)]
mod tests;

use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};

/// The opentelemetry-proto release whose messages are encoded here.
pub const PROTO_VERSION: &str = "1.10.0";

/// OTLP/HTTP paths, under the `--otlp` URL.
pub const PROFILES_PATH: &str = "/v1development/profiles";
pub const METRICS_PATH: &str = "/v1/metrics";

/// A string attribute.
pub fn kv(key: &str, value: impl Into<String>) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.into())),
        }),
        ..KeyValue::default()
    }
}

/// An integer attribute.
pub fn kv_int(key: &str, value: i64) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue {
            value: Some(any_value::Value::IntValue(value)),
        }),
        ..KeyValue::default()
    }
}

/// The instrumentation scope of everything pushed: this program.
fn scope() -> InstrumentationScope {
    InstrumentationScope {
        name: "mmaplock-prof".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        ..InstrumentationScope::default()
    }
}
