//! The time until a key next gets a held unit back, read from the cluster
//! (docs/tigerbeetle-backend.md, "Next release"): what the operator's console
//! shows beside a full limit, with the memory backend's meaning (the first
//! hold's end, or a bucket's next refill; `None` when nothing is held).
//!
//! A rolling or concurrency hold is a pending transfer debiting the key's
//! resource account, which ends at its timestamp plus its timeout unless a
//! Complete voided it before; the account's `debits_pending` is the sum of the
//! holds not yet voided or collected. So the answer is read from what the
//! cluster holds, in bounded steps: the account (nothing pending: `None` at
//! once), then the account's debits newest first, a page at a time. A void is
//! always later than its hold, so newest first meets every void before the
//! hold it voids; the holds not voided are added up until they make the
//! account's pending sum, and then every hold still held has been met: the
//! earliest end among them (after now) is the answer. No other read is needed.
//! (A hold taken between the account's read and the page's can end the read
//! before an older hold is met: the answer is then late for that second.)

use std::collections::HashSet;
use tigerbeetle_unofficial as tb;

use crate::model::definition::{LimitKind, LimitState};
use crate::model::error::LimiterError;
use crate::model::key::LimitKey;

use super::buckets;
use super::ids;
use super::shared::{unavailable, Shared};

/// Transfers read per page of a key's debits: 32 KiB a page, so the console's
/// one question per visible row a second stays small on a busy key.
pub const NEXT_RELEASE_PAGE_TRANSFERS: u32 = 256;
/// Pages read at most per question: a key whose oldest hold still held is
/// more than 1,024 of its debits back is answered with a bound, the earliest
/// end among the newest 1,024's holds or the oldest debit read plus the key's
/// timeout, whichever comes first (late, never early, but for pauses).
pub const NEXT_RELEASE_PAGES_MAX: usize = 4;
const NANOS_PER_SECOND: u64 = 1_000_000_000;
const NANOS_PER_MS: u64 = 1_000_000;

impl Shared {
    /// Milliseconds until `key` next gets a held unit back, on the cluster's clock.
    pub(super) async fn next_release_from_cluster(&self, key: &LimitKey) -> Result<Option<u64>, LimiterError> {
        let Some(state) = self.state_of(key) else {
            return Ok(None);
        };
        if state.definition().kind() == LimitKind::Bucket {
            return Ok(self.next_refill_ms(&state).await);
        }
        let pending = self.resource_balance(key).await?.pending();
        if pending == 0 {
            return Ok(None);
        }
        let Some(now_ns) = self.cluster_now_ns().await else {
            return Ok(None);
        };
        let longest_s = crate::model::wire::HOLD_MS_MAX.div_ceil(1_000);
        let from_ns = now_ns.saturating_sub(longest_s * NANOS_PER_SECOND);
        let mut scan = HoldScan::default();
        // The newest first, up to whatever the cluster holds: the clock's bound
        // lags the cluster, and a void stamped after it must not be missed.
        let mut before_ns = u64::MAX;
        let mut complete = false;
        for _ in 0..NEXT_RELEASE_PAGES_MAX {
            let page = self.debits_newest_first(key, from_ns, before_ns).await?;
            scan.read(&page, now_ns);
            complete = scan.held_units >= pending || page.len() < NEXT_RELEASE_PAGE_TRANSFERS as usize;
            if complete {
                break;
            }
            before_ns = page.last().map_or(0, |t| t.as_raw().timestamp.saturating_sub(1));
        }
        if !complete {
            // Holds not met started before the oldest debit read, so (but for a
            // pause's longer hold_ms) one of them ends by then plus the key's timeout.
            let own_ns = u64::from(super::chain::timeout_seconds(&state, self.window_margin_ms)) * NANOS_PER_SECOND;
            let bound_ns = scan.oldest_ns.saturating_add(own_ns);
            if bound_ns > now_ns {
                scan.first_end_ns = Some(scan.first_end_ns.map_or(bound_ns, |first| first.min(bound_ns)));
            }
        }
        Ok(scan.first_end_ns.map(|end_ns| (end_ns - now_ns).div_ceil(NANOS_PER_MS)))
    }

    /// A bucket's next refill when it lacks units: the wait for one unit more
    /// than its level (the refills due are posted first).
    async fn next_refill_ms(&self, state: &LimitState) -> Option<u64> {
        let bucket = buckets::bucket_of(state, self.window_margin_ms)?;
        self.post_due_refills(std::iter::once(state)).await;
        let level = self.resource_balance(&bucket.key).await.ok()?.available();
        let level = u64::try_from(level).unwrap_or(u64::MAX);
        if level >= bucket.shape.burst() {
            return None;
        }
        self.bucket_hint(&bucket, level + 1).await
    }

    /// One page of the debits of `key`'s resource account from `from_ns` up to
    /// `before_ns`, newest first.
    async fn debits_newest_first(
        &self,
        key: &LimitKey,
        from_ns: u64,
        before_ns: u64,
    ) -> Result<Vec<tb::Transfer>, LimiterError> {
        let flags = tb::account::FilterFlags::DEBITS | tb::account::FilterFlags::REVERSED;
        let mut filter =
            tb::account::Filter::new(ids::resource_account_id(key), NEXT_RELEASE_PAGE_TRANSFERS).with_flags(flags);
        filter.as_raw_mut().timestamp_min = from_ns.max(1);
        if before_ns != u64::MAX {
            filter.as_raw_mut().timestamp_max = before_ns.max(1);
        }
        let slot = self.admin_slot().await?;
        self.pool
            .run(slot, self.timeout, move |client| async move {
                client.get_account_transfers(Box::new(filter)).await
            })
            .await
            .map_err(|e| unavailable(&e, "read a key's holds"))
    }
}

/// What a newest-first read of a key's debits found so far.
#[derive(Debug, Default)]
struct HoldScan {
    /// Holds voided by a void met already (later than them).
    voided: HashSet<u128>,
    /// Units of the holds met and not voided (expired ones included: the
    /// account counts them until the cluster collects them).
    held_units: u128,
    /// The earliest end after now among them.
    first_end_ns: Option<u64>,
    /// The timestamp of the oldest debit read.
    oldest_ns: u64,
}

impl HoldScan {
    fn read(&mut self, page: &[tb::Transfer], now_ns: u64) {
        if let Some(oldest) = page.last() {
            self.oldest_ns = oldest.as_raw().timestamp;
        }
        for t in page {
            if t.flags().contains(tb::transfer::Flags::VOID_PENDING_TRANSFER) {
                self.voided.insert(t.pending_id());
            } else if t.flags().contains(tb::transfer::Flags::PENDING) && !self.voided.contains(&t.id()) {
                self.held_units += t.amount();
                let end_ns = t.as_raw().timestamp + u64::from(t.timeout()) * NANOS_PER_SECOND;
                if end_ns > now_ns {
                    self.first_end_ns = Some(self.first_end_ns.map_or(end_ns, |first| first.min(end_ns)));
                }
            }
        }
    }
}
