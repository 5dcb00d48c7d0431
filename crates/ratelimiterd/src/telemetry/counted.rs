//! The OTLP exporters and the span batch wrapped so that every span and
//! metric data point lost is counted ([`OtelDropped`]): the SDK (0.33) neither
//! exposes the batch's drops nor reports a failed export but in its own logs.
//!
//! - [`BoundedSpans`] holds the span queue's bound itself: a span that finds
//!   [`spans_queue_max`] spans not yet sent is dropped and counted, and the
//!   SDK's batch, given room for a few control messages more, never drops one
//!   silently.
//! - [`CountedSpans`] and [`CountedMetrics`] count a batch whose export failed
//!   (refused, timed out, unreachable), and release the spans' places in the
//!   bound once the export ended, however it ended (a timed-out export is dropped
//!   by the SDK: its guard counts it then).

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData, ResourceMetrics};
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::metrics::Temporality;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use opentelemetry_sdk::Resource;

use super::dropped::{OtelDropped, Signal};

/// The span queue's bound when `OTEL_BSP_MAX_QUEUE_SIZE` does not set one: the
/// OpenTelemetry specification's default.
pub const SPANS_QUEUE_MAX_DEFAULT: usize = 2048;
/// Places the SDK's batch queue has beyond the spans' bound, for its control
/// messages (a flush, the resource, the shutdown), so that no span is dropped there.
pub const CONTROL_SLOTS: usize = 16;

/// The span queue's bound: `OTEL_BSP_MAX_QUEUE_SIZE`, as the SDK reads it, else the default.
pub fn spans_queue_max() -> usize {
    std::env::var("OTEL_BSP_MAX_QUEUE_SIZE")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(SPANS_QUEUE_MAX_DEFAULT)
}

/// A batch of exports under way: counted lost when dropped before it succeeded,
/// its spans' places in the queue's bound released in any case.
struct Pending {
    signal: Signal,
    count: usize,
    dropped: Arc<OtelDropped>,
    /// The spans not yet sent, for the traces' bound.
    in_queue: Option<Arc<AtomicUsize>>,
    /// `None` once the export succeeded; else why it is lost.
    lost: Option<String>,
}

impl Pending {
    /// The export ended with `result`: lost only when it failed.
    fn settle(mut self, result: &OTelSdkResult) {
        self.lost = result.as_ref().err().map(|e| e.to_string());
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(in_queue) = &self.in_queue {
            in_queue.fetch_sub(self.count, Ordering::Relaxed);
        }
        if let Some(why) = &self.lost {
            self.dropped.count(self.signal, self.count as u64, why);
        }
    }
}

/// A span exporter whose failed batches are counted.
pub struct CountedSpans<E> {
    inner: E,
    dropped: Arc<OtelDropped>,
    in_queue: Arc<AtomicUsize>,
}

impl<E> CountedSpans<E> {
    /// `inner`, its losses counted in `dropped`, its exported spans released from `in_queue`.
    pub fn new(inner: E, dropped: Arc<OtelDropped>, in_queue: Arc<AtomicUsize>) -> Self {
        Self {
            inner,
            dropped,
            in_queue,
        }
    }
}

impl<E> fmt::Debug for CountedSpans<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CountedSpans")
    }
}

impl<E: SpanExporter> SpanExporter for CountedSpans<E> {
    fn export(&self, batch: Vec<SpanData>) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        let pending = Pending {
            signal: Signal::Traces,
            count: batch.len(),
            dropped: self.dropped.clone(),
            in_queue: Some(self.in_queue.clone()),
            lost: Some("the export did not finish in time".to_owned()),
        };
        let export = self.inner.export(batch);
        async move {
            let result = export.await;
            pending.settle(&result);
            result
        }
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The span batch behind a bound held here: what finds it full is dropped and counted.
#[derive(Debug)]
pub struct BoundedSpans<P> {
    inner: P,
    in_queue: Arc<AtomicUsize>,
    max: usize,
    dropped: Arc<OtelDropped>,
}

impl<P> BoundedSpans<P> {
    /// `inner` (built with room for `max` + [`CONTROL_SLOTS`]) holding at most
    /// `max` spans not yet sent, counted in `in_queue`.
    pub fn new(inner: P, (in_queue, max): (Arc<AtomicUsize>, usize), dropped: Arc<OtelDropped>) -> Self {
        Self {
            inner,
            in_queue,
            max,
            dropped,
        }
    }
}

impl<P: SpanProcessor> SpanProcessor for BoundedSpans<P> {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        if self.in_queue.fetch_add(1, Ordering::Relaxed) >= self.max {
            self.in_queue.fetch_sub(1, Ordering::Relaxed);
            self.dropped.count(Signal::Traces, 1, "the span queue is full");
            return;
        }
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// A metric exporter whose failed exports are counted, by data point.
pub struct CountedMetrics<E> {
    inner: E,
    dropped: Arc<OtelDropped>,
}

impl<E> CountedMetrics<E> {
    /// `inner`, its losses counted in `dropped`.
    pub fn new(inner: E, dropped: Arc<OtelDropped>) -> Self {
        Self { inner, dropped }
    }
}

impl<E: PushMetricExporter> PushMetricExporter for CountedMetrics<E> {
    fn export(&self, metrics: &ResourceMetrics) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        let pending = Pending {
            signal: Signal::Metrics,
            count: data_points(metrics),
            dropped: self.dropped.clone(),
            in_queue: None,
            lost: Some("the export did not finish in time".to_owned()),
        };
        let export = self.inner.export(metrics);
        async move {
            let result = export.await;
            pending.settle(&result);
            result
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn temporality(&self) -> Temporality {
        self.inner.temporality()
    }
}

/// The data points of an export: what is lost when it fails.
fn data_points(metrics: &ResourceMetrics) -> usize {
    fn of<T>(data: &MetricData<T>) -> usize {
        match data {
            MetricData::Gauge(g) => g.data_points().count(),
            MetricData::Sum(s) => s.data_points().count(),
            MetricData::Histogram(h) => h.data_points().count(),
            MetricData::ExponentialHistogram(h) => h.data_points().count(),
        }
    }
    let metrics = (metrics.scope_metrics()).flat_map(|scope| scope.metrics());
    metrics
        .map(|metric| match metric.data() {
            AggregatedMetrics::F64(data) => of(data),
            AggregatedMetrics::U64(data) => of(data),
            AggregatedMetrics::I64(data) => of(data),
        })
        .sum()
}
