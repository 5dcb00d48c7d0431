//! The OTLP exporter of a [`Resolved`] configuration: spans batched off the
//! calls' path in a bounded queue, on the server's tokio runtime, sent over
//! OTLP http/protobuf by hyper; the gateway's [`Telemetry`] made from it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use gateway::observe::trace::{Telemetry, SEMCONV_SCHEMA_URL};
use opentelemetry::global::BoxedTracer;
use opentelemetry::trace::TracerProvider;
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::resource::EnvResourceDetector;
use opentelemetry_sdk::runtime;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;

use super::Resolved;

/// How long a stopping server waits for its last spans to be sent: a collector
/// that is down must not hold the stop for the exporter's whole timeout.
pub const SHUTDOWN_FLUSH_MS: u64 = 5_000;

/// The running export: what the gateway traces with, and the provider to flush at the stop.
pub struct Exporting {
    provider: SdkTracerProvider,
    /// The gateway's tracer and propagator.
    pub gateway: Arc<Telemetry>,
}

impl Exporting {
    /// Starts the export `resolved` describes; must run on the server's tokio
    /// runtime, where the batch's task and the HTTP client live.
    pub fn start(resolved: &Resolved) -> Result<Self, String> {
        let headers: HashMap<String, String> = resolved.headers.clone().into_iter().collect();
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(resolved.traces_endpoint.clone())
            .with_headers(headers)
            .build()
            .map_err(|e| format!("telemetry: the OTLP exporter could not be built: {e}"))?;
        let processor = BatchSpanProcessor::builder(exporter, runtime::Tokio).build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(resolved.sampler.clone())
            .with_resource(resource(resolved))
            .build();
        let scope = InstrumentationScope::builder(env!("CARGO_PKG_NAME"))
            .with_version(env!("CARGO_PKG_VERSION"))
            .with_schema_url(SEMCONV_SCHEMA_URL)
            .build();
        let tracer = BoxedTracer::new(Box::new(provider.tracer_with_scope(scope)));
        let gateway = Arc::new(Telemetry::new(tracer, Box::new(TraceContextPropagator::new())));
        tracing::info!(traces_endpoint = %resolved.traces_endpoint, "exporting traces over OTLP");
        Ok(Self { provider, gateway })
    }

    /// Sends what is still queued and stops, waiting at most [`SHUTDOWN_FLUSH_MS`].
    pub async fn shutdown(self) {
        let provider = self.provider;
        // The SDK's shutdown blocks its thread until the batch's task answers.
        let stop = tokio::task::spawn_blocking(move || {
            provider.shutdown_with_timeout(Duration::from_millis(SHUTDOWN_FLUSH_MS))
        });
        if let Ok(Err(e)) = stop.await {
            tracing::warn!(error = %e, "telemetry: the last spans could not all be sent");
        }
    }
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
