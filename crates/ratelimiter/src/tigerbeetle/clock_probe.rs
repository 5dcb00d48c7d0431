//! The backend's reading of the cluster's clock (docs/tigerbeetle-backend.md,
//! "Clocks"): a fresh reading of [`super::cluster_clock::ClusterClock`], else a
//! probe written and looked up for its stamp.

use std::time::Instant;

use crate::model::error::LimiterError;

use super::ids;
use super::shared::{unavailable, Shared};

impl Shared {
    /// The cluster's time now, at least, in ns: from a fresh reading, else
    /// from a probe, waiting at most one request timeout for it; `None` when
    /// the probe failed or took longer (the caller then takes nothing as
    /// elapsed: idle, never over-admitting).
    pub(super) async fn cluster_now_ns(&self) -> Option<u64> {
        if let Some(bound) = self.cluster_clock.fresh_bound_ns(Instant::now()) {
            return Some(bound);
        }
        let probed = tokio::time::timeout(self.timeout, async {
            let _probing = self.cluster_clock.probe_gate().await;
            // Another Complete may have probed while this one waited.
            if self.cluster_clock.fresh_bound_ns(Instant::now()).is_some() {
                return Ok(());
            }
            self.probe_cluster_clock().await
        })
        .await;
        match probed {
            Ok(Ok(())) => self.cluster_clock.fresh_bound_ns(Instant::now()),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cluster clock probe failed: the window is taken as just begun");
                None
            }
            Err(_) => {
                tracing::warn!("cluster clock probe timed out: the window is taken as just begun");
                None
            }
        }
    }

    /// Writes a probe and reads its time stamp back: the cluster had reached
    /// it by the time the write was answered.
    async fn probe_cluster_clock(&self) -> Result<(), LimiterError> {
        self.cluster_clock.count_probe();
        let id = ids::clock_probe_id();
        let failures =
            (self.submitter.submit(vec![ids::clock_probe(id)]).await).map_err(|e| unavailable(&e, "clock probe"))?;
        let written = Instant::now();
        if let Some(failure) = failures.first() {
            return Err(LimiterError::Backend(format!(
                "clock probe not written: {:?}",
                failure.kind()
            )));
        }
        let found = (self.lookups.lookup(vec![id], self.timeout).await).map_err(|e| unavailable(&e, "clock probe"))?;
        let probe = found
            .first()
            .ok_or_else(|| LimiterError::Backend("the clock probe was not found".to_owned()))?;
        self.cluster_clock.observe(probe.as_raw().timestamp, written);
        Ok(())
    }
}
