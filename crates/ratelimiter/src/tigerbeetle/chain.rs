//! A lease's chain of reservations as the backend sends it, and the timeouts
//! its transfers carry (docs/tigerbeetle-backend.md, "Reserve").

use tigerbeetle_unofficial as tb;

use crate::base::id::LeaseId;
use crate::model::definition::LimitState;
use crate::model::key::LimitKey;

use super::ids;

use tb::error::CreateTransferErrorKind as Kind;

/// Result codes that mean "a transfer with this id exists with other fields".
pub(super) fn is_different_existing(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::ExistsWithDifferentFlags
            | Kind::ExistsWithDifferentPendingId
            | Kind::ExistsWithDifferentTimeout
            | Kind::ExistsWithDifferentDebitAccountId
            | Kind::ExistsWithDifferentCreditAccountId
            | Kind::ExistsWithDifferentAmount
            | Kind::ExistsWithDifferentUserData128
            | Kind::ExistsWithDifferentUserData64
            | Kind::ExistsWithDifferentUserData32
            | Kind::ExistsWithDifferentLedger
            | Kind::ExistsWithDifferentCode
    )
}

/// A reservation's TigerBeetle timeout, in whole seconds: the window plus its
/// margin (`default_margin_ms` when the definition gives none) rounded up, or the
/// hold timeout. Rounded up because a timeout runs from the cluster's timestamp,
/// a moment after our grant, and must never end before window plus margin.
pub(super) fn timeout_seconds(state: &LimitState, default_margin_ms: u64) -> u32 {
    let hold_ms = state.definition().hold_with_margin_ms(default_margin_ms);
    u32::try_from(hold_ms.div_ceil(1000)).expect("windows, margins and timeouts are validated to fit u32")
}

/// The TigerBeetle timeout of one reservation of a request granted at
/// `reserved_at_unix_ms`: its own `hold_ms` rounded up to whole seconds (pending
/// transfers time out in seconds, so such a hold ends up to 1 s late, never early)
/// when it gave one; for a limit with a calendar period, the seconds from the grant
/// to the period's end, rounded up (the timeout runs from the cluster's timestamp, a
/// moment after the grant, so the hold ends at the boundary or up to a second
/// after it, never before); else [`timeout_seconds`].
pub(super) fn lease_timeout_seconds(
    state: &LimitState,
    default_margin_ms: u64,
    hold_ms: Option<u64>,
    reserved_at_unix_ms: u64,
) -> u32 {
    match (hold_ms, state.definition().period()) {
        (Some(hold_ms), _) => u32::try_from(hold_ms.div_ceil(1000)).expect("hold_ms is at most a day"),
        (None, Some(period)) => {
            let left_ms = period.end_unix_ms(reserved_at_unix_ms) - reserved_at_unix_ms;
            u32::try_from(left_ms.div_ceil(1000)).expect("a period is at most 31 days")
        }
        (None, None) => timeout_seconds(state, default_margin_ms),
    }
}

/// The chain that reserves `holds` (key, amount, timeout in seconds) for
/// `lease`, exactly as the backend sends it: benchmarks send it straight with
/// the client library to compare against the backend.
///
/// The `i`-th reservation's id derives from the lease and `i` alone
/// ([`ids::reservation_id`]); the first one's is the lease marker's, so a
/// lease denied on any server (its denied marker there, or that id burnt)
/// fails the chain whatever keys it names, at no extra transfer. The first
/// carries the number of reservations in `user_data_32`, so a lookup by id
/// knows which others to fetch.
pub fn lease_chain<'a>(
    lease: LeaseId,
    reserved_at_unix_ms: u64,
    holds: impl ExactSizeIterator<Item = (&'a LimitKey, u64, u32)>,
) -> Vec<tb::Transfer> {
    assert!(holds.len() >= 1, "a lease holds at least one requirement");
    let count = u32::try_from(holds.len()).expect("requirements are bounded");
    let last = holds.len() - 1;
    holds
        .enumerate()
        .map(|(i, (key, amount, timeout_seconds))| {
            let mut flags = tb::transfer::Flags::PENDING;
            if i < last {
                flags |= tb::transfer::Flags::LINKED;
            }
            tb::Transfer::new(ids::reservation_id(lease, i))
                .with_debit_account_id(ids::resource_account_id(key))
                .with_credit_account_id(ids::operator_account_id())
                .with_amount(u128::from(amount))
                .with_ledger(ids::LEDGER_LIMITS)
                .with_code(ids::CODE_LIMIT)
                .with_flags(flags)
                .with_timeout(timeout_seconds)
                .with_user_data_128(lease.to_u128())
                .with_user_data_64(reserved_at_unix_ms)
                .with_user_data_32(if i == 0 { count } else { 0 })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::definition::LimitDefinition;

    fn state(definition: LimitDefinition) -> LimitState {
        LimitState::active(definition)
    }

    #[test]
    fn timeouts_round_window_plus_margin_up_to_whole_seconds() {
        let key = LimitKey::new("k").unwrap();
        let rolling = LimitDefinition::rolling(key.clone(), 1, 10).unwrap();
        assert_eq!(timeout_seconds(&state(rolling.clone()), 0), 10, "no margin: the window");
        assert_eq!(
            timeout_seconds(&state(rolling.clone()), 50),
            11,
            "never shorter than window + margin"
        );
        assert_eq!(timeout_seconds(&state(rolling.clone()), 1000), 11);
        assert_eq!(timeout_seconds(&state(rolling.clone()), 1001), 12);
        let own = rolling.with_window_margin_ms(Some(0)).unwrap();
        assert_eq!(timeout_seconds(&state(own), 50), 10, "the definition's margin wins");
        let concurrency = LimitDefinition::concurrency(key, 1, 30).unwrap();
        assert_eq!(
            timeout_seconds(&state(concurrency.clone()), 50),
            30,
            "timeouts take no margin"
        );
        let held = state(concurrency);
        assert_eq!(
            lease_timeout_seconds(&held, 50, None, 0),
            30,
            "no hold_ms: the definition's"
        );
        assert_eq!(
            lease_timeout_seconds(&held, 50, Some(1), 0),
            1,
            "hold_ms rounds up to a second"
        );
        assert_eq!(lease_timeout_seconds(&held, 50, Some(2_001), 0), 3);
        assert_eq!(
            lease_timeout_seconds(&held, 50, Some(crate::model::wire::HOLD_MS_MAX), 0),
            86_400
        );
    }

    #[test]
    fn a_period_hold_times_out_at_the_period_end() {
        let key = LimitKey::new("budget").unwrap();
        let day = state(LimitDefinition::per_period(key.clone(), 1, crate::base::period::Period::Day).unwrap());
        // 2026-11-28T23:59:58.500Z: 1.5 s to midnight, rounded up to 2.
        let late = 1_795_910_398_500;
        assert_eq!(lease_timeout_seconds(&day, 50, None, late), 2);
        assert_eq!(
            lease_timeout_seconds(&day, 50, None, 1_795_910_400_000),
            86_400,
            "at midnight: a whole day"
        );
        let month = state(LimitDefinition::per_period(key, 1, crate::base::period::Period::Month).unwrap());
        // From 2026-11-28T00:00Z to 2026-12-01T00:00Z: three days.
        assert_eq!(lease_timeout_seconds(&month, 50, None, 1_795_824_000_000), 3 * 86_400);
        assert_eq!(lease_timeout_seconds(&month, 50, Some(1_000), late), 1, "hold_ms wins");
    }
}
