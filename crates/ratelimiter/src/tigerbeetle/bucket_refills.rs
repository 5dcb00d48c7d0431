//! The backend's bucket paths (docs/tigerbeetle-backend.md, "Buckets"): the
//! refills due posted once the cluster's clock has passed their boundary, and
//! the levels read for a denial's retry hint, on the accounts and transfers of
//! [`super::buckets`].

use std::time::Instant;

use crate::model::definition::LimitState;

use super::buckets::{bucket_of, stretched_ms, Bucket, Refills, NANOS_PER_MS};
use super::shared::Shared;
use super::submitter::Failure;

impl Shared {
    /// The cluster's time now, at least, in ms; `None` when unknown (a
    /// failed probe): then no refill is posted, which is late, never early.
    async fn cluster_now_ms(&self) -> Option<u64> {
        self.cluster_now_ns().await.map(|ns| ns / NANOS_PER_MS)
    }

    /// The refills of `buckets` due now on the cluster's clock and not known
    /// posted; none when the cluster's time is unknown.
    pub(super) async fn due_refills(&self, buckets: &[Bucket]) -> Refills {
        match self.cluster_now_ms().await {
            Some(now_ms) => Refills::due(&self.refills, buckets, now_ms),
            None => Refills::default(),
        }
    }

    /// Posts `refills` on their own, in as many work items as they need, and
    /// remembers what was posted. Best effort: a refill not posted now is
    /// posted by the next request on its key (late, never early).
    pub(super) async fn post_refills(&self, refills: &Refills) {
        let mut failures = Vec::new();
        let mut start = 0;
        for chunk in refills.transfers.chunks(self.submitter.batch_events_max()) {
            match self.submitter.submit(chunk.to_vec()).await {
                Ok(chunk_failures) => failures.extend(chunk_failures.into_iter().map(|f| Failure {
                    index: f.index + start,
                    ..f
                })),
                Err(e) => {
                    tracing::warn!(error = %e, "bucket refills not posted");
                    return;
                }
            }
            start += chunk.len();
        }
        refills.settle(&self.refills, &failures);
    }

    /// Posts the refills due on every bucket among `states` (before a report
    /// or a decrease reads their balances).
    pub(super) async fn post_due_refills<'a>(&self, states: impl Iterator<Item = &'a LimitState>) {
        let buckets: Vec<Bucket> = states.filter_map(|s| bucket_of(s, self.window_margin_ms)).collect();
        if buckets.is_empty() {
            return;
        }
        let refills = self.due_refills(&buckets).await;
        if !refills.transfers.is_empty() {
            self.post_refills(&refills).await;
        }
    }

    /// The retry hint of a reservation of `units` refused by `bucket`: the
    /// time until the first boundary whose refill makes them fit
    /// ([`BucketShape::wait_ms`]), from the level read now (or at most
    /// [`LEVEL_READ_AGE_MAX`] ago) and the last boundary this process knows
    /// posted, on the cluster's clock, stretched by the drift. `None` (the
    /// caller then gives the rolling backoff's hint) when the level, the
    /// boundary or the cluster's time is unknown. A refill another server
    /// posted beyond that boundary makes the hint up to a slot early: a retry
    /// too soon, never a grant too many.
    pub(super) async fn bucket_hint(&self, bucket: &Bucket, units: u64) -> Option<u64> {
        let after = self.refills.last_posted(bucket)?;
        let level = match self.levels.fresh(&bucket.key, after, Instant::now()) {
            Some(level) => level,
            None => {
                let read_at = Instant::now();
                let balance = self.resource_balance(&bucket.key).await.ok()?;
                let level = u64::try_from(balance.available()).unwrap_or(u64::MAX);
                self.levels.keep(&bucket.key, after, level, read_at);
                level
            }
        };
        let now_ms = self.cluster_clock.fresh_bound_ns(Instant::now())? / NANOS_PER_MS;
        let wait_ms = bucket.shape.wait_ms(level, after, units, now_ms)?;
        // A denial's hint is never 0, which would read as "never".
        Some(stretched_ms(wait_ms).max(1))
    }
}
