//! The in-process limiter: the library's memory backend, shared by every
//! Python thread of the process.

use std::path::PathBuf;
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Weak};
use std::time::Duration;

use pyo3::exceptions::PyFileNotFoundError;
use pyo3::prelude::*;
use ratelimiter::definition::LimitReport;
use ratelimiter::{Backend, Clock, FakeClock, LimitDefinition, Limiter, MemoryBackend, MemoryConfig, SystemClock};

use crate::convert::{self, detached};
use crate::errors;
use crate::outcome::Reservation;
use crate::runtime::{ready, shared};

/// How often pending capacity decreases are checked on the system clock by
/// default: every second, as `ratelimiterd`'s `decrease.check_interval_ms`.
const DECREASE_CHECK_INTERVAL_MS_DEFAULT: u64 = 1_000;
/// The longest check interval accepted: an hour, as the server's bound on its
/// decrease settings; a decrease that waits longer keeps its key idle.
const DECREASE_CHECK_INTERVAL_MS_MAX: u64 = 3_600_000;

/// Limits held in this process (single-binary mode): reserve and complete with
/// every semantic of the Rust library, thread-safe, the GIL released while Rust works.
#[pyclass(frozen, module = "llm_ratelimiter._native")]
pub struct MemoryLimiter {
    /// The library's memory backend: one lock, so reserves are all or nothing.
    backend: Arc<MemoryBackend>,
    /// Set when the limiter runs on a manual clock (tests, simulations).
    manual_clock: Option<Arc<FakeClock>>,
    /// Dropped with the limiter, which stops its decrease thread at once.
    _stop_decreases: Option<SyncSender<()>>,
}

/// Carries out the pending decreases of `backend` every `interval` until the
/// limiter is dropped (the other end of `stop` goes): what `ratelimiterd`'s
/// decrease task does, on a thread of its own so it needs no runtime (and
/// none is left half-alive in a forked child).
fn spawn_decrease_thread(backend: Weak<MemoryBackend>, interval: Duration) -> Option<SyncSender<()>> {
    let (stop, stopped) = mpsc::sync_channel::<()>(0);
    let spawned = std::thread::Builder::new()
        .name("llmrl-decrease".to_owned())
        .spawn(move || loop {
            match stopped.recv_timeout(interval) {
                Err(RecvTimeoutError::Timeout) => {}
                Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
            }
            let Some(backend) = backend.upgrade() else { return };
            // A failure only keeps the key conservative; the next tick retries.
            let _ = ready(backend.apply_pending_decreases());
        });
    // Without a thread (the system refused one) decreases wait for
    // `apply_pending_decreases`, as before: conservative, never unsafe.
    spawned.ok().map(|_| stop)
}

#[pymethods]
impl MemoryLimiter {
    /// A limiter with no limits. `None` keeps the library's default for each
    /// bound; `manual_clock_unix_ms` starts a clock that only
    /// `advance_clock_ms` moves. Pending decreases are carried out by a
    /// thread every `decrease_check_interval_ms` (default 1 s; 0: only by
    /// `apply_pending_decreases`); on a manual clock, on every
    /// `advance_clock_ms` instead, so time and decreases move together.
    #[new]
    #[pyo3(signature = (*, leases_max=None, settled_leases_max=None, failed_leases_max=None,
                        decrease_retry_ms=None, manual_clock_unix_ms=None, decrease_check_interval_ms=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        leases_max: Option<usize>,
        settled_leases_max: Option<usize>,
        failed_leases_max: Option<usize>,
        decrease_retry_ms: Option<u64>,
        manual_clock_unix_ms: Option<u64>,
        decrease_check_interval_ms: Option<u64>,
    ) -> PyResult<Self> {
        let check_interval_ms = decrease_check_interval_ms.unwrap_or(DECREASE_CHECK_INTERVAL_MS_DEFAULT);
        if check_interval_ms > DECREASE_CHECK_INTERVAL_MS_MAX {
            return Err(errors::invalid(
                py,
                "decrease_check_interval_ms",
                format!(
                    "decrease_check_interval_ms must be 0..={DECREASE_CHECK_INTERVAL_MS_MAX}, got {check_interval_ms}"
                ),
            ));
        }
        let defaults = MemoryConfig::default();
        let config = MemoryConfig {
            leases_max: leases_max.unwrap_or(defaults.leases_max),
            settled_leases_max: settled_leases_max.unwrap_or(defaults.settled_leases_max),
            failed_leases_max: failed_leases_max.unwrap_or(defaults.failed_leases_max),
            decrease_retry_ms: decrease_retry_ms.unwrap_or(defaults.decrease_retry_ms),
            ..defaults
        };
        if let Err(message) = config.validate() {
            let field = message.split_whitespace().next().unwrap_or("config").to_owned();
            return Err(errors::invalid(py, &field, message));
        }
        let manual_clock = manual_clock_unix_ms.map(|start| Arc::new(FakeClock::new(start)));
        let clock: Arc<dyn Clock> = match &manual_clock {
            Some(clock) => clock.clone(),
            None => Arc::new(SystemClock::new()),
        };
        let backend = detached(py, move || Arc::new(MemoryBackend::new(clock, config)))?;
        let stop_decreases = match (&manual_clock, check_interval_ms) {
            (None, 1..) => spawn_decrease_thread(Arc::downgrade(&backend), Duration::from_millis(check_interval_ms)),
            _ => None,
        };
        Ok(Self {
            backend,
            manual_clock,
            _stop_decreases: stop_decreases,
        })
    }

    /// Reserves every requirement or none; a denial is a value.
    #[pyo3(signature = (requirements, *, lease_id=None, job_id=None))]
    fn reserve(
        &self,
        py: Python<'_>,
        requirements: &Bound<'_, PyAny>,
        lease_id: Option<&Bound<'_, PyAny>>,
        job_id: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Reservation> {
        let lease = convert::lease_id(py, lease_id)?;
        let request = convert::reserve_request(py, requirements, lease, convert::job_id(py, job_id)?)?;
        let backend = &self.backend;
        let outcome = detached(py, || ready(backend.reserve(&request)))?;
        match outcome {
            Ok(outcome) => Ok(Reservation::new(lease, &outcome)),
            Err(e) => Err(errors::limiter_error(py, e, Some(lease))),
        }
    }

    /// Releases the lease's concurrency holds and reconciles its rolling limits
    /// to `actuals`; idempotent.
    #[pyo3(signature = (lease_id, actuals=None, *, job_id=None))]
    fn complete(
        &self,
        py: Python<'_>,
        lease_id: &Bound<'_, PyAny>,
        actuals: Option<&Bound<'_, PyAny>>,
        job_id: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let (lease, request) = convert::complete_call(py, lease_id, actuals, job_id)?;
        let backend = &self.backend;
        detached(py, || ready(backend.complete(&request)))?.map_err(|e| errors::limiter_error(py, e, Some(lease)))
    }

    /// Defines a limit from its JSON definition (the admin API's body); answers
    /// the report (state and usage) as JSON.
    fn define(&self, py: Python<'_>, definition_json: &str) -> PyResult<String> {
        let definition: LimitDefinition =
            serde_json::from_str(definition_json).map_err(|e| errors::invalid(py, "definition", e.to_string()))?;
        let backend = &self.backend;
        let report = detached(py, || {
            ready(async {
                backend.apply_definition(&definition).await?;
                backend.limit_report(definition.key()).await
            })
        })?
        .map_err(|e| errors::limiter_error(py, e, None))?;
        Ok(serde_json::to_string(&report).expect("reports serialize"))
    }

    /// Applies every limit of a registry file as `ratelimiterd` writes it
    /// (`data/limits.json`), pending decreases included; answers how many.
    fn load_limits_file(&self, py: Python<'_>, path: PathBuf) -> PyResult<usize> {
        if !path.exists() {
            return Err(PyFileNotFoundError::new_err(format!(
                "limits file {} does not exist",
                path.display()
            )));
        }
        let backend = &self.backend;
        let loaded = detached(py, || -> Result<_, String> {
            let states = ratelimiter::registry::load(&path).map_err(|e| e.to_string())?;
            for state in &states {
                ready(backend.apply_state(state)).map_err(|e| e.to_string())?;
            }
            Ok(states.len())
        })?;
        loaded.map_err(|message| errors::invalid(py, "path", message))
    }

    /// Every limit's report as a JSON array, ordered by key.
    fn limits(&self, py: Python<'_>) -> PyResult<String> {
        let backend = &self.backend;
        let reports =
            detached(py, || ready(backend.limit_reports()))?.map_err(|e| errors::limiter_error(py, e, None))?;
        Ok(serde_json::to_string(&reports).expect("reports serialize"))
    }

    /// One limit's report as JSON, `None` when the key is not defined.
    fn limit(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
        let key = convert::key(py, "key", key)?;
        let backend = &self.backend;
        let report: Option<LimitReport> =
            detached(py, || ready(backend.limit_report(&key)))?.map_err(|e| errors::limiter_error(py, e, None))?;
        Ok(report.map(|r| serde_json::to_string(&r).expect("reports serialize")))
    }

    /// Carries out the capacity decreases that usage now allows (what
    /// `ratelimiterd` does every second); answers how many were applied.
    fn apply_pending_decreases(&self, py: Python<'_>) -> PyResult<usize> {
        let backend = &self.backend;
        let applied = detached(py, || ready(backend.apply_pending_decreases()))?
            .map_err(|e| errors::limiter_error(py, e, None))?;
        Ok(applied.len())
    }

    /// Pauses `keys` for `duration_ms` (a provider's 429): holds their free capacity
    /// until then, re-holding what frees meanwhile, in the background.
    fn pause(&self, py: Python<'_>, keys: Vec<Bound<'_, PyAny>>, duration_ms: u64) -> PyResult<()> {
        let (pause, keys) = crate::headers::pause_of(py, &keys, duration_ms)?;
        let backend: Arc<dyn Backend> = self.backend.clone();
        let held = detached(py, move || shared().block_on(pause.hold(backend, &keys)))?;
        crate::headers::run_in_background(py, held)
    }

    /// Moves the manual clock forward, then carries out the pending decreases
    /// usage now allows (the system clock's thread does so every interval); an
    /// error on a limiter using the system clock.
    fn advance_clock_ms(&self, py: Python<'_>, ms: u64) -> PyResult<()> {
        match &self.manual_clock {
            Some(clock) => {
                clock.advance_ms(ms);
                let backend = &self.backend;
                detached(py, || ready(backend.apply_pending_decreases()))?
                    .map_err(|e| errors::limiter_error(py, e, None))?;
                Ok(())
            }
            None => Err(errors::invalid(
                py,
                "manual_clock_unix_ms",
                "advance_clock_ms needs a limiter created with manual_clock_unix_ms",
            )),
        }
    }
}
