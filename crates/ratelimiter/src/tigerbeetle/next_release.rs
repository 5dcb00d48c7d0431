//! The time until a key next gets a held unit back, read from the cluster
//! (docs/tigerbeetle-backend.md, "Next release"): what the operator's console
//! shows beside a full limit, with the memory backend's meaning (the first
//! hold's end, or a bucket's next refill; `None` when nothing is held).
//!
//! A rolling or concurrency hold is a pending transfer debiting the key's
//! resource account, which ends at its timestamp plus its timeout unless a
//! Complete voided it before. So the answer is read from what the cluster
//! holds, in bounded steps: the account (nothing pending: `None` at once), then
//! the account's debits since the longest hold could have started, oldest
//! first, a page at a time; the holds of a page that have not expired and
//! whose void the page does not show are checked by one lookup of their voids'
//! deterministic ids; the earliest end among those still held is the answer.

use std::collections::HashSet;
use tigerbeetle_unofficial as tb;

use crate::{LeaseId, LimitKey, LimitKind, LimitState, LimiterError};

use super::backend::{unavailable, TigerBeetleBackend};
use super::buckets;
use super::ids;

/// Transfers read per page of a key's debits: 32 KiB a page, so the console's
/// one question per visible row a second stays small on a busy key.
pub const NEXT_RELEASE_PAGE_TRANSFERS: u32 = 256;
/// Pages read at most per question: past 1,024 transfers in the key's longest
/// hold the answer is the earliest end among them (see the module's docs).
pub const NEXT_RELEASE_PAGES_MAX: usize = 4;
const NANOS_PER_SECOND: u64 = 1_000_000_000;
const NANOS_PER_MS: u64 = 1_000_000;

impl TigerBeetleBackend {
    /// Milliseconds until `key` next gets a held unit back, on the cluster's clock.
    pub(super) async fn next_release_from_cluster(&self, key: &LimitKey) -> Result<Option<u64>, LimiterError> {
        let Some(state) = self.state_of(key) else {
            return Ok(None);
        };
        if state.definition().kind() == LimitKind::Bucket {
            return Ok(self.next_refill_ms(&state).await);
        }
        let balance = self.resource_balance(key).await?;
        if balance.pending() == 0 {
            return Ok(None);
        }
        let Some(now_ns) = self.cluster_now_ns().await else {
            return Ok(None);
        };
        // Holds of the key's own timeout first; a pause's longer hold_ms only when none is held.
        let own_s = u64::from(super::reserve::timeout_seconds(&state, self.window_margin_ms));
        let pause_s = crate::wire::HOLD_MS_MAX.div_ceil(1_000).max(own_s);
        let mut pages_left = NEXT_RELEASE_PAGES_MAX;
        for longest_s in [own_s, pause_s] {
            let mut from_ns = now_ns.saturating_sub(longest_s * NANOS_PER_SECOND);
            while pages_left > 0 {
                pages_left -= 1;
                let page = self.debits_since(key, from_ns).await?;
                if let Some(end_ns) = self.first_held_end(key, &page, now_ns).await? {
                    return Ok(Some((end_ns - now_ns).div_ceil(NANOS_PER_MS)));
                }
                if page.len() < NEXT_RELEASE_PAGE_TRANSFERS as usize {
                    break;
                }
                from_ns = page.last().map_or(u64::MAX, |t| t.as_raw().timestamp + 1);
            }
        }
        Ok(None)
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

    /// One page of the debits of `key`'s resource account from `from_ns` on, oldest first.
    async fn debits_since(&self, key: &LimitKey, from_ns: u64) -> Result<Vec<tb::Transfer>, LimiterError> {
        let mut filter = tb::account::Filter::new(ids::resource_account_id(key), NEXT_RELEASE_PAGE_TRANSFERS)
            .with_flags(tb::account::FilterFlags::DEBITS);
        filter.as_raw_mut().timestamp_min = from_ns.max(1);
        let slot = self.admin_slot().await?;
        self.pool
            .run(slot, self.timeout, move |client| async move {
                client.get_account_transfers(Box::new(filter)).await
            })
            .await
            .map_err(|e| unavailable(&e, "read a key's holds"))
    }

    /// The earliest end after `now_ns` among the holds of `page` still held: not
    /// expired, not voided in the page, and with no void in the cluster.
    async fn first_held_end(
        &self,
        key: &LimitKey,
        page: &[tb::Transfer],
        now_ns: u64,
    ) -> Result<Option<u64>, LimiterError> {
        let voided: HashSet<u128> = (page.iter())
            .filter(|t| t.flags().contains(tb::transfer::Flags::VOID_PENDING_TRANSFER))
            .map(|t| t.pending_id())
            .collect();
        // (end, hold id, lease) of every hold that may still be held.
        let mut holds: Vec<(u64, u128, u128)> = (page.iter())
            .filter(|t| t.flags().contains(tb::transfer::Flags::PENDING) && !voided.contains(&t.id()))
            .map(|t| {
                let end_ns = t.as_raw().timestamp + u64::from(t.timeout()) * NANOS_PER_SECOND;
                (end_ns, t.id(), t.user_data_128())
            })
            .filter(|(end_ns, _, _)| *end_ns > now_ns)
            .collect();
        if holds.is_empty() {
            return Ok(None);
        }
        holds.sort_unstable();
        let voids: Vec<u128> = (holds.iter())
            .map(|(_, _, lease)| ids::void_transfer_id(LeaseId::from_u128(*lease), key))
            .collect();
        let slot = self.admin_slot().await?;
        let found = self
            .pool
            .run(slot, self.timeout, move |client| async move {
                client.lookup_transfers(voids).await
            })
            .await
            .map_err(|e| unavailable(&e, "look up a key's voids"))?;
        let voided: HashSet<u128> = found.iter().map(|t| t.pending_id()).collect();
        Ok(holds
            .into_iter()
            .find(|(_, id, _)| !voided.contains(id))
            .map(|(end_ns, _, _)| end_ns))
    }
}
