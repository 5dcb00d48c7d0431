//! The OTLP receivers of the telemetry tests: traces and metrics posted in
//! protobuf over HTTP, or sent over gRPC (tonic), decoded with
//! `opentelemetry-proto`, kept in order; and the
//! readers of what it got (attributes, spans of a trace, a metric's points).

// Each test file uses its own share of these helpers.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{ExportMetricsServiceRequest, ExportMetricsServiceResponse};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
pub use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
pub use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::number_data_point::Value as Number;
use opentelemetry_proto::tonic::metrics::v1::Metric;
pub use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
pub use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

/// How long a test waits for spans or metrics: they are sent every 50 to 100 ms here.
pub const SPANS_WAIT: Duration = Duration::from_secs(15);

/// What the receiver got: each span with its resource's `service.name`, and
/// every metric of every export, in order.
#[derive(Default)]
pub struct Received {
    /// Each span with its resource's `service.name`.
    pub spans: Vec<(String, Span)>,
    /// Every metric of every export, in order.
    pub metrics: Vec<Metric>,
}

/// An OTLP/HTTP receiver of traces on a free loopback port.
pub async fn start_receiver() -> (SocketAddr, Arc<Mutex<Received>>) {
    async fn traces(State(got): State<Arc<Mutex<Received>>>, body: Bytes) -> StatusCode {
        keep_traces(&got, ExportTraceServiceRequest::decode(body).expect("OTLP protobuf"));
        StatusCode::OK
    }
    async fn metrics(State(got): State<Arc<Mutex<Received>>>, body: Bytes) -> StatusCode {
        keep_metrics(&got, ExportMetricsServiceRequest::decode(body).expect("OTLP protobuf"));
        StatusCode::OK
    }
    let got = Arc::new(Mutex::new(Received::default()));
    let router = (Router::new().route("/v1/traces", post(traces)))
        .route("/v1/metrics", post(metrics))
        .with_state(got.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    (addr, got)
}

/// Keeps each span of `request` with its resource's `service.name`.
fn keep_traces(got: &Mutex<Received>, request: ExportTraceServiceRequest) {
    let mut got = got.lock().unwrap();
    for resource in request.resource_spans {
        let attributes = resource.resource.map(|r| r.attributes).unwrap_or_default();
        let service = string(&attributes, "service.name").unwrap_or_default();
        for scope in resource.scope_spans {
            got.spans.extend(scope.spans.into_iter().map(|s| (service.clone(), s)));
        }
    }
}

/// Keeps every metric of `request`.
fn keep_metrics(got: &Mutex<Received>, request: ExportMetricsServiceRequest) {
    let metrics = (request.resource_metrics.into_iter())
        .flat_map(|r| r.scope_metrics)
        .flat_map(|s| s.metrics);
    got.lock().unwrap().metrics.extend(metrics);
}

/// An OTLP/gRPC receiver: the collector's trace and metrics services.
#[derive(Clone)]
struct GrpcReceiver(Arc<Mutex<Received>>);

#[tonic::async_trait]
impl TraceService for GrpcReceiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        keep_traces(&self.0, request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl MetricsService for GrpcReceiver {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        keep_metrics(&self.0, request.into_inner());
        Ok(tonic::Response::new(ExportMetricsServiceResponse::default()))
    }
}

/// An OTLP/gRPC receiver of traces and metrics on a free loopback port.
pub async fn start_grpc_receiver() -> (SocketAddr, Arc<Mutex<Received>>) {
    let got = Arc::new(Mutex::new(Received::default()));
    let receiver = GrpcReceiver(got.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tonic::transport::Server::builder()
        .add_service(TraceServiceServer::new(receiver.clone()))
        .add_service(MetricsServiceServer::new(receiver))
        .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener));
    tokio::spawn(server);
    (addr, got)
}

/// Bytes (a trace or span id) in lowercase hex, as `traceparent` writes them.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The value of the attribute `key`, if any.
pub fn attribute<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a Any> {
    (attributes.iter().find(|kv| kv.key == key)).and_then(|kv| kv.value.as_ref()?.value.as_ref())
}

/// The attribute `key` as a string: `None` when absent or of another type.
pub fn string(attributes: &[KeyValue], key: &str) -> Option<String> {
    attribute(attributes, key).and_then(|v| {
        if let Any::StringValue(s) = v {
            Some(s.clone())
        } else {
            None
        }
    })
}

/// The attribute `key` as a boolean.
pub fn boolean(attributes: &[KeyValue], key: &str) -> Option<bool> {
    attribute(attributes, key).and_then(|v| if let Any::BoolValue(b) = v { Some(*b) } else { None })
}

/// The attribute `key` as an integer.
pub fn int(attributes: &[KeyValue], key: &str) -> Option<i64> {
    attribute(attributes, key).and_then(|v| if let Any::IntValue(i) = v { Some(*i) } else { None })
}

/// Waits (bounded) until the spans of `trace_id` include `count` of them, then returns them.
pub async fn spans_of(got: &Arc<Mutex<Received>>, trace_id: &str, count: usize) -> Vec<(String, Span)> {
    let started = Instant::now();
    loop {
        let spans: Vec<(String, Span)> = (got.lock().unwrap().spans.iter())
            .filter(|(_, s)| hex(&s.trace_id) == trace_id)
            .cloned()
            .collect();
        if spans.len() >= count {
            return spans;
        }
        assert!(
            started.elapsed() < SPANS_WAIT,
            "{} of {count} spans of {trace_id}",
            spans.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether `span` is of `kind`.
pub fn kind(span: &Span, kind: SpanKind) -> bool {
    span.kind == kind as i32
}

/// The last export's `name` metric, once it has a point whose attributes
/// include every pair of `with` (waits, bounded); its unit and the points'
/// `(attributes, count or value, sum)`.
pub async fn metric(
    got: &Arc<Mutex<Received>>,
    name: &str,
    with: &[(&str, &str)],
) -> (String, Vec<(Vec<KeyValue>, u64, f64)>) {
    let started = Instant::now();
    loop {
        let last = got
            .lock()
            .unwrap()
            .metrics
            .iter()
            .rev()
            .find(|m| m.name == name)
            .cloned();
        let points = |metric: &Metric| -> Vec<(Vec<KeyValue>, u64, f64)> {
            match &metric.data {
                Some(Data::Histogram(h)) => (h.data_points.iter())
                    .map(|p| (p.attributes.clone(), p.count, p.sum.unwrap_or(0.0)))
                    .collect(),
                Some(Data::Sum(sum)) => (sum.data_points.iter())
                    .map(|p| match p.value {
                        Some(Number::AsInt(v)) => (p.attributes.clone(), v as u64, v as f64),
                        Some(Number::AsDouble(v)) => (p.attributes.clone(), v as u64, v),
                        None => (p.attributes.clone(), 0, 0.0),
                    })
                    .collect(),
                _ => Vec::new(),
            }
        };
        if let Some(metric) = last {
            let points = points(&metric);
            let matches = |a: &[KeyValue]| with.iter().all(|(k, v)| string(a, k).as_deref() == Some(*v));
            if points.iter().any(|(a, _, _)| matches(a)) {
                return (
                    metric.unit.clone(),
                    points.into_iter().filter(|(a, _, _)| matches(a)).collect(),
                );
            }
        }
        assert!(started.elapsed() < SPANS_WAIT, "no {name} with {with:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
