//! What a reserve decided, as Python values: a denial is a value, not an exception.

use pyo3::prelude::*;
use ratelimiter::id::LeaseId;
use ratelimiter::wire::{Denial as WireDenial, ReserveOutcome};

/// Why a reservation was not granted, with the retry hint and whether waiting can help.
#[pyclass(frozen, module = "llm_ratelimiter", eq)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    /// `insufficient_capacity`, `limit_decreasing`, `exceeds_capacity` or
    /// `lease_already_failed`: what the caller should do depends on it.
    #[pyo3(get)]
    pub reason: &'static str,
    /// The limit that denied, so the caller knows which limit is saturated;
    /// `None` for `lease_already_failed`, which is about the lease, not a limit.
    #[pyo3(get)]
    pub key: Option<String>,
    /// When to try again with a new lease id, in ms; 0 when waiting cannot help.
    #[pyo3(get)]
    pub retry_after_ms: u64,
    /// True when retrying this lease id can never succeed ("never", not "not now"):
    /// `exceeds_capacity` (the amount is larger than the whole limit) and
    /// `lease_already_failed` (this lease id was denied before).
    #[pyo3(get)]
    pub is_final: bool,
}

#[pymethods]
impl Denial {
    /// The wire `error` text, `reason:key`, as `ratelimiterd` answers it.
    #[getter]
    fn error_code(&self) -> String {
        match &self.key {
            Some(key) => format!("{}:{key}", self.reason),
            None => self.reason.to_owned(),
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "Denial(reason={:?}, key={:?}, retry_after_ms={}, is_final={})",
            self.reason,
            self.key.as_deref().unwrap_or("None"),
            self.retry_after_ms,
            if self.is_final { "True" } else { "False" }
        )
    }
}

impl From<&WireDenial> for Denial {
    fn from(denial: &WireDenial) -> Self {
        let (reason, key) = match denial {
            WireDenial::InsufficientCapacity { key, .. } => ("insufficient_capacity", Some(key)),
            WireDenial::LimitDecreasing { key, .. } => ("limit_decreasing", Some(key)),
            WireDenial::ExceedsCapacity { key } => ("exceeds_capacity", Some(key)),
            WireDenial::LeaseAlreadyFailed => ("lease_already_failed", None),
        };
        Self {
            reason,
            key: key.map(|k| k.to_string()),
            retry_after_ms: denial.retry_after_ms(),
            is_final: denial.is_permanent() || matches!(denial, WireDenial::LeaseAlreadyFailed),
        }
    }
}

/// The answer to one reserve: granted (truthy) or denied with a [`Denial`].
#[pyclass(frozen, module = "llm_ratelimiter", eq)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    /// The attempt's lease id: complete it after the call, or retry the reserve
    /// with it when the outcome was unknown.
    #[pyo3(get)]
    pub lease_id: String,
    /// Whether every requirement is held.
    #[pyo3(get)]
    pub allowed: bool,
    /// When the lease was reserved, in Unix ms (the original time on an
    /// idempotent retry); 0 when denied.
    #[pyo3(get)]
    pub reserved_at_unix_ms: u64,
    /// Why not, when denied.
    #[pyo3(get)]
    pub denial: Option<Denial>,
}

impl Reservation {
    /// The Python value of `outcome` for `lease_id`.
    pub fn new(lease_id: LeaseId, outcome: &ReserveOutcome) -> Self {
        let (reserved_at_unix_ms, denial) = match outcome {
            ReserveOutcome::Allowed { reserved_at_unix_ms } => (*reserved_at_unix_ms, None),
            ReserveOutcome::Denied(denial) => (0, Some(Denial::from(denial))),
        };
        Self {
            lease_id: lease_id.to_string(),
            allowed: denial.is_none(),
            reserved_at_unix_ms,
            denial,
        }
    }
}

#[pymethods]
impl Reservation {
    /// The denial's retry hint in ms; 0 when allowed.
    #[getter]
    fn retry_after_ms(&self) -> u64 {
        self.denial.as_ref().map_or(0, |d| d.retry_after_ms)
    }

    fn __bool__(&self) -> bool {
        self.allowed
    }

    fn __repr__(&self) -> String {
        match &self.denial {
            None => format!(
                "Reservation(lease_id={:?}, allowed=True, reserved_at_unix_ms={})",
                self.lease_id, self.reserved_at_unix_ms
            ),
            Some(d) => format!(
                "Reservation(lease_id={:?}, allowed=False, denial={})",
                self.lease_id,
                d.__repr__()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimiter::LimitKey;

    #[test]
    fn exceeds_capacity_and_lease_already_failed_are_final() {
        let key = LimitKey::new("global:llm:openai:gpt-4o:tpm").unwrap();
        let cases = [
            (
                WireDenial::InsufficientCapacity {
                    key: key.clone(),
                    retry_after_ms: 120,
                },
                "insufficient_capacity",
                120,
                false,
            ),
            (
                WireDenial::LimitDecreasing {
                    key: key.clone(),
                    retry_after_ms: 10_000,
                },
                "limit_decreasing",
                10_000,
                false,
            ),
            (
                WireDenial::ExceedsCapacity { key: key.clone() },
                "exceeds_capacity",
                0,
                true,
            ),
            (WireDenial::LeaseAlreadyFailed, "lease_already_failed", 0, true),
        ];
        for (wire, reason, retry_after_ms, is_final) in cases {
            let denial = Denial::from(&wire);
            assert_eq!(
                (denial.reason, denial.retry_after_ms, denial.is_final),
                (reason, retry_after_ms, is_final)
            );
            assert_eq!(denial.error_code(), wire.error_code());
        }
    }

    #[test]
    fn a_reservation_carries_its_lease_and_outcome() {
        let lease = LeaseId::generate();
        let allowed = Reservation::new(lease, &ReserveOutcome::Allowed { reserved_at_unix_ms: 7 });
        assert!(allowed.allowed && allowed.denial.is_none() && allowed.reserved_at_unix_ms == 7);
        assert_eq!(allowed.lease_id, lease.to_string());
        let denied = Reservation::new(lease, &ReserveOutcome::Denied(WireDenial::LeaseAlreadyFailed));
        assert!(!denied.allowed && denied.reserved_at_unix_ms == 0 && denied.retry_after_ms() == 0);
    }
}
