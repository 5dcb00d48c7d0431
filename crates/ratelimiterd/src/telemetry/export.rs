//! The OTLP exporters of a [`Resolved`] configuration: spans batched off the
//! calls' path in a bounded queue by the SDK's processor thread, each batch
//! sent by a task of the server's tokio runtime, and metrics read periodically
//! by another task, sent over OTLP http/protobuf by hyper or
//! over gRPC by tonic (`OTEL_EXPORTER_OTLP_PROTOCOL`, per signal); the
//! gateway's [`Telemetry`] made from them.

use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use gateway::observe::genai_metrics::GenAiMetrics;
use gateway::observe::trace::{Telemetry, SEMCONV_SCHEMA_URL};
use opentelemetry::global::BoxedTracer;
use opentelemetry::metrics::MeterProvider;
use opentelemetry::trace::TracerProvider;
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::tonic_types::metadata::MetadataMap;
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::metrics::periodic_reader_with_async_runtime::PeriodicReader;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::resource::EnvResourceDetector;
use opentelemetry_sdk::runtime;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider};
use opentelemetry_sdk::Resource;

use opentelemetry_sdk::trace::SpanExporter;

use super::api_trace::ApiTracer;
use super::counted::{spans_queue_max, BoundedSpans, CountedMetrics, CountedSpans, CONTROL_SLOTS};
use super::dropped::OtelDropped;
use super::on_runtime::OnRuntime;
use super::otlp_http::{header, https_client, HttpSettings, OtlpHttpSpans};
use super::{OtlpProtocol, Resolved};

/// How long a stopping server waits for its last spans to be sent: a collector
/// that is down must not hold the stop for the exporter's whole timeout.
pub const SHUTDOWN_FLUSH_MS: u64 = 5_000;

/// The running export: what the gateway traces and measures with, and the
/// providers to flush at the stop.
pub struct Exporting {
    traces: Option<SdkTracerProvider>,
    metrics: Option<SdkMeterProvider>,
    /// The gateway's tracer, propagator and instruments.
    pub gateway: Arc<Telemetry>,
}

impl Exporting {
    /// Starts the export `resolved` describes; must run on the server's tokio
    /// runtime, where the batch's task, the periodic reader and the HTTP client live.
    /// What it drops or fails to send is counted in `dropped`.
    pub fn start(resolved: &Resolved, dropped: Arc<OtelDropped>) -> Result<Self, String> {
        let resource = resource(resolved);
        let scope = InstrumentationScope::builder(env!("CARGO_PKG_NAME"))
            .with_version(env!("CARGO_PKG_VERSION"))
            .with_schema_url(SEMCONV_SCHEMA_URL)
            .build();
        let traces = (resolved.traces_endpoint.as_deref())
            .map(|endpoint| tracer_provider(resolved, endpoint, (resource.clone(), dropped.clone())))
            .transpose()?;
        // Without traces, spans are not recorded; the caller's context still goes upstream.
        let tracer = (traces.as_ref()).map(|provider| provider.tracer_with_scope(scope.clone()));
        let metrics = (resolved.metrics_endpoint.as_deref())
            .map(|endpoint| meter_provider(resolved, endpoint, (resource, dropped)))
            .transpose()?;
        let mut telemetry = Telemetry::new(tracer, Box::new(TraceContextPropagator::new()));
        if resolved.capture_message_content {
            telemetry = telemetry.with_message_content();
        }
        if let Some(provider) = &metrics {
            let metrics = GenAiMetrics::new(&provider.meter_with_scope(scope));
            let metrics = if resolved.metrics_tenant {
                metrics.with_tenants()
            } else {
                metrics
            };
            telemetry = telemetry.with_metrics(metrics);
        }
        tracing::info!(traces_endpoint = ?resolved.traces_endpoint, metrics_endpoint = ?resolved.metrics_endpoint,
            "exporting over OTLP");
        Ok(Self {
            traces,
            metrics,
            gateway: Arc::new(telemetry),
        })
    }

    /// The tracer of the limiter's API, when spans are exported.
    pub fn api_tracer(&self) -> Option<ApiTracer> {
        let scope = InstrumentationScope::builder(env!("CARGO_PKG_NAME"))
            .with_version(env!("CARGO_PKG_VERSION"))
            .with_schema_url(SEMCONV_SCHEMA_URL)
            .build();
        let provider = self.traces.as_ref()?;
        Some(ApiTracer::new(BoxedTracer::new(Box::new(
            provider.tracer_with_scope(scope),
        ))))
    }

    /// Sends what is still queued and stops, waiting at most [`SHUTDOWN_FLUSH_MS`] each.
    pub async fn shutdown(self) {
        let timeout = Duration::from_millis(SHUTDOWN_FLUSH_MS);
        let (traces, metrics) = (self.traces, self.metrics);
        // The SDK's shutdown blocks its thread until the export's task answers.
        let stop = tokio::task::spawn_blocking(move || {
            let traces = traces.map(|p| p.shutdown_with_timeout(timeout));
            let metrics = metrics.map(|p| p.shutdown_with_timeout(timeout));
            (traces, metrics)
        });
        if let Ok((traces, metrics)) = stop.await {
            if let Some(Err(e)) = traces {
                tracing::warn!(error = %e, "telemetry: the last spans could not all be sent");
            }
            if let Some(Err(e)) = metrics {
                tracing::warn!(error = %e, "telemetry: the last metrics could not all be sent");
            }
        }
    }
}

/// The section's headers, to which the exporter adds the environment's.
fn headers(resolved: &Resolved) -> HashMap<String, String> {
    resolved.headers.clone().into_iter().collect()
}

/// The section's headers as gRPC metadata (the exporter adds the
/// environment's); a header name or value gRPC cannot carry is refused, named.
fn metadata(resolved: &Resolved) -> Result<MetadataMap, String> {
    let mut headers = axum::http::HeaderMap::new();
    for (name, value) in &resolved.headers {
        let (name, value) = header(name, value).map_err(|e| format!("telemetry.headers: {e}"))?;
        headers.insert(name, value);
    }
    Ok(MetadataMap::from_headers(headers))
}

/// An exporter's builder (spans' or metrics') sending to `endpoint` over OTLP
/// http/protobuf with the section's headers.
fn over_http<B: WithExportConfig + WithHttpConfig>(builder: B, resolved: &Resolved, endpoint: &str) -> B {
    (builder.with_protocol(Protocol::HttpBinary))
        .with_endpoint(endpoint)
        .with_headers(headers(resolved))
}

/// An exporter's builder (spans' or metrics') sending to `endpoint` over gRPC
/// with the section's headers as metadata, refused as [`metadata`] says.
fn over_grpc<B: WithExportConfig + WithTonicConfig>(
    builder: B,
    resolved: &Resolved,
    endpoint: &str,
) -> Result<B, String> {
    Ok(builder.with_endpoint(endpoint).with_metadata(metadata(resolved)?))
}

/// Spans batched in a bounded queue and sent by a task of the runtime; what
/// finds the queue full or fails to be sent is counted in `dropped`. Over
/// http/protobuf, by [`OtlpHttpSpans`]; over gRPC, by the OTLP crate's exporter.
fn tracer_provider(
    resolved: &Resolved,
    endpoint: &str,
    (resource, dropped): (Resource, Arc<OtelDropped>),
) -> Result<SdkTracerProvider, String> {
    match resolved.traces_protocol {
        OtlpProtocol::HttpProtobuf => {
            let settings = HttpSettings::read("TRACES", endpoint, &resolved.headers, &|name| std::env::var(name).ok())?;
            let client = Arc::new(https_client(settings.timeout));
            let exporter = OtlpHttpSpans::new(client, settings, dropped.clone());
            Ok(batched(exporter, resolved, (resource, dropped)))
        }
        OtlpProtocol::Grpc => {
            let exporter = over_grpc(
                opentelemetry_otlp::SpanExporter::builder().with_tonic(),
                resolved,
                endpoint,
            )?
            .build()
            .map_err(|e| format!("telemetry: the OTLP span exporter could not be built: {e}"))?;
            Ok(batched(exporter, resolved, (resource, dropped)))
        }
    }
}

/// A tracer provider whose spans `exporter` sends, batched in the bounded
/// queue by the SDK's processor on its own thread (a span ended wakes nothing),
/// each export run on this runtime ([`OnRuntime`]). Must be called on the runtime.
fn batched<E: SpanExporter + 'static>(
    exporter: E,
    resolved: &Resolved,
    (resource, dropped): (Resource, Arc<OtelDropped>),
) -> SdkTracerProvider {
    let (in_queue, max) = (Arc::new(AtomicUsize::new(0)), spans_queue_max());
    let exporter = CountedSpans::new(exporter, dropped.clone(), in_queue.clone());
    let exporter = OnRuntime::new(exporter, tokio::runtime::Handle::current());
    let config = BatchConfigBuilder::default()
        .with_max_queue_size(max + CONTROL_SLOTS)
        .build();
    let processor = BatchSpanProcessor::builder(exporter).with_batch_config(config).build();
    let processor = BoundedSpans::new(processor, (in_queue, max), dropped);
    SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_sampler(resolved.sampler.clone())
        .with_resource(resource)
        .build()
}

/// Metrics read and sent every `OTEL_METRIC_EXPORT_INTERVAL` (60 s by default)
/// by a task of the runtime; an export that fails is counted in `dropped`.
fn meter_provider(
    resolved: &Resolved,
    endpoint: &str,
    (resource, dropped): (Resource, Arc<OtelDropped>),
) -> Result<SdkMeterProvider, String> {
    let builder = opentelemetry_otlp::MetricExporter::builder();
    let exporter = match resolved.metrics_protocol {
        OtlpProtocol::HttpProtobuf => {
            let settings =
                HttpSettings::read("METRICS", endpoint, &resolved.headers, &|name| std::env::var(name).ok())?;
            let client = https_client(settings.timeout);
            (over_http(builder.with_http(), resolved, endpoint).with_http_client(client)).build()
        }
        OtlpProtocol::Grpc => over_grpc(builder.with_tonic(), resolved, endpoint)?.build(),
    }
    .map_err(|e| format!("telemetry: the OTLP metric exporter could not be built: {e}"))?;
    let reader = PeriodicReader::builder(CountedMetrics::new(exporter, dropped), runtime::Tokio).build();
    Ok(SdkMeterProvider::builder()
        .with_reader(reader)
        .with_resource(resource)
        .build())
}

/// The service's resource: the section's attributes, then `service.name`, then
/// `OTEL_RESOURCE_ATTRIBUTES` over them, and `OTEL_SERVICE_NAME` (already in
/// `resolved.service_name`) last.
fn resource(resolved: &Resolved) -> Resource {
    let configured = (resolved.resource_attributes.iter()).map(|(k, v)| KeyValue::new(k.clone(), v.clone()));
    Resource::builder_empty()
        .with_attributes(configured)
        .with_detector(Box::new(EnvResourceDetector::new()))
        .with_service_name(resolved.service_name.clone())
        .build()
}
