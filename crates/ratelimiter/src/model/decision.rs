//! The decisions every backend makes the same way, written once and executed
//! by both the memory and the TigerBeetle backend (docs/decisions.md): which
//! denial a request gets when several apply, whether a Complete's actuals are
//! acceptable, what a Complete does to each reserved requirement, and the error
//! texts of these answers. A backend supplies facts (definitions, usage,
//! TigerBeetle's result codes); the answer comes from here.
//!
//! The precedence rule: an answer that is final comes before one that is
//! transient, whatever the order of the requirements in the request. A request
//! that can never be granted says so with `retry_after_ms: 0` rather than
//! inviting a retry that cannot succeed.

use crate::base::id::LeaseId;
use crate::model::definition::{LimitKind, LimitState, LimitStatus, Overage};
use crate::model::error::LimiterError;
use crate::model::key::LimitKey;
use crate::model::wire::Denial;

/// The denial of a request that does not depend on usage, or `None` when usage decides
/// (docs/decisions.md, "Reserve precedence", rows 5 and 6): first an amount above its
/// limit's whole capacity, or a bucket's burst under the backend's default margin
/// `default_margin_ms` (final: `exceeds_capacity`, no retry hint), then a limit
/// waiting for a decrease (transient: `limit_decreasing` with `decrease_retry_ms`); each
/// names the first such key in request order. Neither burns the lease id: nothing was
/// attempted.
///
/// `requirements` yields each requirement's limit state and amount in request
/// order; it is walked twice, so it must be cheap to clone.
pub fn standing_denial<'a, I>(requirements: I, decrease_retry_ms: u64, default_margin_ms: u64) -> Option<Denial>
where
    I: IntoIterator<Item = (&'a LimitState, u64)>,
    I::IntoIter: Clone,
{
    let requirements = requirements.into_iter();
    for (state, amount) in requirements.clone() {
        if amount > state.definition().grantable_max(default_margin_ms) {
            let key = state.definition().key().clone();
            return Some(Denial::ExceedsCapacity { key });
        }
    }
    let (state, _) = requirements
        .into_iter()
        .find(|(state, _)| state.status() == LimitStatus::Decreasing)?;
    Some(Denial::LimitDecreasing {
        key: state.definition().key().clone(),
        retry_after_ms: decrease_retry_ms,
    })
}

/// Whether a requirement of `amount` on a limit with a calendar period, which does
/// not fit now, can never be granted in this period (docs/decisions.md, "Reserve
/// precedence", row 7): `settled_units` are held to the period's end by calls already
/// completed (their reservations reconciled to what they used), and only they
/// certainly stay. If every call still in flight reported a usage of 0 and every hold
/// that ends before the boundary ended, `capacity - settled_units` would be free; when
/// even that is less than `amount`, no retry can succeed before the boundary. Otherwise
/// the answer is "not now": in-flight calls may free room when they complete.
///
/// Both backends decide with this comparison; what they supply is the settled units
/// (the memory backend from its holds, TigerBeetle from the key's settled account).
pub fn period_is_spent(capacity: u64, settled_units: u64, amount: u64) -> bool {
    amount > capacity.saturating_sub(settled_units)
}

/// The answer to a requirement of a limit with a calendar period whose period is
/// spent ([`period_is_spent`]): final, as an amount above the whole capacity is,
/// since no retry can be granted before the period's boundary. It is
/// `exceeds_capacity:<key>` with no retry hint, which callers already treat as
/// "never" (a gateway answers 429 with `x-should-retry: false`). Unlike row 5 it
/// follows a real attempt, so it burns the lease id, as row 7 does.
pub fn period_exhausted(key: LimitKey) -> Denial {
    Denial::ExceedsCapacity { key }
}

/// The answer to a granted lease id asked for again with other requirements:
/// a lease id names one set of requirements for ever.
pub fn lease_reused(lease: LeaseId) -> LimiterError {
    LimiterError::Conflict(format!(
        "lease_id {lease} was already reserved with other requirements; use a new lease id"
    ))
}

/// The answer to defining a new key when the backend holds `limits_max`
/// already: the request is valid, the backend's state refuses it.
pub fn limits_full(limits_max: usize) -> LimiterError {
    LimiterError::Conflict(format!("at most {limits_max} limits can be defined"))
}

/// Checks one actual of a Complete (docs/decisions.md, "Complete", (b)): it must name a
/// key the lease reserved (`held_kind` is that requirement's kind, `None` when the lease
/// did not reserve the key), and a rolling or bucket one: a concurrency hold is released
/// whole, whatever is said about it. A backend checks every actual before it changes anything.
pub fn check_actual(lease: LeaseId, key: &LimitKey, held_kind: Option<LimitKind>) -> Result<(), LimiterError> {
    match held_kind {
        None => Err(LimiterError::InvalidRequest(format!(
            "actual for {key}, which lease {lease} did not reserve"
        ))),
        Some(LimitKind::Concurrency) => Err(LimiterError::InvalidRequest(format!(
            "actual for concurrency limit {key}: concurrency is released on complete, not reconciled"
        ))),
        Some(LimitKind::Rolling | LimitKind::Bucket) => Ok(()),
    }
}

/// The largest `actual_amount` a Complete may report, in multiples of the
/// key's capacity: a call that used a hundred times a limit's whole capacity
/// is a caller's bug, and unbounded actuals would push a key's debt and the
/// overage counters towards 2^64.
pub const ACTUAL_CAPACITY_MULTIPLE_MAX: u64 = 100;

/// Checks an actual's amount against its key's `capacity`: at most
/// [`ACTUAL_CAPACITY_MULTIPLE_MAX`] times it, else a 400 that changes nothing.
pub fn check_actual_amount(key: &LimitKey, actual_amount: u64, capacity: u64) -> Result<(), LimiterError> {
    let bound = capacity.saturating_mul(ACTUAL_CAPACITY_MULTIPLE_MAX);
    if actual_amount > bound {
        return Err(LimiterError::InvalidRequest(format!(
            "actual_amount {actual_amount} for {key} is more than {ACTUAL_CAPACITY_MULTIPLE_MAX} times its capacity \
             ({bound} at most)"
        )));
    }
    Ok(())
}

/// What a Complete does to one reserved requirement (docs/decisions.md, "Complete", (c)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reconcile {
    /// A concurrency hold ends now, whatever its timeout.
    Release,
    /// Nothing changes: no actual was given (the reservation stands until its
    /// window ends), the actual equals it, or the window is over and there is
    /// nothing left to give back.
    Keep,
    /// The reservation shrinks to the actual for the rest of its window: this
    /// many units are given back.
    Shrink {
        /// Reserved minus actual.
        release: u64,
    },
    /// The usage went beyond the reservation: reserve this many more for the
    /// rest of the window if they fit, else [`overage_fallback`].
    Overage {
        /// Actual minus reserved.
        extra: u64,
    },
    /// The usage went beyond the reservation after its window ended: there is
    /// no rest of the window to hold the extra in, so it goes straight to
    /// [`overage_fallback`].
    OverageAfterWindow {
        /// Actual minus reserved.
        extra: u64,
    },
}

/// The plan for one reserved requirement of `kind` and `reserved` units, given
/// the caller's `actual` (if any) and whether its window is already over.
///
/// A bucket follows the same plan as a rolling window, read for a bucket
/// (docs/bucket-limits.md): `Shrink` gives the units back to the bucket at once
/// (up to its burst), `Overage` takes the extra from the bucket if it holds it,
/// and after the window (the refill time plus margin) a Complete gives nothing back.
pub fn reconcile(kind: LimitKind, reserved: u64, actual: Option<u64>, window_over: bool) -> Reconcile {
    if kind == LimitKind::Concurrency {
        return Reconcile::Release;
    }
    let Some(actual) = actual else {
        return Reconcile::Keep;
    };
    match (actual.cmp(&reserved), window_over) {
        (std::cmp::Ordering::Equal, _) | (std::cmp::Ordering::Less, true) => Reconcile::Keep,
        (std::cmp::Ordering::Less, false) => Reconcile::Shrink {
            release: reserved - actual,
        },
        (std::cmp::Ordering::Greater, false) => Reconcile::Overage {
            extra: actual - reserved,
        },
        (std::cmp::Ordering::Greater, true) => Reconcile::OverageAfterWindow {
            extra: actual - reserved,
        },
    }
}

/// What becomes of overage that could not be reserved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverageFallback {
    /// Recorded as debt on the key (`overage: debt`), reported by the admin API.
    Debt,
    /// Dropped and counted in a metric (`overage: none`).
    Dropped,
}

/// The fallback of a limit's `overage` setting.
pub fn overage_fallback(overage: Overage) -> OverageFallback {
    match overage {
        Overage::Debt | Overage::Owe => OverageFallback::Debt,
        Overage::None => OverageFallback::Dropped,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::definition::LimitDefinition;

    fn key(name: &str) -> LimitKey {
        LimitKey::new(name).unwrap()
    }

    fn decreasing(name: &str) -> LimitState {
        let def = LimitDefinition::rolling(key(name), 100, 60).unwrap();
        let active = LimitState::active(def.clone());
        LimitState::after_definition(Some(&active), def.with_capacity(10).unwrap()).unwrap()
    }

    #[test]
    fn a_final_denial_wins_over_a_transient_one_in_any_order() {
        let a = decreasing("a");
        let b = LimitState::active(LimitDefinition::rolling(key("b"), 5, 60).unwrap());
        for order in [vec![(&a, 1), (&b, 6)], vec![(&b, 6), (&a, 1)]] {
            assert_eq!(
                standing_denial(order.iter().copied(), 10_000, 50),
                Some(Denial::ExceedsCapacity { key: key("b") })
            );
        }
        assert_eq!(
            standing_denial([(&b, 5), (&a, 1)], 10_000, 50),
            Some(Denial::LimitDecreasing {
                key: key("a"),
                retry_after_ms: 10_000
            })
        );
        assert_eq!(standing_denial([(&b, 5)], 10_000, 50), None);
    }

    #[test]
    fn a_bucket_refuses_for_ever_what_exceeds_its_burst() {
        // 6,000 per minute: the burst is 6,000 less 1 s + 240 ms of refill (124).
        let bucket = LimitState::active(LimitDefinition::bucket(key("b"), 6_000, 60).unwrap());
        assert_eq!(standing_denial([(&bucket, 5_876)], 10_000, 50), None);
        assert_eq!(
            standing_denial([(&bucket, 5_877)], 10_000, 50),
            Some(Denial::ExceedsCapacity { key: key("b") })
        );
        assert_eq!(
            reconcile(LimitKind::Bucket, 10, Some(4), false),
            Reconcile::Shrink { release: 6 }
        );
        assert!(check_actual(LeaseId::from_u128(1), &key("b"), Some(LimitKind::Bucket)).is_ok());
    }

    #[test]
    fn the_reconcile_plan_covers_every_case() {
        use LimitKind::{Concurrency, Rolling};
        assert_eq!(reconcile(Concurrency, 1, None, false), Reconcile::Release);
        assert_eq!(reconcile(Concurrency, 1, None, true), Reconcile::Release);
        assert_eq!(reconcile(Rolling, 10, None, false), Reconcile::Keep);
        assert_eq!(reconcile(Rolling, 10, Some(10), false), Reconcile::Keep);
        assert_eq!(reconcile(Rolling, 10, Some(4), false), Reconcile::Shrink { release: 6 });
        assert_eq!(reconcile(Rolling, 10, Some(4), true), Reconcile::Keep);
        assert_eq!(reconcile(Rolling, 10, Some(13), false), Reconcile::Overage { extra: 3 });
        assert_eq!(
            reconcile(Rolling, 10, Some(13), true),
            Reconcile::OverageAfterWindow { extra: 3 }
        );
    }

    #[test]
    fn a_period_is_spent_only_by_what_completed_calls_hold() {
        // $20 a day: $15 settled; a $5 call may still wait for in-flight calls.
        assert!(!period_is_spent(20, 15, 5));
        assert!(period_is_spent(20, 15, 6), "more than what the settled spend leaves");
        assert!(
            !period_is_spent(20, 0, 20),
            "nothing settled: in-flight calls may free it all"
        );
        assert!(period_is_spent(20, 25, 1), "settled beyond the capacity (overage)");
        assert!(period_is_spent(u64::MAX, u64::MAX, 1));
        assert!(!period_is_spent(u64::MAX, 0, u64::MAX));
    }

    #[test]
    fn actuals_name_reserved_rolling_keys() {
        let lease = LeaseId::from_u128(7);
        assert!(check_actual(lease, &key("a"), Some(LimitKind::Rolling)).is_ok());
        let unknown = check_actual(lease, &key("a"), None).unwrap_err();
        assert!(unknown
            .to_string()
            .starts_with("invalid_request: actual for a, which lease"));
        let held = check_actual(lease, &key("a"), Some(LimitKind::Concurrency)).unwrap_err();
        assert!(held.to_string().contains("concurrency limit a"));
    }
}
