//! The circuit breaker of one deployment of a pool (docs/gateway.md, "Pools"):
//! after `failures` failures in a row (5xx, no connection, a timeout) the
//! deployment is left out of the pool's choice for `open_ms`; then it half-opens
//! and lets exactly one call through as a probe: a success closes it, a failure
//! opens it again. The state is this server's (each server of a fleet learns a
//! failing deployment from its own calls); a provider 429 is not a failure here,
//! it pauses the deployment fleet-wide instead (`pause.rs`). Its time is the
//! gateway's injected clock, so tests drive it through open, half-open and
//! closed without sleeping.

use std::sync::{Arc, Mutex};

use ratelimiter::clock::Clock;

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
    /// `Some`: open until then, in the clock's unix ms (half-open from then on).
    open_until_unix_ms: Option<u64>,
    /// A half-open probe is on its way.
    probing: bool,
}

/// One deployment's breaker.
#[derive(Debug)]
pub struct Breaker {
    config: BreakerConfig,
    inner: Mutex<Inner>,
    /// The gateway's clock.
    clock: Arc<dyn Clock>,
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
    /// A closed breaker, timed on `clock`.
    pub fn new(config: BreakerConfig, clock: Arc<dyn Clock>) -> Self {
        Self {
            config,
            inner: Mutex::new(Inner {
                failures_in_a_row: 0,
                open_until_unix_ms: None,
                probing: false,
            }),
            clock,
        }
    }

    /// The state now.
    pub fn state(&self) -> BreakerState {
        let now_unix_ms = self.clock.now_unix_ms();
        let inner = self.inner.lock().expect("breaker lock");
        match inner.open_until_unix_ms {
            None => BreakerState::Closed,
            Some(until) if now_unix_ms < until => BreakerState::Open,
            Some(_) => BreakerState::HalfOpen,
        }
    }

    /// Whether a call may go now; a [`Pass::Probe`] holds the one probe
    /// until [`Breaker::record`] (or [`Breaker::abandon`]) is called.
    pub fn pass(&self) -> Pass {
        let now_unix_ms = self.clock.now_unix_ms();
        let mut inner = self.inner.lock().expect("breaker lock");
        match inner.open_until_unix_ms {
            None => Pass::Go,
            Some(until) if now_unix_ms < until => Pass::Wait {
                retry_after_ms: until - now_unix_ms,
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

    /// Records a sent call's outcome now: a success closes, a failure counts
    /// and opens the breaker at `failures` in a row (a failed probe at once).
    pub fn record(&self, pass: Pass, success: bool) {
        let now_unix_ms = self.clock.now_unix_ms();
        let mut inner = self.inner.lock().expect("breaker lock");
        if pass == Pass::Probe {
            inner.probing = false;
        }
        if success {
            inner.failures_in_a_row = 0;
            inner.open_until_unix_ms = None;
            return;
        }
        inner.failures_in_a_row = inner.failures_in_a_row.saturating_add(1);
        let half_open = inner.open_until_unix_ms.is_some_and(|until| now_unix_ms >= until);
        if half_open || inner.failures_in_a_row >= self.config.failures {
            inner.open_until_unix_ms = Some(now_unix_ms.saturating_add(self.config.open_ms));
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
    use ratelimiter::FakeClock;

    #[test]
    fn opens_after_failures_in_a_row_then_lets_one_probe_through_on_its_clock() {
        let clock = Arc::new(FakeClock::new(1_000_000));
        let breaker = Breaker::new(
            BreakerConfig {
                failures: 2,
                open_ms: 1_000,
            },
            clock.clone(),
        );
        assert_eq!(breaker.pass(), Pass::Go);
        breaker.record(Pass::Go, false);
        breaker.record(Pass::Go, true);
        breaker.record(Pass::Go, false);
        assert_eq!(
            breaker.state(),
            BreakerState::Closed,
            "a success in between resets the count"
        );
        breaker.record(Pass::Go, false);
        assert_eq!(breaker.state(), BreakerState::Open);
        assert_eq!(breaker.pass(), Pass::Wait { retry_after_ms: 1_000 });
        clock.advance_ms(999);
        assert_eq!(breaker.pass(), Pass::Wait { retry_after_ms: 1 }, "the hint counts down");
        clock.advance_ms(1);
        assert_eq!(breaker.state(), BreakerState::HalfOpen);
        assert_eq!(breaker.pass(), Pass::Probe, "one probe");
        assert!(matches!(breaker.pass(), Pass::Wait { .. }), "only one");
        // A failed probe opens it again for the whole time.
        breaker.record(Pass::Probe, false);
        assert_eq!(breaker.state(), BreakerState::Open);
        clock.advance_ms(1_000);
        let probe = breaker.pass();
        assert_eq!(probe, Pass::Probe);
        // A probe given back unused lets the next caller probe.
        breaker.abandon(probe);
        assert_eq!(breaker.pass(), Pass::Probe);
        breaker.record(Pass::Probe, true);
        assert_eq!(breaker.state(), BreakerState::Closed);
        assert_eq!(breaker.pass(), Pass::Go);
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
