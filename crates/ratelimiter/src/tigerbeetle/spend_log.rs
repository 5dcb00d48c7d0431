//! The spend ledger in the cluster (docs/prices.md, "The spend ledger"): every
//! completed call is one linked chain of transfers on a ledger of its own, its
//! billed micro-dollars as the header's amount and the rest of the entry, in a
//! compact binary form, in the user data. Every server tails the ledger in
//! timestamp order into sums kept in memory, as the directory's log is read,
//! so a report reads only what is new since the last one, and a server that
//! joins late reads the history once.
//!
//! The chain's ids derive from the entry's record id: a retried write sends the
//! very same chain, which the cluster refuses as `exists`, so an entry is never
//! counted twice. An entry counts once the cluster acknowledged it: the reader
//! meets only committed chains, whole (linked, consecutive timestamps).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use tigerbeetle_unofficial as tb;

use crate::base::id::id128;
use crate::model::error::LimiterError;
use crate::spend::SPEND_NAME_BYTES_MAX;
use crate::spend::{SpendBook, SpendEntry, SpendError, SpendQuery, SpendRecord, SpendRow, SpendSums};

use super::backend::TigerBeetleBackend;
use super::chain_reassembler::{chain_payload, ChainReassembler};
use super::definition_log::{carry_payload, link, QUERY_TRANSFERS_MAX};
use super::shared::Shared;

/// The ledger of spend entries, apart from every other log.
pub const LEDGER_SPEND: u32 = 9;
/// The code of every transfer of an entry.
pub const CODE_SPEND_ENTRY: u16 = 24;
/// The account code of the ledger's two accounts.
pub const ACCOUNT_CODE_SPEND: u16 = 12;
/// The entry format written in every header; a reader skips other formats.
pub const ENTRY_FORMAT: u32 = 1;
/// The header's bit saying the call's model had no known price.
const UNPRICED_BIT: u32 = 1 << 24;
/// The most bytes a `u64` takes as a LEB128 varint.
const VARINT_BYTES_MAX: usize = 10;
/// The largest encoded entry: three token counts and four names of the
/// longest length, each behind its length. Some 40 bytes for usual names: two
/// payload transfers besides the header.
pub const ENTRY_BYTES_MAX: usize = 3 * VARINT_BYTES_MAX + 4 * (2 + SPEND_NAME_BYTES_MAX);
/// Entries written in one request at most: with the longest names, 39
/// transfers each, under the cluster's 8,189 events a request.
pub const RECORD_BATCH_MAX: usize = 200;
/// Pages one catch-up reads at most before answering (each 240 transfers, some
/// 80 entries): a server joining a cluster with a long history reads it over
/// several reports; the first is made at start.
pub const READ_PAGES_MAX: usize = 4_096;

fn account_ids() -> [u128; 2] {
    [id128("acct:spend:debit"), id128("acct:spend:credit")]
}

/// The ledger's two accounts, unconstrained: the credit side's posted credits
/// are the micro-dollars of every entry ever recorded, a cross-check of the
/// reports' sums.
pub fn spend_accounts() -> Vec<tb::Account> {
    (account_ids().into_iter())
        .map(|id| tb::Account::new(id, LEDGER_SPEND, ACCOUNT_CODE_SPEND))
        .collect()
}

fn entry_transfer(id: u128) -> tb::Transfer {
    let [debit, credit] = account_ids();
    tb::Transfer::new(id)
        .with_debit_account_id(debit)
        .with_credit_account_id(credit)
        .with_amount(0)
        .with_ledger(LEDGER_SPEND)
        .with_code(CODE_SPEND_ENTRY)
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn take_varint(bytes: &mut &[u8]) -> Result<u64, String> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = bytes.split_first().ok_or("the entry ends inside a number")?;
        *bytes = rest;
        value |= u64::from(byte & 0x7f).checked_shl(shift).unwrap_or(0);
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err("a number longer than 64 bits".to_owned())
}

/// The chain of `record`: a header (`amount` = billed micro-dollars,
/// `user_data_128` = the record id, `user_data_64` = when the call completed,
/// `user_data_32` = format, the unpriced bit and length) and the token counts and names, 28
/// bytes a transfer, linked. Ids derive from the record id and the index.
pub fn encode(record: &SpendRecord) -> Vec<tb::Transfer> {
    let entry = &record.entry;
    let mut payload = Vec::with_capacity(64);
    for tokens in [entry.input_tokens, entry.cached_tokens, entry.output_tokens] {
        put_varint(&mut payload, tokens);
    }
    for name in [&entry.tenant, &entry.key, &entry.model, &entry.deployment] {
        put_varint(&mut payload, name.len() as u64);
        payload.extend_from_slice(name.as_bytes());
    }
    assert!(payload.len() <= ENTRY_BYTES_MAX, "a validated entry fits a chain");
    let id = |index: usize| id128(&format!("xfer:spend:{:032x}:{index}", record.id));
    let unpriced = if entry.unpriced { UNPRICED_BIT } else { 0 };
    let mut chain = vec![entry_transfer(id(0))
        .with_amount(u128::from(entry.micro_usd))
        .with_user_data_128(record.id)
        .with_user_data_64(entry.at_unix_ms)
        .with_user_data_32((ENTRY_FORMAT << 28) | unpriced | payload.len() as u32)];
    chain.extend(carry_payload(&payload, |i| entry_transfer(id(i + 1))));
    link(&mut chain);
    chain
}

/// Decodes one whole chain, header first; the entry is validated.
pub fn decode(chain: &[tb::Transfer]) -> Result<SpendEntry, String> {
    let payload = chain_payload(chain, ENTRY_FORMAT, ENTRY_BYTES_MAX, "entry")?;
    let header = &chain[0];
    let data = header.user_data_32();
    let mut bytes = payload.as_slice();
    let mut tokens = [0u64; 3];
    for count in &mut tokens {
        *count = take_varint(&mut bytes)?;
    }
    let mut names: [std::sync::Arc<str>; 4] = Default::default();
    for name in &mut names {
        let length = usize::try_from(take_varint(&mut bytes)?).map_err(|e| e.to_string())?;
        if length > bytes.len() {
            return Err("a name longer than the entry".to_owned());
        }
        let (text, rest) = bytes.split_at(length);
        *name = std::str::from_utf8(text).map_err(|e| e.to_string())?.into();
        bytes = rest;
    }
    if !bytes.is_empty() {
        return Err(format!("{} bytes after the entry", bytes.len()));
    }
    let [tenant, key, model, deployment] = names;
    let entry = SpendEntry {
        at_unix_ms: header.user_data_64(),
        tenant,
        key,
        model,
        deployment,
        input_tokens: tokens[0],
        cached_tokens: tokens[1],
        output_tokens: tokens[2],
        micro_usd: u64::try_from(header.amount()).map_err(|_| "an amount above u64")?,
        unpriced: data & UNPRICED_BIT != 0,
    };
    entry.validate().map_err(|e| e.to_string())?;
    Ok(entry)
}

/// What a server has read of the ledger: the sums of every entry up to a cursor.
#[derive(Debug)]
struct Tail {
    chains: ChainReassembler,
    sums: SpendSums,
}

impl Default for Tail {
    fn default() -> Self {
        Self {
            chains: ChainReassembler::new(CODE_SPEND_ENTRY, ENTRY_BYTES_MAX),
            sums: SpendSums::default(),
        }
    }
}

impl Tail {
    /// The timestamp of the last transfer consumed.
    fn timestamp(&self) -> u64 {
        self.chains.timestamp()
    }

    /// Consumes transfers read after the cursor, in timestamp order.
    fn consume(&mut self, transfers: &[tb::Transfer], malformed: &AtomicU64) {
        for chain in self.chains.consume(transfers, malformed) {
            match decode(&chain) {
                Ok(entry) => self.sums.add(&entry),
                Err(e) => {
                    tracing::error!(error = %e, "a spend entry does not decode; skipped");
                    malformed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

/// The spend book in the cluster of a [`TigerBeetleBackend`].
#[derive(Debug)]
pub struct TigerBeetleSpendBook {
    /// What the backend holds: its sessions and timeout.
    backend: Arc<Shared>,
    tail: tokio::sync::Mutex<Tail>,
    accounts_ready: AtomicBool,
    malformed: AtomicU64,
}

fn unavailable(e: LimiterError) -> SpendError {
    SpendError::Unavailable(e.to_string())
}

impl TigerBeetleSpendBook {
    /// The book of `backend`'s cluster; nothing is read before
    /// [`TigerBeetleSpendBook::read_history`] or the first report (the cluster
    /// may come up after the server).
    pub fn new(backend: Arc<TigerBeetleBackend>) -> Self {
        Self {
            backend: Arc::clone(&backend.shared),
            tail: tokio::sync::Mutex::new(Tail::default()),
            accounts_ready: AtomicBool::new(false),
            malformed: AtomicU64::new(0),
        }
    }

    /// Reads the whole ledger written so far, page after page: what a server
    /// joining a fleet late does once at start, so its first report is fast.
    pub async fn read_history(&self) -> Result<(), SpendError> {
        while !self.catch_up().await? {}
        Ok(())
    }

    /// Chains of the ledger that did not decode, skipped.
    pub fn malformed_total(&self) -> u64 {
        self.malformed.load(Ordering::Relaxed)
    }

    /// Reads what is new, at most [`READ_PAGES_MAX`] pages; true when it
    /// reached the ledger's end.
    async fn catch_up(&self) -> Result<bool, SpendError> {
        let mut tail = self.tail.lock().await;
        for _ in 0..READ_PAGES_MAX {
            let mut filter = tb::QueryFilter::new(QUERY_TRANSFERS_MAX).with_ledger(LEDGER_SPEND);
            filter.as_raw_mut().timestamp_min = tail.timestamp() + 1;
            let backend = &self.backend;
            let slot = backend.admin_slot().await.map_err(unavailable)?;
            let page = (backend.pool)
                .run(slot, backend.timeout, move |client| async move {
                    client.query_transfers(Box::new(filter)).await
                })
                .await
                .map_err(|e| unavailable(super::shared::unavailable(&e, "read the spend ledger")))?;
            tail.consume(&page, &self.malformed);
            if page.len() < QUERY_TRANSFERS_MAX as usize {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Writes up to [`RECORD_BATCH_MAX`] records in one request.
    async fn write(&self, records: &[SpendRecord]) -> Result<(), SpendError> {
        let mut transfers = Vec::new();
        let mut heads = Vec::with_capacity(records.len());
        for record in records {
            heads.push(transfers.len());
            transfers.extend(encode(record));
        }
        let backend = &self.backend;
        let slot = backend.admin_slot().await.map_err(unavailable)?;
        let failures = (backend.pool)
            .run(slot, backend.timeout, move |client| {
                super::submitter::create_transfers(client, transfers)
            })
            .await
            .map_err(|e| unavailable(super::shared::unavailable(&e, "write the spend ledger")))?;
        use tb::error::CreateTransferErrorKind as Kind;
        // A chain is written whole or not at all: its header's result says which.
        // `exists`: a retry of an entry the cluster already holds.
        let refused = (failures.iter())
            .filter(|f| heads.binary_search(&f.index).is_ok())
            .find(|f| !matches!(f.kind(), Kind::Exists));
        match refused {
            None => Ok(()),
            Some(failure) => {
                tracing::error!(code = ?failure.kind(), "the cluster refused a spend entry");
                Err(SpendError::Unavailable(format!(
                    "the cluster refused a spend entry: {:?}",
                    failure.kind()
                )))
            }
        }
    }
}

#[async_trait]
impl SpendBook for TigerBeetleSpendBook {
    async fn record(&self, records: &[SpendRecord]) -> Result<(), SpendError> {
        for record in records {
            record.entry.validate()?;
        }
        if !self.accounts_ready.load(Ordering::Acquire) {
            (self
                .backend
                .create_accounts_checked(spend_accounts(), "spend ledger")
                .await)
                .map_err(unavailable)?;
            self.accounts_ready.store(true, Ordering::Release);
        }
        for batch in records.chunks(RECORD_BATCH_MAX) {
            self.write(batch).await?;
        }
        Ok(())
    }

    async fn report(&self, query: &SpendQuery) -> Result<Vec<SpendRow>, SpendError> {
        if !self.catch_up().await? {
            return Err(SpendError::Unavailable(
                "still reading the spend ledger's history; ask again".to_owned(),
            ));
        }
        Ok(self.tail.lock().await.sums.report(query))
    }

    fn shared(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::super::chain_reassembler::stamped;
    use super::*;

    fn record(tenant: &str, key: &str) -> SpendRecord {
        SpendRecord {
            id: 0xfeed_u128 << 64 | 7,
            entry: SpendEntry {
                at_unix_ms: 1_795_824_000_123,
                tenant: tenant.into(),
                key: key.into(),
                model: "gpt-4o".into(),
                deployment: "azure-east".into(),
                input_tokens: 1_234,
                cached_tokens: 0,
                output_tokens: u64::MAX,
                micro_usd: 4_567,
                unpriced: false,
            },
        }
    }

    #[test]
    fn entries_round_trip_compactly_and_retries_have_the_same_ids() {
        let short = record("acme", "");
        let chain = encode(&short);
        assert_eq!(chain.len(), 3, "a usual entry is a header and two transfers");
        assert_eq!(decode(&chain).unwrap(), short.entry);
        let mut unpriced = record("acme", "");
        unpriced.entry.unpriced = true;
        assert_eq!(decode(&encode(&unpriced)).unwrap(), unpriced.entry);
        let longest = record(&"t".repeat(SPEND_NAME_BYTES_MAX), &"é".repeat(SPEND_NAME_BYTES_MAX / 2));
        let long_chain = encode(&longest);
        assert_eq!(decode(&long_chain).unwrap(), longest.entry);
        assert!(long_chain.len() * RECORD_BATCH_MAX <= 8_189);
        let ids = |chain: &[tb::Transfer]| chain.iter().map(|t| t.id()).collect::<Vec<_>>();
        assert_eq!(ids(&encode(&short)), ids(&chain), "a retry sends the same chain");
        let other = SpendRecord { id: 8, ..short.clone() };
        assert_ne!(encode(&other)[0].id(), chain[0].id());
        assert!(!chain.last().unwrap().flags().contains(tb::transfer::Flags::LINKED));
    }

    #[test]
    fn the_tail_sums_whole_chains_across_reads_and_skips_strangers() {
        let malformed = AtomicU64::new(0);
        let mut tail = Tail::default();
        let a = stamped(encode(&record("acme", "K1")), 10);
        let (first, rest) = a.split_at(1);
        tail.consume(first, &malformed);
        let query = SpendQuery::new(
            crate::spend::UtcDay::of_unix_ms(1_795_824_000_123),
            crate::spend::UtcDay::of_unix_ms(1_795_824_000_123),
            Vec::new(),
        )
        .unwrap();
        assert!(tail.sums.report(&query).is_empty(), "half a chain counts nothing");
        tail.consume(rest, &malformed);
        let mut bad = stamped(encode(&record("acme", "K2")), 20);
        bad[0].set_user_data_32((ENTRY_FORMAT << 28) | 3);
        tail.consume(&bad, &malformed);
        let mut stranger = entry_transfer(9).with_code(99);
        stranger.as_raw_mut().timestamp = 30;
        tail.consume(&[stranger], &malformed);
        let rows = tail.sums.report(&query);
        assert_eq!((rows.len(), rows[0].calls, rows[0].micro_usd), (1, 1, 4_567));
        assert_eq!((malformed.load(Ordering::Relaxed), tail.timestamp()), (1, 30));
    }

    #[test]
    fn truncated_or_padded_payloads_are_refused() {
        let chain = encode(&record("acme", ""));
        let mut short = chain.clone();
        short[0].set_user_data_32((ENTRY_FORMAT << 28) | 40);
        assert!(decode(&short).is_err());
        assert!(decode(&chain[..2]).is_err());
        let mut bytes: &[u8] = &[0x80];
        assert!(take_varint(&mut bytes).is_err());
    }
}
