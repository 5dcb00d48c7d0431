//! A span exporter whose exports run on the server's tokio runtime, for the
//! SDK's batch span processor that runs on a thread of its own.
//!
//! Why that processor: a span ended by a call goes into its bounded channel
//! and wakes nothing; its thread wakes when a batch is full or its period is
//! up. The processor that lives on the runtime instead wakes its task for
//! every span, a task switch per span on the workers that serve the calls
//! (BENCHMARKS.md, "What tracing costs a call"). Its thread drives an export by
//! blocking on it outside any runtime, while the HTTP and gRPC clients need
//! tokio's: this wrapper hands the export to the runtime and the thread waits
//! for its answer.

use std::sync::Arc;
use std::time::Duration;

use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use opentelemetry_sdk::Resource;
use tokio::runtime::Handle;

/// `E`, its exports run on `runtime`.
#[derive(Debug)]
pub struct OnRuntime<E> {
    inner: Arc<E>,
    runtime: Handle,
}

impl<E> OnRuntime<E> {
    /// `inner` exporting on `runtime` (the server's).
    pub fn new(inner: E, runtime: Handle) -> Self {
        Self {
            inner: Arc::new(inner),
            runtime,
        }
    }
}

impl<E: SpanExporter + 'static> SpanExporter for OnRuntime<E> {
    fn export(&self, batch: Vec<SpanData>) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let inner = self.inner.clone();
        self.runtime.spawn(async move {
            let result = inner.export(batch).await;
            let _ = answer.send(result);
        });
        async move {
            answered.await.unwrap_or_else(|_| {
                Err(OTelSdkError::InternalFailure(
                    "the runtime stopped during the export".into(),
                ))
            })
        }
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        // The SDK sets the resource when the provider is built, before any
        // export holds a clone of the exporter.
        match Arc::get_mut(&mut self.inner) {
            Some(inner) => inner.set_resource(resource),
            None => tracing::warn!("telemetry: the resource could not be set during an export"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Context, Poll, Wake, Waker};

    use super::*;

    /// An exporter that needs tokio's timer, counting its exports.
    #[derive(Debug, Default)]
    struct NeedsTokio(Arc<AtomicUsize>);

    impl SpanExporter for NeedsTokio {
        async fn export(&self, _batch: Vec<SpanData>) -> OTelSdkResult {
            tokio::time::sleep(Duration::from_millis(1)).await;
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }

    /// Wakes the thread that blocks.
    struct Unpark(std::thread::Thread);

    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }

    /// Blocks this thread on `future` with no runtime at all, as the SDK's
    /// processor thread does (`futures_executor::block_on`).
    fn block_on<F: std::future::Future>(future: F) -> F::Output {
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut future = std::pin::pin!(future);
        loop {
            match future.as_mut().poll(&mut Context::from_waker(&waker)) {
                Poll::Ready(output) => return output,
                Poll::Pending => std::thread::park(),
            }
        }
    }

    #[test]
    fn an_export_blocked_on_outside_the_runtime_runs_on_it() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let exports = Arc::new(AtomicUsize::new(0));
        let exporter = OnRuntime::new(NeedsTokio(exports.clone()), runtime.handle().clone());
        let result = std::thread::spawn(move || block_on(exporter.export(Vec::new())))
            .join()
            .unwrap();
        assert!(result.is_ok(), "{result:?}");
        assert_eq!(exports.load(Ordering::SeqCst), 1);
    }
}
