//! The account model and the deterministic ids of every account and transfer
//! (docs/tigerbeetle-backend.md, "Account model"; docs/lease-ids.md, "Deterministic
//! TigerBeetle ids").
//!
//! One ledger holds every limit. The operator account is the source and sink of
//! capacity; each limit has a resource account whose balance is its capacity and
//! whose pending debits are the units in use; `overage: debt` limits also have a
//! debt account that records usage beyond what could be reserved; limits with a
//! calendar period also have a settled account, whose pending debits are what
//! completed calls hold until the period's end.

use crate::base::id::{id128, LeaseId};
use crate::model::key::LimitKey;
use tigerbeetle_unofficial as tb;

/// The single ledger of every limiter account (docs/tigerbeetle-backend.md, "Account
/// model").
pub const LEDGER_LIMITS: u32 = 1;

/// The code of reserve and re-reserve transfers (docs/tigerbeetle-backend.md, "Account
/// model": `CODE_LIMIT`).
pub const CODE_LIMIT: u16 = 1;
/// The code of posted transfers that fund a resource account (capacity increase).
pub const CODE_FUND: u16 = 2;
/// The code of posted transfers that take capacity back (applied decrease).
pub const CODE_DEFUND: u16 = 3;
/// The code of posted transfers that record overage as debt.
pub const CODE_DEBT: u16 = 4;
/// The code of a bucket's refill transfers (taken → resource, one per key and
/// slot boundary: [`refill_transfer_id`]).
pub const CODE_REFILL: u16 = 5;
/// The code of a bucket's refunds (taken → resource, a Complete that used less
/// than it took: [`refund_transfer_id`]).
pub const CODE_REFUND: u16 = 6;
/// The code of the pending transfers that mirror, on a period key's settled
/// account, what a completed call holds until the period's end
/// ([`settled_transfer_id`]).
pub const CODE_SETTLED: u16 = 7;
/// The code of the posted transfer that funds an owed account with
/// [`OWED_LOCKS_MAX`] once ([`owed_fund_transfer_id`]).
pub const CODE_OWED_FUND: u16 = 8;
/// The code of the pair of posted transfers in a reserve chain that take all of
/// an owed account's credit and give it back: the chain fails while the limit
/// owes ([`owed_check_ids`]).
pub const CODE_OWED_CHECK: u16 = 9;
/// The code of the pending transfer of one unit on an owed account that makes
/// an `overage: owe` limit refuse until the window or period of the usage it
/// could not hold ends ([`owed_lock_transfer_id`]).
pub const CODE_OWED_LOCK: u16 = 10;

/// How many windows or periods an owed account can owe at once: its credit,
/// each lock taking one unit until its timeout. Calls completing past the
/// budget while it already owes this many times add no lock (the limit owes
/// anyway, until the last lock ends); a bound so a storm of overages cannot
/// grow the account without end.
pub const OWED_LOCKS_MAX: u64 = 4096;

/// The ledger of lease records: the denied marker of a lease and its
/// completion record, zero-amount transfers at ids derived from the lease id
/// alone, so that a lease id's fate (denied, completed and how) is known to the
/// whole cluster, whichever keys a later request names.
pub const LEDGER_LEASES: u32 = 3;
/// The code of the zero-amount marker that opened the reserve chains of
/// earlier versions (a granted lease); chains now open with their first
/// reservation at the marker's id ([`reservation_id`]).
pub const CODE_LEASE_GRANTED: u16 = 32;
/// The code of the marker of a denied lease (written after the denial) at
/// the lease's first reservation id: a later chain of the lease then meets
/// `exists_with_different_*` at its first transfer.
pub const CODE_LEASE_DENIED: u16 = 33;
/// The code of a lease's completion record ([`completion_record`]).
pub const CODE_LEASE_COMPLETED: u16 = 34;
/// The code of a cluster-clock probe ([`clock_probe`]): a zero-amount
/// transfer written only to read the cluster's time back from its timestamp.
pub const CODE_CLOCK_PROBE: u16 = 35;
/// The account code of the two lease-marker accounts.
pub const ACCOUNT_CODE_LEASES: u16 = 5;

/// The account code of settled accounts ([`settled_account`]).
pub const ACCOUNT_CODE_SETTLED: u16 = 10;

/// The account code of the operator account.
pub const ACCOUNT_CODE_OPERATOR: u16 = 1;
/// The account code of resource accounts.
pub const ACCOUNT_CODE_RESOURCE: u16 = 2;
/// The account code of debt accounts.
pub const ACCOUNT_CODE_DEBT: u16 = 3;
/// The account code of a bucket's taken account ([`taken_account`]).
pub const ACCOUNT_CODE_TAKEN: u16 = 4;
/// The account code of an `overage: owe` limit's owed account ([`owed_account`]).
pub const ACCOUNT_CODE_OWED: u16 = 11;

/// The operator account's id: `acct:operator`. Computed once: every
/// reservation and re-reservation names it.
pub fn operator_account_id() -> u128 {
    static ID: std::sync::OnceLock<u128> = std::sync::OnceLock::new();
    *ID.get_or_init(|| id128("acct:operator"))
}

/// The resource account's id of `key`: `acct:limit:<key>`.
pub fn resource_account_id(key: &LimitKey) -> u128 {
    id128(&format!("acct:limit:{key}"))
}

/// The debt account's id of `key`: `acct:debt:<key>`.
pub fn debt_account_id(key: &LimitKey) -> u128 {
    id128(&format!("acct:debt:{key}"))
}

/// The settled account's id of the period key `key`: `acct:settled:<key>`.
pub fn settled_account_id(key: &LimitKey) -> u128 {
    id128(&format!("acct:settled:{key}"))
}

/// The taken account's id of the bucket `key`: `acct:taken:<key>`. Its
/// credit balance is what the bucket's reservations took and refills have not
/// yet given back (docs/tigerbeetle-backend.md, "Buckets").
pub fn taken_account_id(key: &LimitKey) -> u128 {
    id128(&format!("acct:taken:{key}"))
}

/// The id of the refill of the bucket `key` at slot boundary `boundary` of
/// slots of `slot_ms`: `xfer:refill:<key>:<slot_ms>:<boundary>`. One name per
/// key and boundary, so any server of a fleet may post it and it counts once;
/// the slot is part of the name because a new window renumbers the boundaries.
pub fn refill_transfer_id(key: &LimitKey, slot_ms: u64, boundary: u64) -> u128 {
    id128(&format!("xfer:refill:{key}:{slot_ms}:{boundary}"))
}

/// The id of the refund of the bucket `key` for `lease` (a Complete that used
/// less than the lease took): `xfer:refund:<lease_id>:<key>`, so a retried
/// Complete refunds once.
pub fn refund_transfer_id(lease: LeaseId, key: &LimitKey) -> u128 {
    id128(&format!("xfer:refund:{lease}:{key}"))
}

/// The id of the pending transfer that reserves `key` for `lease`:
/// `xfer:reserve:<lease_id>:<key>`, with the canonical upper-case lease id.
pub fn reserve_transfer_id(lease: LeaseId, key: &LimitKey) -> u128 {
    id128(&format!("xfer:reserve:{lease}:{key}"))
}

/// The id of the marker of `lease`: `xfer:lease:<lease_id>`, which is also
/// the id of the lease's first reservation ([`reservation_id`]).
pub fn lease_marker_id(lease: LeaseId) -> u128 {
    id128(&format!("xfer:lease:{lease}"))
}

/// The id of the pending transfer that holds the `index`-th requirement (in
/// request order) of `lease`: the first is `xfer:lease:<lease_id>`, the lease
/// marker's id, so the reservation itself marks the lease (a denied marker at
/// that id fails every later chain of the lease, whichever keys it names);
/// the others are `xfer:hold:<lease_id>:<index>`. Derived from the lease id
/// alone, so any server looks a lease's reservations up by id, many leases in
/// one request ([`super::lease_lookup`]).
pub fn reservation_id(lease: LeaseId, index: usize) -> u128 {
    match index {
        0 => lease_marker_id(lease),
        i => id128(&format!("xfer:hold:{lease}:{i}")),
    }
}

/// The id of the completion record of `lease`: `xfer:complete:<lease_id>`.
pub fn completion_id(lease: LeaseId) -> u128 {
    id128(&format!("xfer:complete:{lease}"))
}

/// The completion record of `lease`: a zero-amount transfer that opens the
/// linked chain of its first Complete, carrying a digest of that Complete's
/// actuals ([`actuals_digest`]) in `user_data_64`. The chain is all or
/// nothing, so the record exists exactly when that reconciliation was written;
/// a later Complete of the lease with other actuals, on any server, meets
/// `exists_with_different_user_data_64` and changes nothing.
pub fn completion_record(lease: LeaseId, digest: u64) -> tb::Transfer {
    lease_ledger_record(completion_id(lease), CODE_LEASE_COMPLETED)
        .with_user_data_128(lease.to_u128())
        .with_user_data_64(digest)
}

/// A record of the leases' ledger at `id` with `code`: a zero-amount
/// transfer between the two lease-marker accounts, which moves nothing and
/// exists only to be found (by id, or for its time stamp).
fn lease_ledger_record(id: u128, code: u16) -> tb::Transfer {
    tb::Transfer::new(id)
        .with_debit_account_id(id128("acct:leases:debit"))
        .with_credit_account_id(id128("acct:leases:credit"))
        .with_amount(0)
        .with_ledger(LEDGER_LEASES)
        .with_code(code)
}

/// A digest of a Complete's actuals, independent of their order and stable
/// across builds (SHA-256, like every id): two Completes of a lease are the
/// same Complete exactly when their digests are equal. Never 0, so a digest
/// is told apart from an unset field.
pub fn actuals_digest<'a>(actuals: impl Iterator<Item = (&'a LimitKey, u64)>) -> u64 {
    let mut sorted: Vec<(&LimitKey, u64)> = actuals.collect();
    sorted.sort_unstable();
    let label: String = sorted.iter().map(|(k, a)| format!("{k}={a};")).collect();
    (id128(&format!("actuals:{label}")) as u64).max(1)
}

/// The denied marker of `lease` at `id` (its first reservation id, or its
/// completion id when the first reservation's id is burnt): a zero-amount
/// transfer that no reservation can equal, carrying the lease like its
/// reservations.
pub fn denied_marker(lease: LeaseId, id: u128) -> tb::Transfer {
    lease_ledger_record(id, CODE_LEASE_DENIED).with_user_data_128(lease.to_u128())
}

/// A probe of the cluster's clock at `id` (`xfer:clock:<random>`): a
/// zero-amount transfer between the lease-marker accounts, which moves
/// nothing and is written once a minute at most per server
/// ([`super::cluster_clock`]); its timestamp is the cluster's time.
pub fn clock_probe(id: u128) -> tb::Transfer {
    lease_ledger_record(id, CODE_CLOCK_PROBE)
}

/// The id of a new clock probe: `xfer:clock:<a fresh ULID>`, never the id
/// of an earlier probe or of any lease's transfer.
pub fn clock_probe_id() -> u128 {
    id128(&format!("xfer:clock:{}", LeaseId::generate()))
}

/// The two accounts of lease markers: unconstrained, markers move no amount.
pub fn lease_marker_accounts() -> Vec<tb::Account> {
    ["acct:leases:debit", "acct:leases:credit"]
        .into_iter()
        .map(|label| tb::Account::new(id128(label), LEDGER_LEASES, ACCOUNT_CODE_LEASES))
        .collect()
}

/// The id of the transfer that voids the reservation of `key` for `lease`:
/// `xfer:void:<lease_id>:<key>`.
pub fn void_transfer_id(lease: LeaseId, key: &LimitKey) -> u128 {
    id128(&format!("xfer:void:{lease}:{key}"))
}

/// The id of the pending transfer that re-reserves the actual amount (or the
/// overage) of `key` for `lease` after Complete: `xfer:rereserve:<lease_id>:<key>`.
pub fn rereserve_transfer_id(lease: LeaseId, key: &LimitKey) -> u128 {
    id128(&format!("xfer:rereserve:{lease}:{key}"))
}

/// The id of the pending transfer that records on the settled account of the
/// period key `key` what `lease` holds after its Complete:
/// `xfer:settled:<lease_id>:<key>`, so a retried Complete records it once.
pub fn settled_transfer_id(lease: LeaseId, key: &LimitKey) -> u128 {
    id128(&format!("xfer:settled:{lease}:{key}"))
}

/// The id of the posted transfer that records overage of `key` for `lease` as
/// debt: `xfer:debt:<lease_id>:<key>`.
pub fn debt_transfer_id(lease: LeaseId, key: &LimitKey) -> u128 {
    id128(&format!("xfer:debt:{lease}:{key}"))
}

/// The owed account's id of `key`: `acct:owed:<key>`.
pub fn owed_account_id(key: &LimitKey) -> u128 {
    id128(&format!("acct:owed:{key}"))
}

/// The id of the one posted transfer that funds the owed account of `key` with
/// [`OWED_LOCKS_MAX`]: `xfer:owedfund:<key>`, so every apply of the definition,
/// on any server, funds it once.
pub fn owed_fund_transfer_id(key: &LimitKey) -> u128 {
    id128(&format!("xfer:owedfund:{key}"))
}

/// The ids of the `index`-th requirement's owed check in the reserve chain of
/// `lease` (take, give back): `xfer:owedcheck:<lease_id>:<index>` and
/// `xfer:owedreturn:<lease_id>:<index>`, so a retried chain is the same chain.
pub fn owed_check_ids(lease: LeaseId, index: usize) -> (u128, u128) {
    (
        id128(&format!("xfer:owedcheck:{lease}:{index}")),
        id128(&format!("xfer:owedreturn:{lease}:{index}")),
    )
}

/// The id of the lock a Complete of `lease` puts on the owed account of `key`:
/// `xfer:owedlock:<lease_id>:<key>`, so a retried Complete locks once.
pub fn owed_lock_transfer_id(lease: LeaseId, key: &LimitKey) -> u128 {
    id128(&format!("xfer:owedlock:{lease}:{key}"))
}

/// The id of the funding transfer of `key` made when the resource account's
/// posted counters were `credits_posted` and `debits_posted`.
///
/// Posted counters only grow and every funding or defunding changes one of them,
/// so each pair names one moment of the account's history: a retried or repeated
/// apply of the same state finds `exists` instead of funding twice.
pub fn fund_transfer_id(key: &LimitKey, credits_posted: u128, debits_posted: u128) -> u128 {
    id128(&format!("xfer:fund:{key}:{credits_posted}:{debits_posted}"))
}

/// The id of attempt `attempt` of carrying out the decrease of `key` whose
/// state has version `version` (the cluster timestamp of its record): one
/// name per decrease and attempt across a fleet, so at most one attempt posts.
pub fn decrease_transfer_id(key: &LimitKey, version: u64, attempt: u64) -> u128 {
    id128(&format!("xfer:decrease:{key}:{version}:{attempt}"))
}

/// The operator account: no balance constraint, since it is the other side of
/// every capacity and usage movement.
pub fn operator_account() -> tb::Account {
    tb::Account::new(operator_account_id(), LEDGER_LIMITS, ACCOUNT_CODE_OPERATOR)
}

/// The resource account of `key`: debits (reservations) can never exceed credits
/// (capacity), which is what makes over-admission impossible.
pub fn resource_account(key: &LimitKey) -> tb::Account {
    tb::Account::new(resource_account_id(key), LEDGER_LIMITS, ACCOUNT_CODE_RESOURCE)
        .with_flags(tb::account::Flags::DEBITS_MUST_NOT_EXCEED_CREDITS)
}

/// The taken account of the bucket `key`: its debits can never exceed its
/// credits. Refills and refunds are balancing transfers, which never take it
/// below 0 anyway; the flag makes the one plain debit, a burst that shrinks at
/// a steady capacity, fail rather than leave T below 0 (and the level above
/// the burst) when a refill raced it (docs/tigerbeetle-backend.md, "Buckets").
pub fn taken_account(key: &LimitKey) -> tb::Account {
    tb::Account::new(taken_account_id(key), LEDGER_LIMITS, ACCOUNT_CODE_TAKEN)
        .with_flags(tb::account::Flags::DEBITS_MUST_NOT_EXCEED_CREDITS)
}

/// The settled account of the period key `key` (docs/tigerbeetle-backend.md,
/// "Calendar periods"): unconstrained, it limits nothing; its pending debits are
/// the units that completed calls hold until the period's end, each mirrored by a
/// pending transfer of the same timeout as the hold, so they leave it together.
/// What a denial reads to tell "never" from "not now".
pub fn settled_account(key: &LimitKey) -> tb::Account {
    tb::Account::new(settled_account_id(key), LEDGER_LIMITS, ACCOUNT_CODE_SETTLED)
}

/// The owed account of the `overage: owe` limit `key` (docs/tigerbeetle-backend.md,
/// "Debt"): funded once with [`OWED_LOCKS_MAX`], its debits can never exceed its
/// credits; each pending lock of one unit means the limit owes until the lock's
/// timeout, and a reserve chain's check, which takes the whole credit and gives it
/// back, fails while any lock is pending.
pub fn owed_account(key: &LimitKey) -> tb::Account {
    tb::Account::new(owed_account_id(key), LEDGER_LIMITS, ACCOUNT_CODE_OWED)
        .with_flags(tb::account::Flags::DEBITS_MUST_NOT_EXCEED_CREDITS)
}

/// The owed check of requirement `index` of `lease` on the owed account of
/// `key`: a posted transfer of all of the account's credit to the operator,
/// refused (`exceeds_credits`) while a lock is pending, and one giving it back.
/// Both linked: they sit inside a reserve chain.
pub fn owed_check(lease: LeaseId, index: usize, key: &LimitKey) -> [tb::Transfer; 2] {
    let (take, give_back) = owed_check_ids(lease, index);
    let transfer = |id: u128, debit: u128, credit: u128| {
        tb::Transfer::new(id)
            .with_debit_account_id(debit)
            .with_credit_account_id(credit)
            .with_amount(u128::from(OWED_LOCKS_MAX))
            .with_ledger(LEDGER_LIMITS)
            .with_code(CODE_OWED_CHECK)
            .with_flags(tb::transfer::Flags::LINKED)
            .with_user_data_128(lease.to_u128())
    };
    [
        transfer(take, owed_account_id(key), operator_account_id()),
        transfer(give_back, operator_account_id(), owed_account_id(key)),
    ]
}

/// The debt account of `key`: unconstrained, its net debit is the recorded debt.
pub fn debt_account(key: &LimitKey) -> tb::Account {
    tb::Account::new(debt_account_id(key), LEDGER_LIMITS, ACCOUNT_CODE_DEBT)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: &str = "01ARZ3NDEKTSV4RRFFQ69G5FAV";

    fn key(k: &str) -> LimitKey {
        LimitKey::new(k).unwrap()
    }

    #[test]
    fn ids_use_the_adr_labels_with_canonical_lease_ids() {
        let lower = LeaseId::parse(&LEASE.to_lowercase()).unwrap();
        let k = key("global:llm:openai:gpt-4o:tpm");
        assert_eq!(reserve_transfer_id(lower, &k), 0xd0bf1ef341cd4698a8bf9e1d677e06c5);
        assert_eq!(
            reserve_transfer_id(lower, &k),
            id128(&format!("xfer:reserve:{LEASE}:{k}"))
        );
        assert_eq!(void_transfer_id(lower, &k), id128(&format!("xfer:void:{LEASE}:{k}")));
        assert_eq!(
            rereserve_transfer_id(lower, &k),
            id128(&format!("xfer:rereserve:{LEASE}:{k}"))
        );
        assert_eq!(debt_transfer_id(lower, &k), id128(&format!("xfer:debt:{LEASE}:{k}")));
        assert_eq!(operator_account_id(), 0xee06f35fb94212edc7e42a11203bfca8);
        assert_eq!(
            resource_account_id(&key("global:llm:openai:gpt-4o:rpm")),
            0x5d3c6e5c7ffc849315cfc5f4cb10615e
        );
        assert_eq!(debt_account_id(&k), id128(&format!("acct:debt:{k}")));
        assert_eq!(taken_account_id(&k), id128(&format!("acct:taken:{k}")));
        assert_eq!(
            refill_transfer_id(&k, 1_000, 42),
            id128(&format!("xfer:refill:{k}:1000:42"))
        );
        assert_ne!(refill_transfer_id(&k, 1_000, 42), refill_transfer_id(&k, 1_000, 43));
        assert_ne!(refill_transfer_id(&k, 1_000, 42), refill_transfer_id(&k, 2_000, 42));
        assert_eq!(
            refund_transfer_id(lower, &k),
            id128(&format!("xfer:refund:{LEASE}:{k}"))
        );
    }

    #[test]
    fn reservations_are_named_by_the_lease_and_their_index_only() {
        let lease = LeaseId::parse(LEASE).unwrap();
        assert_eq!(reservation_id(lease, 0), lease_marker_id(lease));
        assert_eq!(reservation_id(lease, 1), id128(&format!("xfer:hold:{LEASE}:1")));
        assert_ne!(reservation_id(lease, 1), reservation_id(lease, 2));
        assert_eq!(completion_id(lease), id128(&format!("xfer:complete:{LEASE}")));
    }

    #[test]
    fn actuals_digests_ignore_order_only() {
        let (a, b) = (key("a"), key("b"));
        let ab = actuals_digest([(&a, 1), (&b, 2)].into_iter());
        assert_eq!(ab, actuals_digest([(&b, 2), (&a, 1)].into_iter()));
        assert_ne!(ab, actuals_digest([(&a, 1), (&b, 3)].into_iter()));
        assert_ne!(ab, actuals_digest([(&a, 1)].into_iter()));
        assert_ne!(actuals_digest(std::iter::empty()), 0);
    }

    #[test]
    fn clock_probes_move_nothing_on_the_leases_ledger_at_fresh_ids() {
        let probe = clock_probe(clock_probe_id());
        assert_eq!(
            (probe.amount(), probe.ledger(), probe.code()),
            (0, LEDGER_LEASES, CODE_CLOCK_PROBE)
        );
        assert_ne!(clock_probe_id(), clock_probe_id());
        let codes = [CODE_LEASE_GRANTED, CODE_LEASE_DENIED, CODE_LEASE_COMPLETED];
        assert!(
            !codes.contains(&CODE_CLOCK_PROBE),
            "a probe is never read as a lease record"
        );
    }

    #[test]
    fn funding_ids_differ_by_history_and_attempt() {
        let k = key("k");
        assert_ne!(fund_transfer_id(&k, 10, 0), fund_transfer_id(&k, 10, 5));
        assert_ne!(decrease_transfer_id(&k, 10, 1), decrease_transfer_id(&k, 10, 2));
        assert_ne!(decrease_transfer_id(&k, 10, 1), decrease_transfer_id(&k, 11, 1));
        assert_eq!(fund_transfer_id(&k, 10, 0), fund_transfer_id(&k, 10, 0));
    }

    #[test]
    fn only_resource_and_taken_accounts_are_constrained() {
        let k = key("k");
        assert!(resource_account(&k)
            .flags()
            .contains(tb::account::Flags::DEBITS_MUST_NOT_EXCEED_CREDITS));
        assert!(operator_account().flags().is_empty());
        assert!(debt_account(&k).flags().is_empty());
        assert!(taken_account(&k)
            .flags()
            .contains(tb::account::Flags::DEBITS_MUST_NOT_EXCEED_CREDITS));
    }
}
