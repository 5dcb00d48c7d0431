//! Token buckets on TigerBeetle (docs/tigerbeetle-backend.md, "Buckets";
//! docs/bucket-limits.md), with the arithmetic of [`crate::bucket`].
//!
//! A bucket key has two accounts: its resource account R, funded with the
//! bucket's burst, whose available balance is the bucket's level, and its
//! taken account T, whose credit balance is what was taken and not yet
//! refilled; R + T is the burst at all times. A reservation is a posted
//! transfer R → T (TigerBeetle refuses it with `exceeds_credits` when the level
//! is short). Each slot boundary's refill is a `balancing_debit` transfer
//! T → R at an id that names the key and the boundary: it moves at most what
//! T holds, so the level never exceeds the burst, and any server may post it
//! (a second post is `exists`). Refills are posted only once the cluster's
//! clock has passed their boundary ([`super::cluster_clock`]: a lower bound,
//! never a server's wall clock, which may run ahead), in the same request as
//! the reservation and before it. A Complete that used less gives the
//! difference back by a `balancing_debit` T → R at an id named by the lease.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::base::id::LeaseId;
use crate::model::bucket::BucketShape;
use crate::model::definition::{LimitKind, LimitState};
use crate::model::error::LimiterError;
use crate::model::key::LimitKey;
use tigerbeetle_unofficial as tb;

use super::cluster_clock::DRIFT_PPM;
use super::ids;
use super::submitter::Failure;

use tb::error::CreateTransferErrorKind as Kind;

/// Nanoseconds in a millisecond: the cluster's stamps are ns, slots ms.
pub(super) const NANOS_PER_MS: u64 = 1_000_000;

/// Parts per million in a whole, to stretch a hint by [`DRIFT_PPM`].
const PPM: u64 = 1_000_000;

/// How long a bucket's level, read for a denial's hint, also answers the
/// key's other denials: under a storm of denials on one key this bounds the
/// hint's reads to 100 a second (each denial would otherwise cost a request of
/// its own besides its chain), while a level at most this old gives a hint off
/// by no more than the takes and refunds of 10 ms (a take since makes it
/// early: a retry too soon; a refund makes it late by a fraction of a slot).
pub const LEVEL_READ_AGE_MAX: Duration = Duration::from_millis(10);

/// One bucket a request names: its key and its shape under the backend's
/// default margin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Bucket {
    /// The limit.
    pub key: LimitKey,
    /// Its slots, refills and burst.
    pub shape: BucketShape,
}

/// The shape of `state` (a bucket) when the backend's default margin is
/// `default_margin_ms`; a definition whose margin leaves no burst is refused
/// as invalid, before anything is changed.
pub(super) fn shape_of(state: &LimitState, default_margin_ms: u64) -> Result<BucketShape, LimiterError> {
    BucketShape::new(state.definition(), default_margin_ms).map_err(LimiterError::from)
}

/// The bucket of `state`, or `None` for another kind (or a bucket this backend
/// cannot serve, which its definition was refused for).
pub(super) fn bucket_of(state: &LimitState, default_margin_ms: u64) -> Option<Bucket> {
    if state.definition().kind() != LimitKind::Bucket {
        return None;
    }
    let shape = shape_of(state, default_margin_ms).ok()?;
    Some(Bucket {
        key: state.definition().key().clone(),
        shape,
    })
}

/// What this process knows of the refills posted: per key, the slot length and
/// the last boundary it saw posted (by itself, or `exists`), so that steady
/// state sends at most one refill per slot per key.
#[derive(Debug, Default)]
pub struct RefillMemory {
    last: Mutex<HashMap<LimitKey, (u64, u64)>>,
}

impl RefillMemory {
    /// The last boundary of `bucket` known posted, if any (under its current slot).
    pub(super) fn last_posted(&self, bucket: &Bucket) -> Option<u64> {
        let last = self.last.lock().expect("refill memory lock");
        match last.get(&bucket.key) {
            Some(&(slot_ms, boundary)) if slot_ms == bucket.shape.slot_ms() => Some(boundary),
            _ => None,
        }
    }

    /// Remembers that every refill of `bucket` through `boundary` is posted.
    fn remember(&self, bucket: &Bucket, boundary: u64) {
        let slot_ms = bucket.shape.slot_ms();
        let mut last = self.last.lock().expect("refill memory lock");
        let entry = last.entry(bucket.key.clone()).or_insert((slot_ms, boundary));
        if entry.0 != slot_ms || entry.1 < boundary {
            *entry = (slot_ms, boundary);
        }
    }

    /// The first boundary of `bucket` to post when `due` is due: after the
    /// last known posted, and no earlier than [`BucketShape::boundaries_to_fill`]
    /// back (earlier refills cannot change a bucket those fill), never 0.
    fn first_unposted(&self, bucket: &Bucket, due: u64) -> u64 {
        let floor = due.saturating_sub(bucket.shape.boundaries_to_fill()) + 1;
        let known = self.last_posted(bucket).map_or(0, |b| b.saturating_add(1));
        floor.max(known).max(1)
    }
}

/// Levels read for denials' hints, per key: when read, the boundary the level
/// was known refilled through, and the level ([`LEVEL_READ_AGE_MAX`]).
#[derive(Debug, Default)]
pub struct LevelReads {
    reads: Mutex<HashMap<LimitKey, (Instant, u64, u64)>>,
}

impl LevelReads {
    /// The level of `key` read at most [`LEVEL_READ_AGE_MAX`] before `now`
    /// with refills known through `after`, if any.
    pub(super) fn fresh(&self, key: &LimitKey, after: u64, now: Instant) -> Option<u64> {
        let reads = self.reads.lock().expect("level reads lock");
        let &(read_at, read_after, level) = reads.get(key)?;
        (read_after == after && now.saturating_duration_since(read_at) <= LEVEL_READ_AGE_MAX).then_some(level)
    }

    /// Keeps `level`, read at `read_at` with refills known through `after`.
    pub(super) fn keep(&self, key: &LimitKey, after: u64, level: u64, read_at: Instant) {
        let mut reads = self.reads.lock().expect("level reads lock");
        reads.insert(key.clone(), (read_at, after, level));
    }
}

/// The refills due on some buckets at one moment of the cluster's clock.
#[derive(Debug, Default)]
pub(super) struct Refills {
    /// The refill transfers, bucket by bucket, boundaries in order.
    pub transfers: Vec<tb::Transfer>,
    /// Per bucket: the boundary due, and its transfers' indexes.
    spans: Vec<(Bucket, u64, Range<usize>)>,
}

impl Refills {
    /// The refills of `buckets` due at `now_ms` (the cluster's time, at least)
    /// that `memory` does not know posted; refills of 0 units are skipped.
    pub fn due(memory: &RefillMemory, buckets: &[Bucket], now_ms: u64) -> Self {
        let mut refills = Self::default();
        for bucket in buckets {
            if refills.spans.iter().any(|(b, _, _)| b.key == bucket.key) {
                continue;
            }
            let due = bucket.shape.boundary_at(now_ms);
            let first = memory.first_unposted(bucket, due);
            if first > due {
                // All posted already: the steady state within a slot, at no cost.
                continue;
            }
            let start = refills.transfers.len();
            for boundary in first..=due {
                let amount = bucket.shape.refill_at(boundary);
                if amount > 0 {
                    refills.transfers.push(refill(bucket, boundary, amount));
                }
            }
            refills
                .spans
                .push((bucket.clone(), due, start..refills.transfers.len()));
        }
        refills
    }

    /// Remembers in `memory`, per bucket, the boundary through which every
    /// refill is now posted: those whose transfers all succeeded or existed
    /// (`failures` are indexed within [`Self::transfers`]).
    pub fn settle(&self, memory: &RefillMemory, failures: &[Failure]) {
        for (bucket, due, span) in &self.spans {
            let failed = failures.iter().filter(|f| span.contains(&f.index));
            let mut posted = true;
            for failure in failed {
                if !counts_as_posted(failure.kind()) {
                    tracing::warn!(key = %bucket.key, code = ?failure.kind(), "a bucket refill was not posted");
                    posted = false;
                }
            }
            if posted {
                memory.remember(bucket, *due);
            }
        }
    }
}

/// A refill's result that means the boundary's refill is in the cluster: a
/// second post of a balancing transfer is `exists` (TigerBeetle accepts a
/// re-sent balancing transfer whose amount is at least the one it moved), and
/// one by a server whose definition had another capacity is
/// `exists_with_different_amount`: either way the boundary refilled once.
fn counts_as_posted(kind: Kind) -> bool {
    matches!(kind, Kind::Exists | Kind::ExistsWithDifferentAmount)
}

/// The refill of `bucket` at `boundary`: T → R, `balancing_debit`, so it moves
/// at most what T holds and the level never passes the burst.
fn refill(bucket: &Bucket, boundary: u64, amount: u64) -> tb::Transfer {
    tb::Transfer::new(ids::refill_transfer_id(&bucket.key, bucket.shape.slot_ms(), boundary))
        .with_debit_account_id(ids::taken_account_id(&bucket.key))
        .with_credit_account_id(ids::resource_account_id(&bucket.key))
        .with_amount(u128::from(amount))
        .with_ledger(ids::LEDGER_LIMITS)
        .with_code(ids::CODE_REFILL)
        .with_flags(tb::transfer::Flags::BALANCING_DEBIT)
        .with_user_data_64(boundary)
}

/// A lease chain's reservation of the bucket `key` as a posted take, R → T:
/// the same id, amount, link and lease fields, no pending flag and no timeout
/// (a bucket's units come back by refill, never by expiry).
pub(super) fn as_take(reservation: tb::Transfer, key: &LimitKey) -> tb::Transfer {
    let mut flags = reservation.flags();
    flags.remove(tb::transfer::Flags::PENDING);
    let mut take = reservation
        .with_credit_account_id(ids::taken_account_id(key))
        .with_timeout(0);
    take.set_flags(flags);
    take
}

/// The take of `extra` units of the bucket `key` beyond a lease's reservation
/// (a Complete's overage), at the lease's re-reserve id.
pub(super) fn overage_take(lease: LeaseId, key: &LimitKey, extra: u64) -> tb::Transfer {
    tb::Transfer::new(ids::rereserve_transfer_id(lease, key))
        .with_debit_account_id(ids::resource_account_id(key))
        .with_credit_account_id(ids::taken_account_id(key))
        .with_amount(u128::from(extra))
        .with_ledger(ids::LEDGER_LIMITS)
        .with_code(ids::CODE_LIMIT)
        .with_user_data_128(lease.to_u128())
}

/// The refund of `units` of the bucket `key` to the bucket (a Complete that
/// used less than `lease` took): T → R, `balancing_debit`, so it never lifts
/// the level above the burst; its id names the lease, so it counts once.
pub(super) fn refund(lease: LeaseId, key: &LimitKey, units: u64) -> tb::Transfer {
    tb::Transfer::new(ids::refund_transfer_id(lease, key))
        .with_debit_account_id(ids::taken_account_id(key))
        .with_credit_account_id(ids::resource_account_id(key))
        .with_amount(u128::from(units))
        .with_ledger(ids::LEDGER_LIMITS)
        .with_code(ids::CODE_REFUND)
        .with_flags(tb::transfer::Flags::BALANCING_DEBIT)
        .with_user_data_128(lease.to_u128())
}

/// `wait_ms` of the cluster's clock as the least time the caller must wait on
/// its own: the cluster's clock is read as a lower bound that advances
/// [`DRIFT_PPM`] slower than real time, so the wait is stretched by as much,
/// rounded up.
pub(super) fn stretched_ms(wait_ms: u64) -> u64 {
    let stretched = (u128::from(wait_ms) * u128::from(PPM)).div_ceil(u128::from(PPM - DRIFT_PPM));
    u64::try_from(stretched).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(name: &str, capacity: u64, window_ms: u64) -> Bucket {
        Bucket {
            key: LimitKey::new(name).unwrap(),
            shape: BucketShape::from_parts(capacity, window_ms, 0).unwrap(),
        }
    }

    fn boundaries(refills: &Refills) -> Vec<u64> {
        refills.transfers.iter().map(|t| t.user_data_64()).collect()
    }

    #[test]
    fn a_new_process_posts_the_last_fill_once_then_one_refill_a_slot() {
        let memory = RefillMemory::default();
        let b = bucket("k", 6_000, 60_000); // 100 per 1 s slot
        let first = Refills::due(&memory, std::slice::from_ref(&b), 1_000_500);
        assert_eq!(
            boundaries(&first),
            (940..=1_000).collect::<Vec<_>>(),
            "61 boundaries back"
        );
        first.settle(&memory, &[]);
        assert!(Refills::due(&memory, std::slice::from_ref(&b), 1_000_999)
            .transfers
            .is_empty());
        let next = Refills::due(&memory, std::slice::from_ref(&b), 1_001_000);
        assert_eq!(boundaries(&next), vec![1_001]);
        let refill = next.transfers[0];
        assert_eq!(refill.amount(), 100);
        assert!(refill.flags().contains(tb::transfer::Flags::BALANCING_DEBIT));
        assert_eq!(refill.debit_account_id(), ids::taken_account_id(&b.key));
        assert_eq!(refill.credit_account_id(), ids::resource_account_id(&b.key));
    }

    #[test]
    fn a_refill_that_failed_is_sent_again_and_zero_refills_are_skipped() {
        let memory = RefillMemory::default();
        let b = bucket("k", 2, 60_000); // 2 units a window: most boundaries refill 0
        let refills = Refills::due(&memory, std::slice::from_ref(&b), 3_600_000);
        assert!(refills.transfers.iter().all(|t| t.amount() == 1));
        assert_eq!(
            boundaries(&refills),
            vec![3_540, 3_570, 3_600],
            "one unit every 30 slots"
        );
        let failed = [Failure {
            index: 0,
            error: tb::error::CreateTransferError::from(Kind::DebitAccountNotFound),
        }];
        refills.settle(&memory, &failed);
        assert_eq!(memory.last_posted(&b), None, "not remembered: sent again");
        let exists = [Failure {
            index: 0,
            error: tb::error::CreateTransferError::from(Kind::Exists),
        }];
        refills.settle(&memory, &exists);
        assert_eq!(memory.last_posted(&b), Some(3_600));
    }

    #[test]
    fn a_level_read_answers_for_ten_ms_and_only_at_the_same_boundary() {
        let reads = LevelReads::default();
        let key = LimitKey::new("k").unwrap();
        let read_at = Instant::now();
        assert_eq!(reads.fresh(&key, 7, read_at), None);
        reads.keep(&key, 7, 42, read_at);
        assert_eq!(reads.fresh(&key, 7, read_at + LEVEL_READ_AGE_MAX), Some(42));
        assert_eq!(reads.fresh(&key, 7, read_at + LEVEL_READ_AGE_MAX * 2), None, "too old");
        assert_eq!(reads.fresh(&key, 8, read_at), None, "a refill posted since");
    }

    #[test]
    fn a_take_is_the_reservation_posted_to_the_taken_account() {
        let key = LimitKey::new("k").unwrap();
        let lease = LeaseId::generate();
        let holds = [(&key, 7u64, 61u32), (&key, 3, 61)];
        let chain = super::super::chain::lease_chain(lease, 5, holds.into_iter());
        let take = as_take(chain[0], &key);
        assert_eq!(take.id(), chain[0].id());
        assert_eq!(take.timeout(), 0);
        assert_eq!(take.credit_account_id(), ids::taken_account_id(&key));
        assert!(take.flags().contains(tb::transfer::Flags::LINKED));
        assert!(!take.flags().contains(tb::transfer::Flags::PENDING));
        assert_eq!(stretched_ms(999), 1_000);
        assert_eq!(stretched_ms(0), 0);
    }
}
