//! The circuit breaker of one deployment of a pool (docs/gateway.md, "Pools"):
//! after `failures` failures in a row (5xx, no connection, a timeout) the
//! deployment is left out of the pool's choice for `open_ms`; then it half-opens
//! and lets exactly one call through as a probe: a success closes it, a failure
//! opens it again. The state is this server's (each server of a fleet learns a
//! failing deployment from its own calls); a provider 429 is not a failure here,
//! it pauses the deployment fleet-wide instead (`cooldown.rs`).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::config::BreakerConfig;
#[cfg(test)]
use crate::config::OPEN_MS_LIMIT;

/// The state a breaker shows in the metrics and the admin API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Calls flow.
    Closed,
    /// The deployment is left out until the open time ends.
    Open,
    /// One probe may go (or is on its way); the rest stay out.
    HalfOpen,
}

impl BreakerState {
    /// The name in the admin API and the label in `/metrics`.
    pub fn label(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }
}

#[derive(Debug)]
struct Inner {
    failures_in_a_row: u32,
    /// `Some`: open until then (half-open after it).
    open_until: Option<Instant>,
    /// A half-open probe is on its way.
    probing: bool,
}

/// One deployment's breaker.
#[derive(Debug)]
pub struct Breaker {
    config: BreakerConfig,
    inner: Mutex<Inner>,
}

/// Whether a call may be sent to the deployment now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// Closed: go.
    Go,
    /// Half-open: this call is the one probe; its outcome decides.
    Probe,
    /// Open, or a probe is already out: not now; retry in `retry_after_ms`.
    Wait {
        /// Until the breaker half-opens (or a probe's answer is due: 100 ms).
        retry_after_ms: u64,
    },
}

/// How often a caller looks again while a probe is on its way.
const PROBE_RECHECK_MS: u64 = 100;

impl Breaker {
    /// A closed breaker.
    pub fn new(config: BreakerConfig) -> Self {
        Self {
            config,
            inner: Mutex::new(Inner {
                failures_in_a_row: 0,
                open_until: None,
                probing: false,
            }),
        }
    }

    /// The state at `now`.
    pub fn state(&self, now: Instant) -> BreakerState {
        let inner = self.inner.lock().expect("breaker lock");
        match inner.open_until {
            None => BreakerState::Closed,
            Some(until) if now < until => BreakerState::Open,
            Some(_) => BreakerState::HalfOpen,
        }
    }

    /// Whether a call may go at `now`; a [`Pass::Probe`] holds the one probe
    /// until [`Breaker::record`] (or [`Breaker::abandon`]) is called.
    pub fn pass(&self, now: Instant) -> Pass {
        let mut inner = self.inner.lock().expect("breaker lock");
        match inner.open_until {
            None => Pass::Go,
            Some(until) if now < until => Pass::Wait {
                retry_after_ms: u64::try_from((until - now).as_millis()).unwrap_or(u64::MAX).max(1),
            },
            Some(_) if inner.probing => Pass::Wait {
                retry_after_ms: PROBE_RECHECK_MS,
            },
            Some(_) => {
                inner.probing = true;
                Pass::Probe
            }
        }
    }

    /// Gives the probe back unused (its call was not sent: the limits denied it).
    pub fn abandon(&self, pass: Pass) {
        if pass == Pass::Probe {
            self.inner.lock().expect("breaker lock").probing = false;
        }
    }

    /// Records a sent call's outcome at `now`: a success closes, a failure counts
    /// and opens the breaker at `failures` in a row (a failed probe at once).
    pub fn record(&self, pass: Pass, success: bool, now: Instant) {
        let mut inner = self.inner.lock().expect("breaker lock");
        if pass == Pass::Probe {
            inner.probing = false;
        }
        if success {
            inner.failures_in_a_row = 0;
            inner.open_until = None;
            return;
        }
        inner.failures_in_a_row = inner.failures_in_a_row.saturating_add(1);
        let half_open = inner.open_until.is_some_and(|until| now >= until);
        if half_open || inner.failures_in_a_row >= self.config.failures {
            inner.open_until = Some(now + Duration::from_millis(self.config.open_ms));
            if !half_open {
                tracing::warn!(
                    failures = inner.failures_in_a_row,
                    open_ms = self.config.open_ms,
                    "gateway: a deployment failed repeatedly; its breaker opened"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_failures_in_a_row_then_lets_one_probe_through() {
        let breaker = Breaker::new(BreakerConfig {
            failures: 2,
            open_ms: 1_000,
        });
        let t0 = Instant::now();
        assert_eq!(breaker.pass(t0), Pass::Go);
        breaker.record(Pass::Go, false, t0);
        breaker.record(Pass::Go, true, t0);
        breaker.record(Pass::Go, false, t0);
        assert_eq!(
            breaker.state(t0),
            BreakerState::Closed,
            "a success in between resets the count"
        );
        breaker.record(Pass::Go, false, t0);
        assert_eq!(breaker.state(t0), BreakerState::Open);
        assert!(matches!(breaker.pass(t0), Pass::Wait { retry_after_ms: 1_000 }));
        let later = t0 + Duration::from_millis(1_000);
        assert_eq!(breaker.state(later), BreakerState::HalfOpen);
        assert_eq!(breaker.pass(later), Pass::Probe, "one probe");
        assert!(matches!(breaker.pass(later), Pass::Wait { .. }), "only one");
        // A failed probe opens it again for the whole time.
        breaker.record(Pass::Probe, false, later);
        assert_eq!(breaker.state(later), BreakerState::Open);
        let again = later + Duration::from_millis(1_000);
        let probe = breaker.pass(again);
        assert_eq!(probe, Pass::Probe);
        // A probe given back unused lets the next caller probe.
        breaker.abandon(probe);
        assert_eq!(breaker.pass(again), Pass::Probe);
        breaker.record(Pass::Probe, true, again);
        assert_eq!(breaker.state(again), BreakerState::Closed);
        assert_eq!(breaker.pass(again), Pass::Go);
    }

    #[test]
    fn ranges_are_checked() {
        assert!(BreakerConfig::default().check().is_ok());
        let zero = BreakerConfig {
            failures: 0,
            ..BreakerConfig::default()
        };
        assert_eq!(zero.check().unwrap_err().0, "failures");
        let long = BreakerConfig {
            open_ms: OPEN_MS_LIMIT + 1,
            ..BreakerConfig::default()
        };
        assert_eq!(long.check().unwrap_err().0, "open_ms");
    }
}
