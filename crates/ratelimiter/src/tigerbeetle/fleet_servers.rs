//! This server's announce and the read of the fleet's servers
//! (docs/tigerbeetle-backend.md, "Servers of the fleet"), on the ledger and
//! records of [`super::server_log`].

use std::time::{Duration, Instant};

use crate::limiting::limiter::FleetServer;
use crate::model::error::LimiterError;

use tigerbeetle_unofficial as tb;

use super::definition_log::QUERY_TRANSFERS_MAX;
use super::server_log::{
    announce, server_accounts, ServerIdentity, ANNOUNCE_ATTEMPTS_MAX, ANNOUNCE_BYTES_MAX, ANNOUNCE_PAUSE_MAX_MS,
    LEDGER_SERVERS, SERVER_PAGES_MAX,
};
use super::shared::{unavailable, Shared};

impl Shared {
    /// Names this server in the cluster: its definition records carry
    /// `identity` from now on, and the periodic read of the definitions writes
    /// its announce (retrying while the cluster does not answer). An identity
    /// given twice keeps the first.
    pub fn set_identity(&self, identity: ServerIdentity) -> Result<(), LimiterError> {
        let payload = serde_json::to_vec(&identity).expect("an identity serializes");
        if payload.len() > ANNOUNCE_BYTES_MAX {
            return Err(LimiterError::Backend(format!(
                "the server's name and address take {} bytes, more than {ANNOUNCE_BYTES_MAX}",
                payload.len()
            )));
        }
        let _ = self.identity.set((identity, self.clock.now_unix_ms()));
        Ok(())
    }

    /// Writes the announce when this server has an identity, has not written
    /// it yet and its next attempt is due; called by the periodic read of the
    /// definitions (and by a test or an embedder that runs none).
    pub async fn announce_if_due(&self) {
        let Some((identity, started_unix_ms)) = self.identity.get() else {
            return;
        };
        {
            let progress = self.announce.lock().expect("announce lock");
            let due =
                !progress.written && progress.attempts < ANNOUNCE_ATTEMPTS_MAX && Instant::now() >= progress.next_at;
            if !due {
                return;
            }
        }
        let result = self.write_announce(identity, *started_unix_ms).await;
        let mut progress = self.announce.lock().expect("announce lock");
        progress.attempts += 1;
        match result {
            Ok(()) => progress.written = true,
            Err(e) => {
                tracing::warn!(error = %e, attempt = progress.attempts, "announcing this server to the cluster failed; will retry");
                progress.next_at = Instant::now() + Duration::from_millis(progress.pause_ms);
                progress.pause_ms = (progress.pause_ms * 2).min(ANNOUNCE_PAUSE_MAX_MS);
            }
        }
    }

    async fn write_announce(&self, identity: &ServerIdentity, started_unix_ms: u64) -> Result<(), LimiterError> {
        self.create_accounts_checked(server_accounts(), "server log").await?;
        let chain = announce(identity, started_unix_ms);
        let slot = self.admin_slot().await?;
        let failures = self
            .pool
            .run(slot, self.timeout, move |client| {
                super::submitter::create_transfers(client, chain)
            })
            .await
            .map_err(|e| unavailable(&e, "announce"))?;
        use tb::error::CreateTransferErrorKind as Kind;
        match failures.first().map(|f| f.kind()) {
            None | Some(Kind::Exists) => Ok(()),
            Some(kind) => Err(LimiterError::Backend(format!("announce: {kind:?}"))),
        }
    }

    /// The fleet's servers, reading what the cluster recorded since the last read.
    pub async fn read_servers(&self) -> Result<Vec<FleetServer>, LimiterError> {
        let mut view = self.servers.lock().await;
        for _ in 0..SERVER_PAGES_MAX {
            let mut filter = tb::QueryFilter::new(QUERY_TRANSFERS_MAX).with_ledger(LEDGER_SERVERS);
            filter.as_raw_mut().timestamp_min = view.cursor() + 1;
            let slot = self.admin_slot().await?;
            let page = self
                .pool
                .run(slot, self.timeout, move |client| async move {
                    client.query_transfers(Box::new(filter)).await
                })
                .await
                .map_err(|e| unavailable(&e, "read the servers"))?;
            view.consume(&page);
            if page.len() < QUERY_TRANSFERS_MAX as usize {
                break;
            }
        }
        Ok(view.servers())
    }
}
