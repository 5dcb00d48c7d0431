//! The fleet's servers as the cluster saw them (docs/tigerbeetle-backend.md,
//! "Servers of the fleet"): each server names itself once when it starts (an
//! *announce*), and every definition record it writes carries, in the same
//! linked chain, an *author* transfer naming it. Both live on a ledger of
//! their own, so the definition log's records are unchanged: a server of an
//! older version, which reads only the log's ledger and skips formats it does
//! not know, reads every definition a newer server writes, and never meets
//! these transfers.
//!
//! What it costs: one chain of a few transfers per server start (the name and
//! address in JSON, at most [`ANNOUNCE_BYTES_MAX`] bytes), and one transfer per
//! definition record (128 bytes next to the record's dozen or more). Nothing
//! periodic: the ledger grows with starts and definition changes only.

use std::collections::BTreeMap;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tigerbeetle_unofficial as tb;

use crate::base::id::id128;
use crate::limiting::limiter::FleetServer;

use super::definition_log::{carried_payload, carry_payload, link, PAYLOAD_BYTES_PER_TRANSFER};

/// The ledger of announces and authors, apart from the definition log's.
pub const LEDGER_SERVERS: u32 = 5;
/// The code of an announce chain's transfers.
pub const CODE_ANNOUNCE: u16 = 18;
/// The code of the transfer naming a definition record's writer.
pub const CODE_AUTHOR: u16 = 19;
/// The account code of the two server-log accounts.
pub const ACCOUNT_CODE_SERVERS: u16 = 7;
/// The announce format in its header; a reader skips other formats and codes.
pub const ANNOUNCE_FORMAT: u32 = 1;
/// The largest announce payload: a host name (at most 255 bytes), an address
/// and a version, with room to spare.
pub const ANNOUNCE_BYTES_MAX: usize = 1_024;
/// The most servers remembered; past it new ones are counted, not listed, so
/// a cluster that saw many short-lived servers cannot grow a server's memory.
pub const SERVERS_SEEN_MAX: usize = 1_000;

/// Who a server is: its host's name and the address its API listens on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerIdentity {
    /// The host's name.
    pub name: String,
    /// The address of the server's API.
    pub address: String,
    /// The server's version.
    pub version: String,
}

impl ServerIdentity {
    /// The id that names this server in the cluster: its name and address
    /// (a restart of the same server keeps it).
    pub fn id(&self) -> u128 {
        id128(&format!("server:{}|{}", self.name, self.address))
    }
}

/// The debit and credit sides of every server-log transfer.
fn accounts_ids() -> [u128; 2] {
    [id128("acct:servers:debit"), id128("acct:servers:credit")]
}

/// The server log's two accounts: unconstrained, since nothing moves an amount.
pub fn server_accounts() -> Vec<tb::Account> {
    (accounts_ids().into_iter())
        .map(|id| tb::Account::new(id, LEDGER_SERVERS, ACCOUNT_CODE_SERVERS))
        .collect()
}

fn server_transfer(id: u128, code: u16) -> tb::Transfer {
    let [debit, credit] = accounts_ids();
    tb::Transfer::new(id)
        .with_debit_account_id(debit)
        .with_credit_account_id(credit)
        .with_amount(0)
        .with_ledger(LEDGER_SERVERS)
        .with_code(code)
}

/// The transfer, linked into a definition record's chain, that names its
/// writer: its id derives from the record's header id, so a retry of the
/// record sends the very same one.
pub fn author(record_id: u128, server: u128) -> tb::Transfer {
    server_transfer(id128(&format!("xfer:definition:author:{record_id:032x}")), CODE_AUTHOR)
        .with_user_data_128(server)
        .with_flags(tb::transfer::Flags::LINKED)
}

/// The chain that announces `identity`, started at `started_unix_ms`: a header
/// (`user_data_128` = the server's id, `user_data_64` = the start, `user_data_32`
/// = format and payload length) and the identity's JSON, 28 bytes a transfer.
pub fn announce(identity: &ServerIdentity, started_unix_ms: u64) -> Vec<tb::Transfer> {
    let payload = serde_json::to_vec(identity).expect("an identity serializes");
    assert!(payload.len() <= ANNOUNCE_BYTES_MAX, "checked by the caller");
    let server = identity.id();
    let id = |index: usize| id128(&format!("xfer:server:announce:{server:032x}:{started_unix_ms}:{index}"));
    let header = (ANNOUNCE_FORMAT << 28) | payload.len() as u32;
    let mut chain = vec![server_transfer(id(0), CODE_ANNOUNCE)
        .with_user_data_128(server)
        .with_user_data_64(started_unix_ms)
        .with_user_data_32(header)];
    chain.extend(carry_payload(&payload, |i| server_transfer(id(i + 1), CODE_ANNOUNCE)));
    link(&mut chain);
    chain
}

/// Decodes an announce chain: the server's id and identity.
fn decode_announce(chain: &[tb::Transfer]) -> Result<(u128, ServerIdentity), String> {
    let header = chain.first().ok_or("an empty chain")?;
    let data = header.user_data_32();
    if data >> 28 != ANNOUNCE_FORMAT {
        return Err(format!("announce format {} is not {ANNOUNCE_FORMAT}", data >> 28));
    }
    let length = (data & 0x00ff_ffff) as usize;
    if length > ANNOUNCE_BYTES_MAX || length.div_ceil(PAYLOAD_BYTES_PER_TRANSFER) != chain.len() - 1 {
        return Err(format!("{} transfers cannot hold {length} bytes", chain.len() - 1));
    }
    let payload = carried_payload(&chain[1..], length);
    let identity = serde_json::from_slice(&payload).map_err(|e| format!("identity: {e}"))?;
    Ok((header.user_data_128(), identity))
}

/// What one server knows of the fleet's servers, read up to a cursor.
#[derive(Debug, Default)]
pub struct ServerView {
    servers: BTreeMap<u128, FleetServer>,
    /// The timestamp of the last transfer consumed.
    cursor: u64,
    /// An announce chain whose end the last read did not reach yet.
    partial: Vec<tb::Transfer>,
    /// Servers past [`SERVERS_SEEN_MAX`], counted only.
    unlisted: u64,
}

impl ServerView {
    /// The timestamp after which the next read starts.
    pub fn cursor(&self) -> u64 {
        self.cursor
    }

    /// Servers seen beyond [`SERVERS_SEEN_MAX`].
    pub fn unlisted(&self) -> u64 {
        self.unlisted
    }

    /// Every server seen, first seen first.
    pub fn servers(&self) -> Vec<FleetServer> {
        let mut out: Vec<FleetServer> = self.servers.values().cloned().collect();
        out.sort_by_key(|s| (s.first_seen_unix_ms, s.name.clone(), s.address.clone()));
        out
    }

    /// Consumes transfers of the server ledger read after the cursor, in timestamp order.
    pub fn consume(&mut self, transfers: &[tb::Transfer]) {
        for transfer in transfers {
            let at_ms = transfer.as_raw().timestamp / 1_000_000;
            self.cursor = self.cursor.max(transfer.as_raw().timestamp);
            match transfer.code() {
                CODE_AUTHOR => {
                    if let Some(server) = self.server(transfer.user_data_128(), at_ms) {
                        server.records_written += 1;
                    }
                }
                CODE_ANNOUNCE => {
                    self.partial.push(*transfer);
                    if self.partial.len() > ANNOUNCE_BYTES_MAX / PAYLOAD_BYTES_PER_TRANSFER + 2 {
                        self.partial.clear();
                        continue;
                    }
                    if transfer.flags().contains(tb::transfer::Flags::LINKED) {
                        continue;
                    }
                    let chain = std::mem::take(&mut self.partial);
                    match decode_announce(&chain) {
                        Ok((id, identity)) => {
                            if let Some(server) = self.server(id, at_ms) {
                                server.name = identity.name;
                                server.address = identity.address;
                                server.version = identity.version;
                                server.starts += 1;
                            }
                        }
                        Err(e) => tracing::debug!(error = %e, "a server announce does not decode; skipped"),
                    }
                }
                // Another writer's, or a newer version's: not ours to read.
                _ => {}
            }
        }
    }

    /// The entry of server `id`, seen at `at_ms`; `None` past the bound.
    fn server(&mut self, id: u128, at_ms: u64) -> Option<&mut FleetServer> {
        if !self.servers.contains_key(&id) {
            if self.servers.len() >= SERVERS_SEEN_MAX {
                self.unlisted += 1;
                return None;
            }
            self.servers.insert(
                id,
                FleetServer {
                    name: String::new(),
                    address: String::new(),
                    version: String::new(),
                    first_seen_unix_ms: at_ms,
                    last_seen_unix_ms: at_ms,
                    starts: 0,
                    records_written: 0,
                },
            );
        }
        let server = self.servers.get_mut(&id).expect("just inserted");
        server.last_seen_unix_ms = server.last_seen_unix_ms.max(at_ms);
        Some(server)
    }
}

/// Pages of the server ledger one read consumes at most: a server joining a
/// cluster with a long history catches up over several reads.
pub const SERVER_PAGES_MAX: usize = 64;
/// Attempts to write the announce while the cluster does not answer, the
/// pause doubling from 1 s to 30 s (about half an hour in all); a server whose
/// announce never lands is still seen by its first definition record.
pub const ANNOUNCE_ATTEMPTS_MAX: u32 = 64;
pub(super) const ANNOUNCE_PAUSE_MIN_MS: u64 = 1_000;
pub(super) const ANNOUNCE_PAUSE_MAX_MS: u64 = 30_000;

/// The announce's progress: written, or when to try again.
#[derive(Debug)]
pub(super) struct AnnounceProgress {
    pub(super) written: bool,
    pub(super) attempts: u32,
    pub(super) next_at: Instant,
    pub(super) pause_ms: u64,
}

impl Default for AnnounceProgress {
    fn default() -> Self {
        Self {
            written: false,
            attempts: 0,
            next_at: Instant::now(),
            pause_ms: ANNOUNCE_PAUSE_MIN_MS,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::chain_reassembler::stamped;
    use super::*;

    #[test]
    fn announces_and_authors_make_each_server_with_its_counts() {
        let a = ServerIdentity {
            name: "host-a".into(),
            address: "10.0.0.1:8080".into(),
            version: "0.1.0".into(),
        };
        let b = ServerIdentity {
            address: "10.0.0.2:8080".into(),
            ..a.clone()
        };
        let mut view = ServerView::default();
        let mut log = announce(&a, 1_000);
        assert!(log.len() > 2, "a header and the identity's JSON");
        log.push(author(7, a.id()));
        log.push(author(8, a.id()));
        log.extend(announce(&b, 2_000));
        log.extend(announce(&a, 3_000));
        view.consume(&stamped(log, 5_000_000_000));
        let servers = view.servers();
        assert_eq!(servers.len(), 2);
        assert_eq!(
            (
                servers[0].address.as_str(),
                servers[0].starts,
                servers[0].records_written
            ),
            ("10.0.0.1:8080", 2, 2)
        );
        assert_eq!(
            (
                servers[1].address.as_str(),
                servers[1].starts,
                servers[1].records_written
            ),
            ("10.0.0.2:8080", 1, 0)
        );
        assert!(
            servers[0].last_seen_unix_ms >= servers[1].first_seen_unix_ms,
            "a's restart came after b"
        );
    }

    #[test]
    fn an_announce_split_over_two_reads_is_read_whole_and_other_codes_are_skipped() {
        let a = ServerIdentity {
            name: "h".into(),
            address: "127.0.0.1:1".into(),
            version: "0".into(),
        };
        let chain = stamped(announce(&a, 1), 1_000_000);
        let mut view = ServerView::default();
        let stranger = server_transfer(1, 99);
        view.consume(&[stranger]);
        view.consume(&chain[..2]);
        assert!(view.servers().is_empty(), "half a chain names nobody yet");
        view.consume(&chain[2..]);
        assert_eq!(view.servers()[0].name, "h");
    }
}
