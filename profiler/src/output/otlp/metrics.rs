//! The agent's metrics as one OTLP `ExportMetricsServiceRequest`: the very series `/metrics`
//! serves, taken from the families of its Prometheus exposition (prometheus-client's
//! protobuf data model), so that the two never disagree. Names are the exposition's
//! (`mmaplock_acquisitions_total`), counters are cumulative monotonic sums, gauges gauges,
//! histograms cumulative histograms with the classic buckets' bounds (the kernel's log2
//! buckets, in seconds: no count is moved), all from the agent's start.

use opentelemetry_proto::tonic::{
    collector::metrics::v1::ExportMetricsServiceRequest,
    common::v1::KeyValue,
    metrics::v1::{
        AggregationTemporality, Gauge, Histogram, HistogramDataPoint, Metric, NumberDataPoint,
        ResourceMetrics, ScopeMetrics, Sum, metric, number_data_point,
    },
    resource::v1::Resource,
};
use prometheus_client::encoding::prometheus_protobuf::prometheus_data_model::{
    self as prom, MetricFamily, MetricType,
};

use super::{kv, scope};

/// Times of every point: when the series began counting (the agent's start) and now, ns
/// since the epoch.
#[derive(Clone, Copy)]
pub struct Times {
    pub start_ns: u64,
    pub now_ns: u64,
}

fn attributes(labels: &[prom::LabelPair]) -> Vec<KeyValue> {
    labels
        .iter()
        .map(|l| kv(&l.name, l.value.clone()))
        .collect()
}

fn number(m: &prom::Metric, value: f64, t: Times) -> NumberDataPoint {
    NumberDataPoint {
        attributes: attributes(&m.label),
        start_time_unix_nano: t.start_ns,
        time_unix_nano: t.now_ns,
        value: Some(number_data_point::Value::AsDouble(value)),
        ..NumberDataPoint::default()
    }
}

/// Prometheus's cumulative buckets as OTLP's: finite upper bounds, and a count per bucket
/// (the last above the last bound).
fn histogram(m: &prom::Metric, h: &prom::Histogram, t: Times) -> HistogramDataPoint {
    let mut bounds = Vec::new();
    let mut counts = Vec::new();
    let mut below = 0u64;
    for b in h.bucket.iter().filter(|b| b.upper_bound.is_finite()) {
        bounds.push(b.upper_bound);
        counts.push(b.cumulative_count.saturating_sub(below));
        below = b.cumulative_count;
    }
    counts.push(h.sample_count.saturating_sub(below));
    HistogramDataPoint {
        attributes: attributes(&m.label),
        start_time_unix_nano: t.start_ns,
        time_unix_nano: t.now_ns,
        count: h.sample_count,
        sum: Some(h.sample_sum),
        bucket_counts: counts,
        explicit_bounds: bounds,
        ..HistogramDataPoint::default()
    }
}

/// The unit of a series named `..._seconds` or `..._seconds_total` (UCUM, as OTLP asks).
fn unit(name: &str) -> &'static str {
    let base = name.strip_suffix("_total").unwrap_or(name);
    if base.ends_with("_seconds") { "s" } else { "" }
}

/// One family as an OTLP metric (None: a family of no series, or of a type the agent does
/// not export).
fn metric(f: &MetricFamily, t: Times) -> Option<Metric> {
    if f.metric.is_empty() {
        return None;
    }
    let cumulative = AggregationTemporality::Cumulative as i32;
    let data = match MetricType::try_from(f.r#type).ok()? {
        MetricType::Counter => metric::Data::Sum(Sum {
            data_points: (f.metric.iter())
                .map(|m| number(m, m.counter.as_ref().map_or(0.0, |c| c.value), t))
                .collect(),
            aggregation_temporality: cumulative,
            is_monotonic: true,
        }),
        MetricType::Gauge | MetricType::Untyped => metric::Data::Gauge(Gauge {
            data_points: (f.metric.iter())
                .map(|m| {
                    let v = (m.gauge.as_ref().map(|g| g.value))
                        .or(m.untyped.as_ref().map(|u| u.value))
                        .unwrap_or(0.0);
                    number(m, v, t)
                })
                .collect(),
        }),
        MetricType::Histogram => metric::Data::Histogram(Histogram {
            data_points: (f.metric.iter())
                .filter_map(|m| Some(histogram(m, m.histogram.as_ref()?, t)))
                .collect(),
            aggregation_temporality: cumulative,
        }),
        MetricType::Summary | MetricType::GaugeHistogram => return None,
    };
    Some(Metric {
        name: f.name.clone(),
        description: f.help.clone(),
        unit: unit(&f.name).to_string(),
        data: Some(data),
        ..Metric::default()
    })
}

/// The request for `families` (the agent's exposition), with `resource` (`service.name`,
/// `host.name`, ...).
pub fn request(
    families: &[MetricFamily],
    resource: Vec<KeyValue>,
    t: Times,
) -> ExportMetricsServiceRequest {
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(Resource {
                attributes: resource,
                ..Resource::default()
            }),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(scope()),
                metrics: families.iter().filter_map(|f| metric(f, t)).collect(),
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    }
}
