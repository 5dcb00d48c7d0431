//! The remote limiter: the library's `HttpClient` to `ratelimiterd`, driven by
//! the module's shared tokio runtime. Keep-alive, timeouts and retries of
//! unknown outcomes with the same lease id are the client's.

use std::future::Future;

use pyo3::prelude::*;
use ratelimiter::httpclient::{with_trace_context, HttpClient, HttpClientConfig, TraceContext};
use ratelimiter::id::LeaseId;
use ratelimiter::{LimitDefinition, Limiter, LimiterError};

use crate::convert::{self, detached};
use crate::errors;
use crate::outcome::Reservation;
use crate::runtime::shared;

/// A limiter served by `ratelimiterd` over HTTP. Blocking methods release the
/// GIL; the `*_async` ones return at once and call back from the runtime.
#[pyclass(frozen, module = "llm_ratelimiter._native")]
pub struct RemoteLimiter {
    /// The library's client; clones share its connection pool.
    client: HttpClient,
}

/// What an asynchronous call delivers to its callback.
enum Delivery {
    /// A reserve's outcome for the lease.
    Reserved(LeaseId, Result<ratelimiter::ReserveOutcome, LimiterError>),
    /// A complete's result for the lease.
    Completed(LeaseId, Result<(), LimiterError>),
}

#[pymethods]
impl RemoteLimiter {
    /// A client of the server at `base_urls` (`http://host:port`), or of the
    /// servers of a fleet when it is a list: the library's client fails over to
    /// the next one with the same lease id on no answer or a 503.
    #[new]
    #[pyo3(signature = (base_urls, *, token=None, request_timeout_ms=2_000, connect_timeout_ms=1_000,
                        retries_max=2, retry_wait_ms_max=1_000))]
    fn new(
        py: Python<'_>,
        base_urls: &Bound<'_, PyAny>,
        token: Option<String>,
        request_timeout_ms: u64,
        connect_timeout_ms: u64,
        retries_max: u32,
        retry_wait_ms_max: u64,
    ) -> PyResult<Self> {
        let config = HttpClientConfig {
            token,
            request_timeout_ms,
            connect_timeout_ms,
            retries_max,
            retry_wait_ms_max,
            ..HttpClientConfig::fleet(server_urls(py, base_urls)?)
        };
        let _entered = shared().enter();
        let client = HttpClient::new(config).map_err(|e| errors::invalid(py, "base_urls", e.to_string()))?;
        Ok(Self { client })
    }

    /// Reserves every requirement or none, waiting for the answer; sent with
    /// the caller's `traceparent` and `tracestate` when given.
    #[pyo3(signature = (requirements, *, lease_id=None, job_id=None, traceparent=None, tracestate=None))]
    fn reserve(
        &self,
        py: Python<'_>,
        requirements: &Bound<'_, PyAny>,
        lease_id: Option<&Bound<'_, PyAny>>,
        job_id: Option<&Bound<'_, PyAny>>,
        traceparent: Option<&str>,
        tracestate: Option<&str>,
    ) -> PyResult<Reservation> {
        let lease = convert::lease_id(py, lease_id)?;
        let request = convert::reserve_request(py, requirements, lease, convert::job_id(py, job_id)?)?;
        let context = trace_context(py, traceparent, tracestate)?;
        let client = &self.client;
        match detached(py, || shared().block_on(traced(context, client.reserve(&request))))? {
            Ok(outcome) => Ok(Reservation::new(lease, &outcome)),
            Err(e) => Err(errors::limiter_error(py, e, Some(lease))),
        }
    }

    /// Completes the lease, waiting for the answer; sent with the caller's
    /// `traceparent` and `tracestate` when given.
    #[pyo3(signature = (lease_id, actuals=None, *, job_id=None, traceparent=None, tracestate=None))]
    fn complete(
        &self,
        py: Python<'_>,
        lease_id: &Bound<'_, PyAny>,
        actuals: Option<&Bound<'_, PyAny>>,
        job_id: Option<&Bound<'_, PyAny>>,
        traceparent: Option<&str>,
        tracestate: Option<&str>,
    ) -> PyResult<()> {
        let (lease, request) = convert::complete_call(py, lease_id, actuals, job_id)?;
        let context = trace_context(py, traceparent, tracestate)?;
        let client = &self.client;
        detached(py, || shared().block_on(traced(context, client.complete(&request))))?
            .map_err(|e| errors::limiter_error(py, e, Some(lease)))
    }

    /// Pauses `keys` for `duration_ms` (a provider's 429) on the server, for every
    /// client of it: holds their free capacity, found by probing, until then,
    /// re-holding what frees meanwhile, in the background.
    fn pause(&self, py: Python<'_>, keys: Vec<Bound<'_, PyAny>>, duration_ms: u64) -> PyResult<()> {
        let (pause, keys) = crate::headers::pause_of(py, &keys, duration_ms)?;
        let limiter: std::sync::Arc<dyn Limiter> = std::sync::Arc::new(self.client.clone());
        let held = detached(py, move || shared().block_on(pause.hold_with(limiter, &keys)))?;
        crate::headers::run_in_background(py, held)
    }

    /// Starts a reserve and returns at once; `callback(reservation, error)` is
    /// called from a runtime thread with exactly one of the two set.
    #[pyo3(signature = (requirements, callback, *, lease_id=None, job_id=None, traceparent=None, tracestate=None))]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments, each optional.
    fn reserve_async(
        &self,
        py: Python<'_>,
        requirements: &Bound<'_, PyAny>,
        callback: Py<PyAny>,
        lease_id: Option<&Bound<'_, PyAny>>,
        job_id: Option<&Bound<'_, PyAny>>,
        traceparent: Option<&str>,
        tracestate: Option<&str>,
    ) -> PyResult<()> {
        let lease = convert::lease_id(py, lease_id)?;
        let request = convert::reserve_request(py, requirements, lease, convert::job_id(py, job_id)?)?;
        let context = trace_context(py, traceparent, tracestate)?;
        let client = self.client.clone();
        spawn_with_callback(
            async move { Delivery::Reserved(lease, traced(context, client.reserve(&request)).await) },
            callback,
            Some(lease),
        );
        Ok(())
    }

    /// Starts a complete and returns at once; `callback(None, error)` is called
    /// when it is done, `error` being `None` on success.
    #[pyo3(signature = (lease_id, callback, actuals=None, *, job_id=None, traceparent=None, tracestate=None))]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments, each optional.
    fn complete_async(
        &self,
        py: Python<'_>,
        lease_id: &Bound<'_, PyAny>,
        callback: Py<PyAny>,
        actuals: Option<&Bound<'_, PyAny>>,
        job_id: Option<&Bound<'_, PyAny>>,
        traceparent: Option<&str>,
        tracestate: Option<&str>,
    ) -> PyResult<()> {
        let (lease, request) = convert::complete_call(py, lease_id, actuals, job_id)?;
        let context = trace_context(py, traceparent, tracestate)?;
        let client = self.client.clone();
        spawn_with_callback(
            async move { Delivery::Completed(lease, traced(context, client.complete(&request)).await) },
            callback,
            Some(lease),
        );
        Ok(())
    }

    /// `PUT /v1/admin/limits`: defines a limit from its JSON definition; answers
    /// the report as JSON.
    fn define(&self, py: Python<'_>, definition_json: &str) -> PyResult<String> {
        let definition: LimitDefinition =
            serde_json::from_str(definition_json).map_err(|e| errors::invalid(py, "definition", e.to_string()))?;
        let client = &self.client;
        let report = detached(py, || shared().block_on(client.put_limit(&definition)))?
            .map_err(|e| errors::limiter_error(py, e, None))?;
        Ok(serde_json::to_string(&report).expect("reports serialize"))
    }

    /// `GET /v1/admin/limits`: every report as a JSON array, ordered by key.
    fn limits(&self, py: Python<'_>) -> PyResult<String> {
        let client = &self.client;
        let reports =
            detached(py, || shared().block_on(client.limits()))?.map_err(|e| errors::limiter_error(py, e, None))?;
        Ok(serde_json::to_string(&reports).expect("reports serialize"))
    }

    /// `GET /v1/admin/limits/{key}`: one report as JSON, `None` when undefined.
    fn limit(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
        let key = convert::key(py, "key", key)?;
        let client = &self.client;
        let report =
            detached(py, || shared().block_on(client.limit(&key)))?.map_err(|e| errors::limiter_error(py, e, None))?;
        Ok(report.map(|r| serde_json::to_string(&r).expect("reports serialize")))
    }
}

/// The caller's trace context, when it gave a `traceparent`; a malformed one
/// is an `InvalidArgumentError`, never sent.
fn trace_context(
    py: Python<'_>,
    traceparent: Option<&str>,
    tracestate: Option<&str>,
) -> PyResult<Option<TraceContext>> {
    let Some(traceparent) = traceparent else {
        return Ok(None);
    };
    TraceContext::new(traceparent, tracestate)
        .map(Some)
        .map_err(|e| errors::invalid(py, "traceparent", e.to_string()))
}

/// `future`, run within `context` when there is one.
async fn traced<F: Future>(context: Option<TraceContext>, future: F) -> F::Output {
    match context {
        Some(context) => with_trace_context(context, future).await,
        None => future.await,
    }
}

/// The server URLs from one `str` or a sequence of them (a `str` is a sequence
/// too, so it is looked at first).
fn server_urls(py: Python<'_>, base_urls: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    if let Ok(one) = base_urls.extract::<String>() {
        return Ok(vec![one]);
    }
    base_urls
        .extract::<Vec<String>>()
        .map_err(|_| errors::wrong_type(py, "base_urls", "a str or a list of str", base_urls))
}

/// Runs `work` on the shared runtime and hands its result to `callback`. The
/// work runs in a task of its own, so a panic in it reaches the callback as an
/// `InternalError` and the callback is always called.
fn spawn_with_callback(
    work: impl Future<Output = Delivery> + Send + 'static,
    callback: Py<PyAny>,
    lease: Option<LeaseId>,
) {
    let runtime = shared();
    let task = runtime.spawn(work);
    runtime.spawn(async move {
        let joined = task.await;
        Python::attach(|py| {
            let (value, error): (Py<PyAny>, Py<PyAny>) = match joined {
                Ok(Delivery::Reserved(lease, Ok(outcome))) => match Py::new(py, Reservation::new(lease, &outcome)) {
                    Ok(reservation) => (reservation.into_any(), py.None()),
                    Err(e) => (py.None(), e.into_value(py).into_any()),
                },
                Ok(Delivery::Completed(_, Ok(()))) => (py.None(), py.None()),
                Ok(Delivery::Reserved(lease, Err(e)) | Delivery::Completed(lease, Err(e))) => (
                    py.None(),
                    errors::limiter_error(py, e, Some(lease)).into_value(py).into_any(),
                ),
                Err(join_error) => {
                    let err = match join_error.try_into_panic() {
                        Ok(payload) => errors::panicked(py, &*payload),
                        Err(e) => errors::limiter_error(py, LimiterError::Backend(e.to_string()), lease),
                    };
                    (py.None(), err.into_value(py).into_any())
                }
            };
            if let Err(e) = callback.call1(py, (value, error)) {
                e.write_unraisable(py, Some(callback.bind(py)));
            }
        });
    });
}
