//! The gateway's tenants and keys in the cluster (docs/gateway.md, "Tenants and
//! keys"): every change of the directory is one linked chain of amount-0
//! transfers on a ledger of its own, carrying the change's JSON in their user
//! data with the definition log's encoder ([`carry_payload`]); every server
//! reads the ledger in timestamp order, so the cluster, replicated and
//! linearizable, orders a fleet's changes and no server keeps them elsewhere.
//!
//! A server of an older version reads the definition log's and the server
//! log's ledgers only, by ledger: it never meets these transfers, and this
//! reader skips any code or format it does not know. Like a definition, a
//! change claims the version of its subject it follows ([`successor_claim`],
//! on a claims ledger no reader reads), so two servers changing one tenant or
//! key at once cannot both succeed on a stale view.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use sha2::{Digest, Sha256};
use tigerbeetle_unofficial as tb;

use crate::base::id::id128;
use crate::directory::{Appended, Change, DirectoryError, DirectoryStore, Recorded};
use crate::model::error::LimiterError;

use super::backend::TigerBeetleBackend;
use super::chain_reassembler::{chain_payload, ChainReassembler};
use super::definition_log::{carry_payload, link, QUERY_TRANSFERS_MAX};
use super::shared::{Shared, UNAVAILABLE_RETRY_MS};

/// The ledger of the directory's changes, apart from every other log.
pub const LEDGER_DIRECTORY: u32 = 6;
/// The ledger of the changes' successor claims, read by nobody.
pub const LEDGER_DIRECTORY_CLAIMS: u32 = 7;
/// The code of every transfer of a change.
pub const CODE_DIRECTORY_CHANGE: u16 = 20;
/// The code of a change's successor claim.
pub const CODE_DIRECTORY_CLAIM: u16 = 21;
/// The account code of the change log's two accounts.
pub const ACCOUNT_CODE_DIRECTORY: u16 = 8;
/// The account code of the claims' two accounts.
pub const ACCOUNT_CODE_DIRECTORY_CLAIMS: u16 = 9;
/// The change format written in every header; a reader skips other formats.
pub const CHANGE_FORMAT: u32 = 1;
/// The largest change JSON: a key scoped to the most models, each of the
/// longest name, is under 10 KiB; a tenant is smaller.
pub const CHANGE_BYTES_MAX: usize = 32 * 1024;
/// Pages one read consumes at most: a server joining a cluster with a long
/// history catches up over several reads (each page 240 transfers).
pub const READ_PAGES_MAX: usize = 4_096;

fn accounts_ids() -> [u128; 4] {
    [
        id128("acct:directory:debit"),
        id128("acct:directory:credit"),
        id128("acct:directory:claims:debit"),
        id128("acct:directory:claims:credit"),
    ]
}

/// The four accounts of the log and its claims: unconstrained, since nothing
/// moves an amount. They exist before any claim is sent (a claim refused for
/// a missing account would burn its id for ever).
pub fn directory_accounts() -> Vec<tb::Account> {
    let [debit, credit, claims_debit, claims_credit] = accounts_ids();
    vec![
        tb::Account::new(debit, LEDGER_DIRECTORY, ACCOUNT_CODE_DIRECTORY),
        tb::Account::new(credit, LEDGER_DIRECTORY, ACCOUNT_CODE_DIRECTORY),
        tb::Account::new(claims_debit, LEDGER_DIRECTORY_CLAIMS, ACCOUNT_CODE_DIRECTORY_CLAIMS),
        tb::Account::new(claims_credit, LEDGER_DIRECTORY_CLAIMS, ACCOUNT_CODE_DIRECTORY_CLAIMS),
    ]
}

fn change_transfer(id: u128) -> tb::Transfer {
    let [debit, credit, ..] = accounts_ids();
    tb::Transfer::new(id)
        .with_debit_account_id(debit)
        .with_credit_account_id(credit)
        .with_amount(0)
        .with_ledger(LEDGER_DIRECTORY)
        .with_code(CODE_DIRECTORY_CHANGE)
}

/// The claim that a change follows `subject` at `previous_version`: its id
/// depends on those alone, so at most one change follows a version, and a
/// writer finding it taken by another change (`exists_with_different_user_data_128`)
/// knows its view is stale; `user_data_128` is the change's header id, so a
/// retry of the very same change finds `exists`.
pub fn successor_claim(subject: &str, previous_version: u64, header_id: u128) -> tb::Transfer {
    let [.., claims_debit, claims_credit] = accounts_ids();
    tb::Transfer::new(id128(&format!("xfer:directory:next:{subject}:{previous_version}")))
        .with_debit_account_id(claims_debit)
        .with_credit_account_id(claims_credit)
        .with_amount(0)
        .with_ledger(LEDGER_DIRECTORY_CLAIMS)
        .with_code(CODE_DIRECTORY_CLAIM)
        .with_user_data_128(header_id)
        .with_flags(tb::transfer::Flags::LINKED)
}

/// The chain of `change` following `previous_version`: its claim, then a
/// header (`user_data_128` = the subject's id, `user_data_64` = the previous
/// version, `user_data_32` = format and length) and the JSON, 28 bytes a
/// transfer, all linked. Ids derive from the subject, the version and the
/// payload: a retry sends the very same chain.
pub fn encode(change: &Change, previous_version: u64) -> Vec<tb::Transfer> {
    let payload = serde_json::to_vec(change).expect("a change serializes");
    assert!(payload.len() <= CHANGE_BYTES_MAX, "a validated change fits a record");
    let subject = change.subject();
    let digest: String = Sha256::digest(&payload)[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let id = |index: usize| id128(&format!("xfer:directory:{subject}:{previous_version}:{digest}:{index}"));
    let header = (CHANGE_FORMAT << 28) | payload.len() as u32;
    let mut record = vec![change_transfer(id(0))
        .with_user_data_128(id128(&format!("directory:{subject}")))
        .with_user_data_64(previous_version)
        .with_user_data_32(header)];
    record.extend(carry_payload(&payload, |i| change_transfer(id(i + 1))));
    link(&mut record);
    let mut chain = vec![successor_claim(&subject, previous_version, record[0].id())];
    chain.extend(record);
    chain
}

/// Decodes one whole chain of the log's ledger, header first.
pub fn decode(chain: &[tb::Transfer]) -> Result<Recorded, String> {
    let payload = chain_payload(chain, CHANGE_FORMAT, CHANGE_BYTES_MAX, "change")?;
    let header = &chain[0];
    let change = serde_json::from_slice(&payload).map_err(|e| format!("change: {e}"))?;
    Ok(Recorded {
        version: header.as_raw().timestamp,
        change,
    })
}

/// Where the reader stands in the log.
#[derive(Debug)]
struct Cursor {
    chains: ChainReassembler,
}

impl Default for Cursor {
    fn default() -> Self {
        Self {
            chains: ChainReassembler::new(CODE_DIRECTORY_CHANGE, CHANGE_BYTES_MAX),
        }
    }
}

impl Cursor {
    /// The timestamp of the last transfer consumed.
    fn timestamp(&self) -> u64 {
        self.chains.timestamp()
    }

    /// Consumes transfers read after the cursor; returns the whole changes.
    fn consume(&mut self, transfers: &[tb::Transfer], malformed: &AtomicU64) -> Vec<Recorded> {
        let mut out = Vec::new();
        for chain in self.chains.consume(transfers, malformed) {
            match decode(&chain) {
                Ok(recorded) => out.push(recorded),
                Err(e) => {
                    tracing::error!(error = %e, "a directory change does not decode; skipped");
                    malformed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        out
    }
}

/// The directory's store in the cluster of a [`TigerBeetleBackend`].
#[derive(Debug)]
pub struct TigerBeetleDirectoryStore {
    /// What the backend holds: its sessions and timeout.
    backend: Arc<Shared>,
    cursor: tokio::sync::Mutex<Cursor>,
    accounts_ready: AtomicBool,
    malformed: AtomicU64,
}

impl TigerBeetleDirectoryStore {
    /// The store of `backend`'s cluster; nothing is read before the first read.
    pub fn new(backend: Arc<TigerBeetleBackend>) -> Self {
        Self {
            backend: Arc::clone(&backend.shared),
            cursor: tokio::sync::Mutex::new(Cursor::default()),
            accounts_ready: AtomicBool::new(false),
            malformed: AtomicU64::new(0),
        }
    }

    /// Chains of the log that did not decode, skipped.
    pub fn malformed_total(&self) -> u64 {
        self.malformed.load(Ordering::Relaxed)
    }
}

fn unavailable(e: LimiterError) -> DirectoryError {
    match e {
        LimiterError::Unavailable { retry_after_ms } => DirectoryError::Unavailable { retry_after_ms },
        other => {
            tracing::error!(error = %other, "the directory's store failed");
            DirectoryError::Unavailable {
                retry_after_ms: UNAVAILABLE_RETRY_MS,
            }
        }
    }
}

#[async_trait]
impl DirectoryStore for TigerBeetleDirectoryStore {
    async fn read_new(&self) -> Result<Vec<Recorded>, DirectoryError> {
        let mut cursor = self.cursor.lock().await;
        let mut out = Vec::new();
        for _ in 0..READ_PAGES_MAX {
            let mut filter = tb::QueryFilter::new(QUERY_TRANSFERS_MAX).with_ledger(LEDGER_DIRECTORY);
            filter.as_raw_mut().timestamp_min = cursor.timestamp() + 1;
            let backend = &self.backend;
            let slot = backend.admin_slot().await.map_err(unavailable)?;
            let page = (backend.pool)
                .run(slot, backend.timeout, move |client| async move {
                    client.query_transfers(Box::new(filter)).await
                })
                .await
                .map_err(|e| unavailable(super::shared::unavailable(&e, "read the directory")))?;
            out.extend(cursor.consume(&page, &self.malformed));
            if page.len() < QUERY_TRANSFERS_MAX as usize {
                break;
            }
        }
        Ok(out)
    }

    async fn append(&self, change: &Change, previous_version: u64) -> Result<Appended, DirectoryError> {
        let backend = &self.backend;
        if !self.accounts_ready.load(Ordering::Acquire) {
            (backend.create_accounts_checked(directory_accounts(), "directory").await).map_err(unavailable)?;
            self.accounts_ready.store(true, Ordering::Release);
        }
        let chain = encode(change, previous_version);
        let slot = backend.admin_slot().await.map_err(unavailable)?;
        let failures = (backend.pool)
            .run(slot, backend.timeout, move |client| {
                super::submitter::create_transfers(client, chain)
            })
            .await
            .map_err(|e| unavailable(super::shared::unavailable(&e, "write the directory")))?;
        use tb::error::CreateTransferErrorKind as Kind;
        match failures.iter().find(|f| f.index == 0).map(|f| f.kind()) {
            None | Some(Kind::Exists) => Ok(Appended::Written),
            Some(Kind::ExistsWithDifferentUserData128) => Ok(Appended::Superseded),
            Some(code) => {
                tracing::error!(?code, change = change.kind(), "writing a directory change failed");
                Err(DirectoryError::NotPersisted {
                    reason: "the cluster refused the change".to_owned(),
                    detail: format!("directory change: {code:?}"),
                })
            }
        }
    }

    fn shared(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::super::chain_reassembler::stamped;
    use super::*;
    use crate::directory::{KeyHash, KeyLimits, KeyRecord};

    fn key(id: &str, models: usize) -> Change {
        Change::CreateKey {
            key: KeyRecord {
                id: id.to_owned(),
                tenant: "acme".into(),
                tenant_id: "T".into(),
                name: "ci".into(),
                models: Some((0..models).map(|i| format!("model-{i:0>120}")).collect()),
                limits: KeyLimits {
                    rpm: Some(3),
                    ..Default::default()
                },
                limits_of: id.to_owned(),
                hash: KeyHash::of("rlk-x"),
                hint: "abcd".into(),
                created_at_unix_ms: 1,
                expires_at_unix_ms: None,
                revoked_at_unix_ms: None,
                rotated_to: None,
            },
        }
    }

    #[test]
    fn changes_round_trip_through_a_claimed_chain_split_over_reads() {
        let change = key("K1", crate::directory::name::SCOPE_MODELS_MAX);
        let chain = encode(&change, 7);
        assert!(
            serde_json::to_vec(&change).unwrap().len() < CHANGE_BYTES_MAX,
            "the largest change fits"
        );
        assert_eq!(
            (chain[0].ledger(), chain[0].user_data_128()),
            (LEDGER_DIRECTORY_CLAIMS, chain[1].id())
        );
        assert!(chain[..chain.len() - 1]
            .iter()
            .all(|t| t.flags().contains(tb::transfer::Flags::LINKED)));
        assert!(!chain.last().unwrap().flags().contains(tb::transfer::Flags::LINKED));
        // Readers query the log's ledger: they never see the claim.
        let log = stamped(chain[1..].to_vec(), 100);
        let malformed = AtomicU64::new(0);
        let mut cursor = Cursor::default();
        let (a, b) = log.split_at(5);
        assert!(cursor.consume(a, &malformed).is_empty(), "half a chain is no change");
        let read = cursor.consume(b, &malformed);
        assert_eq!(
            read,
            vec![Recorded {
                version: 100,
                change: change.clone()
            }]
        );
        // The same change after the same version: the same ids (a retry is `exists`).
        assert_eq!(encode(&change, 7)[1].id(), chain[1].id());
        // Another change after the same version claims the same id with other data.
        let other = encode(&key("K1", 0), 7);
        assert_eq!(other[0].id(), chain[0].id());
        assert_ne!(other[0].user_data_128(), chain[0].user_data_128());
        // A stranger's code and a newer format are skipped.
        let mut newer = stamped(encode(&key("K2", 0), 0)[1..].to_vec(), 1_000);
        newer[0].set_user_data_32(2 << 28);
        let mut stranger = change_transfer(9).with_code(99);
        stranger.as_raw_mut().timestamp = 2_000;
        assert!(cursor.consume(&newer, &malformed).is_empty());
        assert!(cursor.consume(&[stranger], &malformed).is_empty());
        assert_eq!((malformed.load(Ordering::Relaxed), cursor.timestamp()), (1, 2_000));
    }
}
