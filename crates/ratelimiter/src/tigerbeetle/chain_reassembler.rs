//! The reader's half of [`carry_payload`](super::definition_log): the logs
//! that write one record as one linked chain of transfers on a ledger of their
//! own (the directory's changes, the spend ledger's entries) read that ledger
//! page after page in timestamp order, and a page may end inside a chain. This
//! puts the chains of one transfer code back together across pages, so that
//! each log only decodes whole chains.
//!
//! TigerBeetle commits a linked chain in one batch with consecutive
//! timestamps: a reader meets its transfers together, in order, the last one
//! without the `linked` flag. A chain that does not end where the log's
//! largest record would is not the log's, and is dropped.

use std::sync::atomic::{AtomicU64, Ordering};

use tigerbeetle_unofficial as tb;

use super::definition_log::{carried_payload, PAYLOAD_BYTES_PER_TRANSFER};

/// Where a reader stands in one log's ledger, and the chain of that log whose
/// end the last page did not reach yet.
#[derive(Debug)]
pub(super) struct ChainReassembler {
    /// The transfer code of the log's chains; transfers of other codes (another
    /// writer's, or a newer version's) are passed over.
    code: u16,
    /// The header and the whole 28-byte transfers of the log's largest
    /// payload. A chain may hold one more (the payload's rest); when another
    /// comes with more than these held, the chain is longer than any record of
    /// the log, and the held transfers are dropped.
    held_max: usize,
    /// The timestamp of the last transfer consumed, of any code: the next
    /// page is read after it.
    timestamp: u64,
    /// The transfers of a chain whose end the last page did not reach yet.
    partial: Vec<tb::Transfer>,
}

impl ChainReassembler {
    /// The reassembler of the chains of `code`, whose payloads hold at most
    /// `payload_bytes_max` bytes; nothing consumed yet.
    pub(super) fn new(code: u16, payload_bytes_max: usize) -> Self {
        Self {
            code,
            held_max: payload_bytes_max / PAYLOAD_BYTES_PER_TRANSFER + 1,
            timestamp: 0,
            partial: Vec::new(),
        }
    }

    /// The timestamp of the last transfer consumed (0 before any): the next
    /// read starts after it.
    pub(super) fn timestamp(&self) -> u64 {
        self.timestamp
    }

    /// Consumes a page read after [`ChainReassembler::timestamp`], in
    /// timestamp order; returns the chains of the log's code it completes,
    /// header first, in order. A chain the page ends inside is held for the
    /// next page. Transfers held past the longest chain of the log are
    /// dropped, each such drop counted in `malformed`.
    pub(super) fn consume(&mut self, transfers: &[tb::Transfer], malformed: &AtomicU64) -> Vec<Vec<tb::Transfer>> {
        let mut chains = Vec::new();
        for transfer in transfers {
            self.timestamp = self.timestamp.max(transfer.as_raw().timestamp);
            if transfer.code() != self.code {
                continue; // another writer's, or a newer version's
            }
            if self.partial.len() > self.held_max {
                self.partial.clear(); // longer than any record of the log: not ours
                malformed.fetch_add(1, Ordering::Relaxed);
            }
            self.partial.push(*transfer);
            if !transfer.flags().contains(tb::transfer::Flags::LINKED) {
                chains.push(std::mem::take(&mut self.partial));
            }
        }
        chains
    }
}

/// `transfers` with the cluster's timestamps from `first_ns` on, one a
/// transfer, as a read returns what the cluster committed: for the logs' tests.
/// The payload of one whole chain, header first, whose header's
/// `user_data_32` carries the record's format in its top 4 bits and the
/// payload's length in its low 24 (as the directory and spend logs write them):
/// an error when the format is not `format`, or the length is above
/// `bytes_max` or does not fill the chain's transfers. `what` names the record
/// in the message.
pub fn chain_payload(chain: &[tb::Transfer], format: u32, bytes_max: usize, what: &str) -> Result<Vec<u8>, String> {
    let header = chain.first().ok_or("an empty chain")?;
    let data = header.user_data_32();
    if data >> 28 != format {
        return Err(format!("{what} format {} is not {format}", data >> 28));
    }
    let length = (data & 0x00ff_ffff) as usize;
    if length > bytes_max || length.div_ceil(PAYLOAD_BYTES_PER_TRANSFER) != chain.len() - 1 {
        return Err(format!("{} transfers cannot hold {length} bytes", chain.len() - 1));
    }
    Ok(carried_payload(&chain[1..], length))
}

#[cfg(test)]
pub(super) fn stamped(mut transfers: Vec<tb::Transfer>, first_ns: u64) -> Vec<tb::Transfer> {
    for (i, t) in transfers.iter_mut().enumerate() {
        t.as_raw_mut().timestamp = first_ns + i as u64;
    }
    transfers
}

#[cfg(test)]
mod tests {
    use super::*;

    const CODE: u16 = 30;

    /// A chain of `length` transfers of `code`, ids from `first_id`, linked
    /// but for the last; not stamped yet.
    fn chain(code: u16, length: usize, first_id: u128) -> Vec<tb::Transfer> {
        (0..length)
            .map(|i| {
                let last = i + 1 == length;
                let flags = if last {
                    tb::transfer::Flags::empty()
                } else {
                    tb::transfer::Flags::LINKED
                };
                (tb::Transfer::new(first_id + i as u128).with_code(code)).with_flags(flags)
            })
            .collect()
    }

    /// A reassembler of [`CODE`] whose largest payload fills `transfers_max`
    /// transfers, and its malformed count.
    fn reassembler(transfers_max: usize) -> (ChainReassembler, AtomicU64) {
        let reassembler = ChainReassembler::new(CODE, transfers_max * PAYLOAD_BYTES_PER_TRANSFER);
        (reassembler, AtomicU64::new(0))
    }

    fn ids(chains: &[Vec<tb::Transfer>]) -> Vec<Vec<u128>> {
        (chains.iter())
            .map(|chain| chain.iter().map(|t| t.id()).collect())
            .collect()
    }

    #[test]
    fn a_chain_split_over_two_pages_comes_out_whole_once_its_end_arrives() {
        let (mut reassembler, malformed) = reassembler(4);
        let mut page = chain(CODE, 2, 10);
        page.extend(chain(CODE, 5, 20));
        let page = stamped(page, 100);
        let (first, second) = page.split_at(4);
        let chains = reassembler.consume(first, &malformed);
        assert_eq!(ids(&chains), vec![vec![10, 11]], "the whole chain only");
        assert_eq!(reassembler.timestamp(), 103, "the cursor passes the held transfers");
        let chains = reassembler.consume(second, &malformed);
        assert_eq!(ids(&chains), vec![vec![20, 21, 22, 23, 24]]);
        assert_eq!((reassembler.timestamp(), malformed.load(Ordering::Relaxed)), (106, 0));
    }

    #[test]
    fn an_unterminated_chain_is_held_across_pages_until_its_end() {
        let (mut reassembler, malformed) = reassembler(4);
        let whole = stamped(chain(CODE, 5, 10), 100);
        for (i, transfer) in whole[..4].iter().enumerate() {
            let page = std::slice::from_ref(transfer);
            assert!(reassembler.consume(page, &malformed).is_empty(), "transfer {i}");
            assert_eq!(reassembler.timestamp(), 100 + i as u64);
        }
        let chains = reassembler.consume(&[], &malformed);
        assert!(chains.is_empty(), "an empty page ends nothing");
        let chains = reassembler.consume(&whole[4..], &malformed);
        assert_eq!(ids(&chains), vec![vec![10, 11, 12, 13, 14]]);
    }

    #[test]
    fn other_codes_advance_the_cursor_and_are_skipped_even_inside_a_chain() {
        let (mut reassembler, malformed) = reassembler(4);
        let ours = chain(CODE, 3, 10);
        let mut page = vec![ours[0]];
        page.extend(chain(CODE + 1, 2, 20));
        page.extend_from_slice(&ours[1..]);
        page.extend(chain(CODE - 1, 1, 30));
        let chains = reassembler.consume(&stamped(page, 100), &malformed);
        assert_eq!(ids(&chains), vec![vec![10, 11, 12]]);
        assert_eq!((reassembler.timestamp(), malformed.load(Ordering::Relaxed)), (105, 0));
    }

    #[test]
    fn a_chain_longer_than_the_largest_record_is_dropped_and_counted() {
        // Two payload transfers at most: a header and two hold 56 bytes; up to
        // four transfers are held before one more proves a chain too long.
        let (mut reassembler, malformed) = reassembler(2);
        let chains = reassembler.consume(&stamped(chain(CODE, 4, 10), 100), &malformed);
        assert_eq!(ids(&chains), vec![vec![10, 11, 12, 13]]);
        assert_eq!(malformed.load(Ordering::Relaxed), 0);
        // Ten transfers: dropped after four and again after four more; its
        // last two come out as a chain of their own, which no log decodes.
        let chains = reassembler.consume(&stamped(chain(CODE, 10, 20), 200), &malformed);
        assert_eq!(ids(&chains), vec![vec![28, 29]]);
        assert_eq!(malformed.load(Ordering::Relaxed), 2);
        // The next chain is read whole.
        let chains = reassembler.consume(&stamped(chain(CODE, 2, 40), 300), &malformed);
        assert_eq!(ids(&chains), vec![vec![40, 41]]);
        assert_eq!((reassembler.timestamp(), malformed.load(Ordering::Relaxed)), (301, 2));
    }
}
