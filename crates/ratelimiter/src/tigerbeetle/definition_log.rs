//! Limit definitions kept in the cluster (docs/tigerbeetle-backend.md,
//! "Shared definitions"): every change of a limit's state is one linked chain
//! of amount-0 transfers on a ledger of its own, carrying the state's JSON in
//! their user data. Every server tails the ledger in timestamp order, so the
//! cluster, replicated and linearizable, is the single source of truth of a
//! fleet's definitions; no server keeps them anywhere else.
//!
//! A chain is all or nothing (linked), and TigerBeetle commits it in one batch
//! with consecutive timestamps, so a reader meets its transfers together, in
//! order, the last one without the `linked` flag.

use std::collections::HashMap;

use sha2::{Digest, Sha256};
use tigerbeetle_unofficial as tb;

use crate::base::id::id128;
use crate::model::definition::LimitState;
use crate::model::key::LimitKey;

/// The ledger of definition records, apart from the limits' ledger so that
/// tailing it reads nothing else.
pub const LEDGER_DEFINITIONS: u32 = 2;
/// The code of every transfer of a definition record.
pub const CODE_DEFINITION: u16 = 16;
/// The account code of the two log accounts.
pub const ACCOUNT_CODE_LOG: u16 = 4;
/// The record format written in every header; a reader skips other formats.
pub const RECORD_FORMAT: u32 = 1;
/// The largest state JSON a record carries: a valid definition is at most a
/// 256-byte key, a 64-byte unit and a 1,024-byte description, under 8 KiB
/// even when every description byte needs a six-byte JSON escape.
pub const PAYLOAD_BYTES_MAX: usize = 16 * 1024;
/// Payload bytes in one transfer: `user_data_128`, `user_data_64`, `user_data_32`.
pub(super) const PAYLOAD_BYTES_PER_TRANSFER: usize = 28;
/// Transfers read per query: the reply of 128-byte transfers stays under the
/// 32 KiB messages of a `--development` replica.
pub const QUERY_TRANSFERS_MAX: u32 = 240;
/// The ledger of successor claims, apart from the log's so that readers of
/// the log never meet them.
pub const LEDGER_CLAIMS: u32 = 4;
/// The code of a successor claim.
pub const CODE_CLAIM: u16 = 17;
/// The account code of the two claim accounts.
pub const ACCOUNT_CODE_CLAIMS: u16 = 6;

/// What a record does to the key's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    /// A definition (PUT): the latest in the cluster's order wins.
    Put = 1,
    /// A decrease carried out: applies only if the state it carried out is
    /// still the key's latest, so a late writer cannot undo a newer PUT.
    DecreaseApplied = 2,
}

/// One decoded record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The cluster timestamp of the record's header: its version.
    pub version: u64,
    /// The version of the key's state the writer saw (0 for none).
    pub previous_version: u64,
    /// What the record does.
    pub kind: RecordKind,
    /// The state it carries.
    pub state: LimitState,
}

/// A state and the version of the record that set it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versioned {
    /// The state in force.
    pub state: LimitState,
    /// The cluster timestamp of the record that set it.
    pub version: u64,
}

/// The debit side of every record transfer.
pub fn log_debit_account_id() -> u128 {
    id128("acct:definitions:debit")
}

/// The credit side of every record transfer.
pub fn log_credit_account_id() -> u128 {
    id128("acct:definitions:credit")
}

/// The two log accounts and the two claim accounts: unconstrained, since
/// records and claims move no amount. They must exist before a claim is
/// sent: a claim refused for a missing account would burn its id for ever.
pub fn log_accounts() -> Vec<tb::Account> {
    let log = [log_debit_account_id(), log_credit_account_id()]
        .into_iter()
        .map(|id| tb::Account::new(id, LEDGER_DEFINITIONS, ACCOUNT_CODE_LOG));
    let claims = [
        id128("acct:definitions:claims:debit"),
        id128("acct:definitions:claims:credit"),
    ]
    .into_iter()
    .map(|id| tb::Account::new(id, LEDGER_CLAIMS, ACCOUNT_CODE_CLAIMS));
    log.chain(claims).collect()
}

/// The claim that a record follows the state of `key` at `previous_version`
/// (0: the key's first record): its id depends on the key and that version
/// alone, so at most one record ever follows a version, and a writer that
/// finds the claim taken by another record (`exists_with_different_user_data_128`)
/// knows its view is stale. `user_data_128` is the id of the record's header,
/// so a retry of the very same record finds `exists`.
pub fn successor_claim(key: &LimitKey, previous_version: u64, record_id: u128) -> tb::Transfer {
    tb::Transfer::new(id128(&format!("xfer:definition:next:{key}:{previous_version}")))
        .with_debit_account_id(id128("acct:definitions:claims:debit"))
        .with_credit_account_id(id128("acct:definitions:claims:credit"))
        .with_amount(0)
        .with_ledger(LEDGER_CLAIMS)
        .with_code(CODE_CLAIM)
        .with_user_data_128(record_id)
}

/// A record of `state` with its successor claim first and `moves` (the
/// capacity it funds or defunds) after it, all linked before the record: the
/// record, its claim and its capacity change are committed together or not at
/// all. Readers of the log meet only the record, whole, its last transfer
/// unlinked.
pub fn encode_claimed(
    state: &LimitState,
    kind: RecordKind,
    previous_version: u64,
    moves: Vec<tb::Transfer>,
) -> Vec<tb::Transfer> {
    let record = encode(state, kind, previous_version);
    let claim = successor_claim(state.definition().key(), previous_version, record[0].id());
    let mut chain = Vec::with_capacity(record.len() + moves.len() + 1);
    chain.push(claim);
    chain.extend(moves);
    for transfer in &mut chain {
        transfer.set_flags(transfer.flags() | tb::transfer::Flags::LINKED);
    }
    chain.extend(record);
    chain
}

/// The id carried by every record of `key` (`user_data_128` of its header), for audits.
pub fn key_record_id(key: &LimitKey) -> u128 {
    id128(&format!("definition:{key}"))
}

/// The chain that records `state`: for a [`RecordKind::Put`], an active state
/// of the definition as requested (readers compute what it leads to); for a
/// [`RecordKind::DecreaseApplied`], the state after the decrease. Ids derive from the key, the version the
/// writer saw, the kind and the payload: a retry sends the very same chain
/// (`exists`), and two servers carrying out the same decrease write one record.
pub fn encode(state: &LimitState, kind: RecordKind, previous_version: u64) -> Vec<tb::Transfer> {
    let payload = serde_json::to_vec(state).expect("a state serializes");
    assert!(payload.len() <= PAYLOAD_BYTES_MAX, "a valid state fits a record");
    let key = state.definition().key();
    let digest = hex(&Sha256::digest(&payload)[..16]);
    let id = |index: usize| {
        id128(&format!(
            "xfer:definition:{key}:{previous_version}:{kind:?}:{digest}:{index}"
        ))
    };
    let header_data = (RECORD_FORMAT << 28) | ((kind as u32) << 24) | payload.len() as u32;
    let mut transfers = vec![record_transfer(id(0))
        .with_user_data_128(key_record_id(key))
        .with_user_data_64(previous_version)
        .with_user_data_32(header_data)];
    transfers.extend(carry_payload(&payload, |i| record_transfer(id(i + 1))));
    link(&mut transfers);
    transfers
}

/// `payload` in the user data of transfers made by `transfer(i)`, 28 bytes each
/// (`user_data_128`, `_64`, `_32`), the last padded with zeros: how the records
/// of this log, and the announces beside it, carry their JSON.
pub(super) fn carry_payload<'a>(
    payload: &'a [u8],
    transfer: impl Fn(usize) -> tb::Transfer + 'a,
) -> impl Iterator<Item = tb::Transfer> + 'a {
    (payload.chunks(PAYLOAD_BYTES_PER_TRANSFER).enumerate()).map(move |(i, chunk)| {
        let mut bytes = [0u8; PAYLOAD_BYTES_PER_TRANSFER];
        bytes[..chunk.len()].copy_from_slice(chunk);
        transfer(i)
            .with_user_data_128(u128::from_le_bytes(bytes[..16].try_into().expect("16 bytes")))
            .with_user_data_64(u64::from_le_bytes(bytes[16..24].try_into().expect("8 bytes")))
            .with_user_data_32(u32::from_le_bytes(bytes[24..].try_into().expect("4 bytes")))
    })
}

/// The first `length` bytes the transfers of [`carry_payload`] carry.
pub(super) fn carried_payload(transfers: &[tb::Transfer], length: usize) -> Vec<u8> {
    let mut payload = Vec::with_capacity(transfers.len() * PAYLOAD_BYTES_PER_TRANSFER);
    for t in transfers {
        payload.extend_from_slice(&t.user_data_128().to_le_bytes());
        payload.extend_from_slice(&t.user_data_64().to_le_bytes());
        payload.extend_from_slice(&t.user_data_32().to_le_bytes());
    }
    payload.truncate(length);
    payload
}

/// Links every transfer of `chain` to the next, the last left unlinked: the
/// cluster commits the chain all or nothing, and a reader knows where it ends.
pub(super) fn link(chain: &mut [tb::Transfer]) {
    let last = chain.len().saturating_sub(1);
    for transfer in &mut chain[..last] {
        transfer.set_flags(tb::transfer::Flags::LINKED);
    }
}

fn record_transfer(id: u128) -> tb::Transfer {
    tb::Transfer::new(id)
        .with_debit_account_id(log_debit_account_id())
        .with_credit_account_id(log_credit_account_id())
        .with_amount(0)
        .with_ledger(LEDGER_DEFINITIONS)
        .with_code(CODE_DEFINITION)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Decodes one whole chain, header first.
pub fn decode(chain: &[tb::Transfer]) -> Result<Record, String> {
    let header = chain.first().ok_or("an empty chain")?;
    let data = header.user_data_32();
    if data >> 28 != RECORD_FORMAT {
        return Err(format!("record format {} is not {RECORD_FORMAT}", data >> 28));
    }
    let kind = match (data >> 24) & 0xf {
        1 => RecordKind::Put,
        2 => RecordKind::DecreaseApplied,
        other => return Err(format!("unknown record kind {other}")),
    };
    let length = (data & 0x00ff_ffff) as usize;
    if length > PAYLOAD_BYTES_MAX || length.div_ceil(PAYLOAD_BYTES_PER_TRANSFER) != chain.len() - 1 {
        return Err(format!(
            "{} payload transfers cannot hold {length} bytes",
            chain.len() - 1
        ));
    }
    let payload = carried_payload(&chain[1..], length);
    let state: LimitState = serde_json::from_slice(&payload).map_err(|e| format!("state: {e}"))?;
    Ok(Record {
        version: header.as_raw().timestamp,
        previous_version: header.user_data_64(),
        kind,
        state,
    })
}

/// What a server knows of the log: the state of every key, read up to a cursor.
#[derive(Debug, Default)]
pub struct DefinitionView {
    states: HashMap<LimitKey, Versioned>,
    /// Resource account id → key, to name the keys of transfers read back.
    accounts: HashMap<u128, LimitKey>,
    /// The timestamp of the last transfer consumed: the next read starts after it.
    cursor: u64,
    /// The transfers of a chain whose end the last read did not reach yet.
    partial: Vec<tb::Transfer>,
    /// The version of the newest record applied.
    newest_version: u64,
    /// Chains that did not decode (another writer, a newer format), skipped.
    malformed_total: u64,
}

impl DefinitionView {
    /// The timestamp after which the next read starts.
    pub fn cursor(&self) -> u64 {
        self.cursor
    }

    /// Consumes transfers read after the cursor, in timestamp order; returns
    /// how many records changed a state.
    pub fn consume(&mut self, transfers: &[tb::Transfer]) -> usize {
        let mut applied = 0;
        for transfer in transfers {
            self.cursor = self.cursor.max(transfer.as_raw().timestamp);
            if self.partial.len() > PAYLOAD_BYTES_MAX / PAYLOAD_BYTES_PER_TRANSFER + 1 {
                // Longer than any record: not ours. Skip to the next chain.
                self.partial.clear();
                self.malformed_total += 1;
            }
            self.partial.push(*transfer);
            if transfer.flags().contains(tb::transfer::Flags::LINKED) {
                continue;
            }
            let chain = std::mem::take(&mut self.partial);
            match decode(&chain) {
                Ok(record) => applied += usize::from(self.apply(record)),
                Err(e) => {
                    tracing::error!(error = %e, "a definition record does not decode; skipped");
                    self.malformed_total += 1;
                }
            }
        }
        applied
    }

    /// Applies one record in the cluster's order; false when it changed nothing.
    ///
    /// A `Put` carries the definition as requested, and every server computes
    /// the state it leads to from the state in force with the one rule of
    /// [`LimitState::after_definition`]: two servers that took PUTs of one key
    /// at once thus agree, and a lower capacity written concurrently with a
    /// higher one becomes a decrease, never a capacity below usage.
    fn apply(&mut self, record: Record) -> bool {
        let key = record.state.definition().key().clone();
        let current = self.states.get(&key);
        let state = match record.kind {
            RecordKind::DecreaseApplied if current.map(|c| c.version) != Some(record.previous_version) => {
                tracing::debug!(%key, "a decrease record for a superseded state; skipped");
                return false;
            }
            RecordKind::DecreaseApplied => record.state,
            RecordKind::Put => {
                let definition = record.state.definition().clone();
                match LimitState::after_definition(current.map(|c| &c.state), definition) {
                    Ok(state) => state,
                    Err(e) => {
                        tracing::warn!(%key, error = %e, "a definition record conflicts with the state in force; skipped");
                        return false;
                    }
                }
            }
        };
        self.newest_version = self.newest_version.max(record.version);
        self.accounts.insert(super::ids::resource_account_id(&key), key.clone());
        self.states.insert(
            key,
            Versioned {
                state,
                version: record.version,
            },
        );
        true
    }

    /// The state of `key` and its version.
    pub fn get(&self, key: &LimitKey) -> Option<&Versioned> {
        self.states.get(key)
    }

    /// The key whose resource account is `account`.
    pub fn key_of_account(&self, account: u128) -> Option<&LimitKey> {
        self.accounts.get(&account)
    }

    /// Every state, in no order.
    pub fn states(&self) -> impl Iterator<Item = &Versioned> {
        self.states.values()
    }

    /// How many keys are defined.
    pub fn len(&self) -> usize {
        self.states.len()
    }

    /// True when no key is defined.
    pub fn is_empty(&self) -> bool {
        self.states.is_empty()
    }

    /// The cluster timestamp (ns since the epoch) of the newest record applied; 0 for none.
    pub fn newest_version(&self) -> u64 {
        self.newest_version
    }

    /// Chains skipped because they did not decode.
    pub fn malformed_total(&self) -> u64 {
        self.malformed_total
    }
}

#[cfg(test)]
mod tests {
    use super::super::chain_reassembler::stamped;
    use super::*;
    use crate::model::definition::LimitDefinition;

    fn state(capacity: u64, description: &str) -> LimitState {
        let mut fields = LimitDefinition::rolling(LimitKey::new("k:tpm").unwrap(), capacity, 60)
            .unwrap()
            .fields()
            .clone();
        fields.description = description.to_owned();
        LimitState::active(LimitDefinition::new(fields).unwrap())
    }

    #[test]
    fn records_round_trip_through_a_chain() {
        let long = "é\"\n".repeat(256);
        for s in [state(10, ""), state(7, &long)] {
            let chain = stamped(encode(&s, RecordKind::Put, 5), 100);
            assert!(chain[..chain.len() - 1]
                .iter()
                .all(|t| t.flags().contains(tb::transfer::Flags::LINKED)));
            let record = decode(&chain).unwrap();
            assert_eq!((record.state, record.version, record.previous_version), (s, 100, 5));
        }
    }

    #[test]
    fn a_period_round_trips_and_changes_the_record() {
        let key = LimitKey::new("k:tpm").unwrap();
        let month =
            LimitState::active(LimitDefinition::per_period(key, 10, crate::base::period::Period::Month).unwrap());
        let chain = stamped(encode(&month, RecordKind::Put, 5), 100);
        let record = decode(&chain).unwrap();
        assert_eq!(
            record.state.definition().period(),
            Some(crate::base::period::Period::Month)
        );
        assert_eq!(record.state, month);
        let rolling = encode(&state(10, ""), RecordKind::Put, 5);
        assert_ne!(encode(&month, RecordKind::Put, 5)[0].id(), rolling[0].id());
    }

    #[test]
    fn the_same_change_has_the_same_ids_and_another_has_others() {
        let a = encode(&state(10, ""), RecordKind::Put, 5);
        let ids = |chain: &[tb::Transfer]| chain.iter().map(|t| t.id()).collect::<Vec<_>>();
        assert_eq!(ids(&a), ids(&encode(&state(10, ""), RecordKind::Put, 5)));
        assert_ne!(a[0].id(), encode(&state(10, ""), RecordKind::Put, 6)[0].id());
        assert_ne!(a[0].id(), encode(&state(11, ""), RecordKind::Put, 5)[0].id());
    }

    #[test]
    fn a_claimed_record_is_one_chain_that_readers_of_the_log_see_whole() {
        let key = LimitKey::new("k:tpm").unwrap();
        let fund = tb::Transfer::new(7).with_amount(3).with_ledger(1).with_code(2);
        let chain = encode_claimed(&state(10, ""), RecordKind::Put, 5, vec![fund]);
        let record = encode(&state(10, ""), RecordKind::Put, 5);
        assert_eq!(chain[0].id(), successor_claim(&key, 5, record[0].id()).id());
        assert_eq!(chain[0].user_data_128(), record[0].id());
        assert_eq!((chain[0].ledger(), chain[1].id()), (LEDGER_CLAIMS, 7));
        let ids = |chain: &[tb::Transfer]| chain.iter().map(|t| t.id()).collect::<Vec<_>>();
        assert_eq!(ids(&chain[2..]), ids(&record));
        assert!(chain[..chain.len() - 1]
            .iter()
            .all(|t| t.flags().contains(tb::transfer::Flags::LINKED)));
        assert!(!chain.last().unwrap().flags().contains(tb::transfer::Flags::LINKED));
        // Another record after the same version claims the same id with other data.
        let other = encode_claimed(&state(11, ""), RecordKind::Put, 5, Vec::new());
        assert_eq!(other[0].id(), chain[0].id());
        assert_ne!(other[0].user_data_128(), chain[0].user_data_128());
    }

    #[test]
    fn the_view_applies_records_in_order_across_reads() {
        let mut view = DefinitionView::default();
        let first = stamped(encode(&state(10, &"x".repeat(200)), RecordKind::Put, 0), 10);
        let (a, b) = first.split_at(3);
        assert_eq!(view.consume(a), 0, "half a chain applies nothing");
        assert_eq!(view.consume(b), 1);
        let key = LimitKey::new("k:tpm").unwrap();
        assert_eq!(view.get(&key).unwrap().version, 10);
        let stale = stamped(encode(&state(4, ""), RecordKind::DecreaseApplied, 3), 100);
        assert_eq!(view.consume(&stale), 0, "a decrease of a superseded state is skipped");
        let lower = stamped(encode(&state(4, ""), RecordKind::Put, 0), 150);
        assert_eq!(view.consume(&lower), 1, "a concurrent lower PUT is a decrease");
        let decreasing = view.get(&key).unwrap().clone();
        assert_eq!(
            (
                decreasing.state.status(),
                decreasing.state.definition().capacity(),
                decreasing.state.pending_decrease_to()
            ),
            (crate::model::definition::LimitStatus::Decreasing, 10, 4)
        );
        let fresh = stamped(encode(&state(4, ""), RecordKind::DecreaseApplied, 150), 200);
        assert_eq!(view.consume(&fresh), 1);
        assert_eq!(view.get(&key).unwrap().state.definition().capacity(), 4);
        assert_eq!(
            (view.cursor(), view.newest_version()),
            (200 + fresh.len() as u64 - 1, 200)
        );
        let mut garbage = stamped(encode(&state(1, ""), RecordKind::Put, 0), 300);
        garbage[0].set_user_data_32(0);
        assert_eq!(view.consume(&garbage), 0);
        assert_eq!(view.malformed_total(), 1);
        assert_eq!(
            view.key_of_account(super::super::ids::resource_account_id(&key)),
            Some(&key)
        );
    }
}
