//! The fleet's claims of budget alerts (docs/gateway.md, "Budgets and spend"):
//! every server of a fleet reads the same budget, so each may see the same
//! crossing of an `alert_at` fraction. Before it logs and posts one, a server
//! claims it in the cluster; the one whose claim is first alerts, the others
//! skip it. One server alone (the memory backend) has nothing to claim: its
//! own once-per-period memory is enough.

use std::fmt;

use async_trait::async_trait;

use crate::model::error::LimiterError;

/// One crossing, as every server of the fleet names it alike: the budget's
/// limit key, the start of the span it was crossed in, and the fraction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Crossing<'a> {
    /// The budget's limit key (`tenant:acme:usd:month`).
    pub budget: &'a str,
    /// The start of its calendar period, Unix ms; for a rolling window, the
    /// start of the window-long slot of the clock the crossing fell in.
    pub span_start_unix_ms: u64,
    /// The fraction crossed, in (0, 1].
    pub fraction: f64,
}

impl Crossing<'_> {
    /// The text every server makes the claim's id of: the budget's length
    /// first, so that no budget and span can be read as another's.
    pub fn identity(&self) -> String {
        format!(
            "alert:{}:{}:{}:{}",
            self.budget.len(),
            self.budget,
            self.span_start_unix_ms,
            self.fraction.to_bits()
        )
    }
}

/// Whether a server is the one to alert a crossing.
#[async_trait]
pub trait AlertClaims: Send + Sync + fmt::Debug {
    /// Claims `crossing` for this server: `Ok(true)` when no server of the
    /// fleet claimed it before (this one alerts), `Ok(false)` when one did
    /// (this one skips it). An error when the cluster does not answer: the
    /// caller alerts then, preferring a duplicate to a lost alert.
    async fn claim(&self, crossing: &Crossing<'_>) -> Result<bool, LimiterError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_budget_span_and_fraction_is_its_own_claim() {
        let crossing = Crossing {
            budget: "tenant:acme:usd:day",
            span_start_unix_ms: 1_000,
            fraction: 0.5,
        };
        let id = crossing.identity();
        assert_eq!(id, crossing.identity());
        assert_ne!(
            id,
            Crossing {
                fraction: 0.8,
                ..crossing
            }
            .identity()
        );
        assert_ne!(
            id,
            Crossing {
                span_start_unix_ms: 2_000,
                ..crossing
            }
            .identity()
        );
        assert_ne!(
            id,
            Crossing {
                budget: "tenant:beta:usd:day",
                ..crossing
            }
            .identity()
        );
        // The budget's length keeps `a:1` + 2 apart from `a` + 1 (a budget
        // key never holds such text, but the id does not rely on it).
        let a = Crossing {
            budget: "a:1",
            span_start_unix_ms: 2,
            fraction: 1.0,
        };
        let b = Crossing {
            budget: "a",
            span_start_unix_ms: 1,
            fraction: 1.0,
        };
        assert_ne!(a.identity(), b.identity());
    }
}
