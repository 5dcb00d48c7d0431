//! The backend's side of the shared definitions ([`super::definition_log`]):
//! reading the log up to date (periodically, at startup, and at once when a
//! request names a key this server does not know yet), writing a record, and
//! the lookups of the reserve and admin paths.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tigerbeetle_unofficial as tb;

use crate::model::definition::LimitState;
use crate::model::error::LimiterError;
use crate::model::key::LimitKey;

use super::definition_log::{self, RecordKind, Versioned, LEDGER_DEFINITIONS, QUERY_TRANSFERS_MAX};
use super::shared::{unavailable, Shared};

/// What became of a claimed record.
#[derive(Debug, Clone, Copy)]
pub(super) enum Claimed {
    /// It is in the log (written now, or by an earlier attempt or another
    /// server writing the very same record).
    Written,
    /// Another record follows the same version: the writer's view was stale.
    Superseded,
    /// A transfer of its capacity change failed with this code; nothing was written.
    Refused(tb::error::CreateTransferErrorKind),
}

/// How often every server reads the log while definitions change: a
/// definition made on any server is served by every other within this.
pub const DEFINITIONS_REFRESH_INTERVAL_MS: u64 = 200;
/// The longest pause between two periodic reads while nothing changes. Each
/// periodic read that finds nothing new doubles the pause (200, 400, 800 ms);
/// a read that finds a record (periodic, for an unknown key, or after a
/// write) brings it back to [`DEFINITIONS_REFRESH_INTERVAL_MS`]. An idle
/// server thus sends 1.25 reads a second instead of 5, and a change made after
/// a quiet spell is still served by every server within 800 ms plus a round
/// trip (the fleet test asserts under 1 s).
pub const DEFINITIONS_REFRESH_IDLE_MAX_MS: u64 = 800;
/// The most query pages one refresh reads before yielding: a server joining a
/// cluster with a long history catches up over several refreshes rather than
/// holding a session for seconds.
pub const REFRESH_PAGES_MAX: usize = 4_096;

impl Shared {
    /// Reads the log up to date: every record committed before the call is
    /// applied when it returns. Reads run one at a time; a caller that waited
    /// while another read ran returns as soon as a read that started after its
    /// own arrival has finished, so a burst of unknown keys costs few reads.
    pub async fn refresh_definitions(&self) -> Result<(), LimiterError> {
        let arrived = self.refresh_started.load(Ordering::Acquire);
        let _gate = self.refresh_gate.lock().await;
        if self.refresh_done.load(Ordering::Acquire) > arrived {
            return Ok(());
        }
        let started = self.refresh_started.fetch_add(1, Ordering::AcqRel) + 1;
        let result = self.read_log().await;
        match &result {
            Ok(()) => {
                self.refresh_done.store(started, Ordering::Release);
                let now = self.clock.now_unix_ms();
                self.last_refresh_unix_ms.store(now, Ordering::Relaxed);
            }
            Err(_) => {
                self.refresh_failures.fetch_add(1, Ordering::Relaxed);
            }
        }
        result
    }

    async fn read_log(&self) -> Result<(), LimiterError> {
        for _ in 0..REFRESH_PAGES_MAX {
            let cursor = self.definitions.read().expect("definitions lock").cursor();
            let mut filter = tb::QueryFilter::new(QUERY_TRANSFERS_MAX).with_ledger(LEDGER_DEFINITIONS);
            filter.as_raw_mut().timestamp_min = cursor + 1;
            let slot = self.admin_slot().await?;
            let page = self
                .pool
                .run(slot, self.timeout, move |client| async move {
                    client.query_transfers(Box::new(filter)).await
                })
                .await
                .map_err(|e| unavailable(&e, "read definitions"))?;
            if !page.is_empty() {
                // Something was written: the periodic reads come fast again.
                self.log_moved.store(true, Ordering::Release);
            }
            let applied = self.definitions.write().expect("definitions lock").consume(&page);
            if applied > 0 {
                tracing::debug!(applied, "definition records applied");
            }
            if page.len() < QUERY_TRANSFERS_MAX as usize {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Starts the task that refreshes the definitions every
    /// [`DEFINITIONS_REFRESH_INTERVAL_MS`] while they change, backing off to
    /// [`DEFINITIONS_REFRESH_IDLE_MAX_MS`] while they do not; it ends when the
    /// backend is dropped.
    pub fn start_definitions_refresh(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let backend: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut pause_ms = DEFINITIONS_REFRESH_INTERVAL_MS;
            loop {
                tokio::time::sleep(Duration::from_millis(pause_ms)).await;
                let Some(backend) = backend.upgrade() else {
                    return;
                };
                if let Err(e) = backend.refresh_definitions().await {
                    tracing::warn!(error = %e, "reading the definitions failed; will retry");
                }
                backend.announce_if_due().await;
                let moved = backend.log_moved.swap(false, Ordering::AcqRel);
                pause_ms = next_refresh_pause_ms(pause_ms, moved);
            }
        })
    }

    /// Appends a claimed record of `state` following `previous_version`, with
    /// `moves` in the same chain ([`definition_log::encode_claimed`]), and
    /// reads the log back, so this server serves it as soon as the caller is
    /// answered. `exists` on the claim (a retry, or another server writing the
    /// same decrease) is success.
    pub(super) async fn write_claimed(
        &self,
        state: &LimitState,
        kind: RecordKind,
        previous_version: u64,
        moves: Vec<tb::Transfer>,
    ) -> Result<Claimed, LimiterError> {
        if !self.log_accounts_ready.load(Ordering::Acquire) {
            // A claim refused for a missing account would burn its id for
            // ever (a cluster written by an older version has no claim
            // accounts): they are created first, once per process.
            let mut accounts = definition_log::log_accounts();
            accounts.extend(super::server_log::server_accounts());
            self.create_accounts_checked(accounts, "definition log").await?;
            self.log_accounts_ready.store(true, Ordering::Release);
        }
        let mut chain = definition_log::encode_claimed(state, kind, previous_version, moves);
        if let Some(identity) = self.identity.get() {
            // The writer's name, linked just before the record, on a ledger readers of the log never read.
            let header = (chain.iter())
                .position(|t| t.ledger() == LEDGER_DEFINITIONS)
                .expect("a chain holds its record");
            let author = super::server_log::author(chain[header].id(), identity.0.id());
            chain.insert(header, author);
        }
        let slot = self.admin_slot().await?;
        let failures = self
            .pool
            .run(slot, self.timeout, move |client| {
                super::submitter::create_transfers(client, chain)
            })
            .await
            .map_err(|e| unavailable(&e, "write definition"))?;
        use tb::error::CreateTransferErrorKind as Kind;
        let claim = failures.iter().find(|f| f.index == 0).map(|f| f.kind());
        let claimed = match claim {
            None | Some(Kind::Exists) => Claimed::Written,
            Some(Kind::ExistsWithDifferentUserData128) => Claimed::Superseded,
            Some(_) => match (failures.iter()).find(|f| !matches!(f.kind(), Kind::LinkedEventFailed)) {
                // A capacity change of the chain failed (they follow the claim).
                Some(f) if f.index > 0 && !matches!(f.kind(), Kind::Exists) => Claimed::Refused(f.kind()),
                other => {
                    let code = other.map(|f| f.kind());
                    tracing::error!(key = %state.definition().key(), ?code, "writing a definition record failed");
                    return Err(LimiterError::Backend(format!("definition record: {code:?}")));
                }
            },
        };
        if matches!(claimed, Claimed::Written) {
            self.refresh_definitions().await?;
        }
        Ok(claimed)
    }

    /// The state of `key` and its version, if this server knows it.
    pub(super) fn versioned(&self, key: &LimitKey) -> Option<Versioned> {
        self.definitions.read().expect("definitions lock").get(key).cloned()
    }

    /// The state of `key`, if defined.
    pub(super) fn state_of(&self, key: &LimitKey) -> Option<LimitState> {
        self.versioned(key).map(|v| v.state)
    }

    /// The state of `key`, reading the log first when this server does not
    /// know the key yet: another server may have just defined it.
    pub(super) async fn state_of_fresh(&self, key: &LimitKey) -> Result<Option<LimitState>, LimiterError> {
        if let Some(state) = self.state_of(key) {
            return Ok(Some(state));
        }
        self.refresh_definitions().await?;
        Ok(self.state_of(key))
    }

    /// True when some key is decreasing as far as this server knows.
    pub(super) fn any_decreasing(&self) -> bool {
        (self.definitions.read().expect("definitions lock").states())
            .any(|v| v.state.status() == crate::model::definition::LimitStatus::Decreasing)
    }

    /// Every state, ordered by key.
    pub(super) fn all_states(&self) -> Vec<Versioned> {
        let mut states: Vec<Versioned> = self
            .definitions
            .read()
            .expect("definitions lock")
            .states()
            .cloned()
            .collect();
        states.sort_by(|a, b| a.state.definition().key().cmp(b.state.definition().key()));
        states
    }

    /// The key whose resource account is `account`, reading the log once if
    /// it is not known yet.
    pub(super) async fn key_of_account(&self, account: u128) -> Result<Option<LimitKey>, LimiterError> {
        let known = |b: &Self| {
            b.definitions
                .read()
                .expect("definitions lock")
                .key_of_account(account)
                .cloned()
        };
        if let Some(key) = known(self) {
            return Ok(Some(key));
        }
        self.refresh_definitions().await?;
        Ok(known(self))
    }
}

/// The pause before the next periodic read of the log: the shortest after a
/// read that found records, otherwise twice the last one, up to the idle bound.
pub fn next_refresh_pause_ms(last_ms: u64, log_moved: bool) -> u64 {
    if log_moved {
        DEFINITIONS_REFRESH_INTERVAL_MS
    } else {
        last_ms.saturating_mul(2).min(DEFINITIONS_REFRESH_IDLE_MAX_MS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_back_off_while_the_log_is_quiet_and_come_fast_when_it_moves() {
        let mut pause = DEFINITIONS_REFRESH_INTERVAL_MS;
        let mut pauses = Vec::new();
        for _ in 0..4 {
            pause = next_refresh_pause_ms(pause, false);
            pauses.push(pause);
        }
        assert_eq!(pauses, [400, 800, 800, 800]);
        assert_eq!(next_refresh_pause_ms(pause, true), DEFINITIONS_REFRESH_INTERVAL_MS);
    }
}
