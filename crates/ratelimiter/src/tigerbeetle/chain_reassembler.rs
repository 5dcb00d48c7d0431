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

use super::definition_log::PAYLOAD_BYTES_PER_TRANSFER;

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

#[cfg(test)]
mod tests {
    use super::*;

    const CODE: u16 = 30;

    /// A chain of `length` transfers of `code`, ids and timestamps from `first`,
    /// linked but for the last.
    fn chain(code: u16, length: usize, first: u64) -> Vec<tb::Transfer> {
        (0..length as u64)
            .map(|i| {
                let linked = if i + 1 < length as u64 {
                    tb::transfer::Flags::LINKED
                } else {
                    tb::transfer::Flags::empty()
                };
                let mut transfer = tb::Transfer::new(u128::from(first + i))
                    .with_code(code)
                    .with_flags(linked);
                transfer.as_raw_mut().timestamp = first + i;
                transfer
            })
            .collect()
    }

    fn ids(chains: &[Vec<tb::Transfer>]) -> Vec<Vec<u128>> {
        (chains.iter())
            .map(|chain| chain.iter().map(|t| t.id()).collect())
            .collect()
    }

    #[test]
    fn a_chain_split_over_two_pages_comes_out_whole_once_its_end_arrives() {
        let malformed = AtomicU64::new(0);
        let mut reassembler = ChainReassembler::new(CODE, 4 * PAYLOAD_BYTES_PER_TRANSFER);
        let mut page = chain(CODE, 2, 10);
        page.extend(chain(CODE, 5, 20));
        let (first, second) = page.split_at(4);
        assert_eq!(
            ids(&reassembler.consume(first, &malformed)),
            vec![vec![10, 11]],
            "the whole chain only"
        );
        assert_eq!(reassembler.timestamp(), 21, "the cursor passes the held transfers");
        assert_eq!(
            ids(&reassembler.consume(second, &malformed)),
            vec![vec![20, 21, 22, 23, 24]]
        );
        assert_eq!((reassembler.timestamp(), malformed.load(Ordering::Relaxed)), (24, 0));
    }

    #[test]
    fn an_unterminated_chain_is_held_across_pages_until_its_end() {
        let malformed = AtomicU64::new(0);
        let mut reassembler = ChainReassembler::new(CODE, 4 * PAYLOAD_BYTES_PER_TRANSFER);
        let whole = chain(CODE, 5, 100);
        for (i, transfer) in whole[..4].iter().enumerate() {
            assert!(reassembler
                .consume(std::slice::from_ref(transfer), &malformed)
                .is_empty());
            assert_eq!(reassembler.timestamp(), 100 + i as u64);
        }
        assert!(
            reassembler.consume(&[], &malformed).is_empty(),
            "an empty page ends nothing"
        );
        assert_eq!(
            ids(&reassembler.consume(&whole[4..], &malformed)),
            vec![vec![100, 101, 102, 103, 104]]
        );
    }

    #[test]
    fn other_codes_advance_the_cursor_and_are_skipped_even_inside_a_chain() {
        let malformed = AtomicU64::new(0);
        let mut reassembler = ChainReassembler::new(CODE, 4 * PAYLOAD_BYTES_PER_TRANSFER);
        let ours = chain(CODE, 3, 10);
        let mut page = vec![ours[0]];
        page.extend(chain(CODE + 1, 2, 20));
        page.extend_from_slice(&ours[1..]);
        page.extend(chain(CODE - 1, 1, 30));
        assert_eq!(ids(&reassembler.consume(&page, &malformed)), vec![vec![10, 11, 12]]);
        assert_eq!((reassembler.timestamp(), malformed.load(Ordering::Relaxed)), (30, 0));
    }

    #[test]
    fn a_chain_longer_than_the_largest_record_is_dropped_and_counted() {
        let malformed = AtomicU64::new(0);
        // Two payload transfers at most: a header and two hold 56 bytes; up to
        // four transfers are held before one more proves a chain too long.
        let mut reassembler = ChainReassembler::new(CODE, 2 * PAYLOAD_BYTES_PER_TRANSFER);
        let longest = chain(CODE, 4, 10);
        assert_eq!(
            ids(&reassembler.consume(&longest, &malformed)),
            vec![vec![10, 11, 12, 13]]
        );
        assert_eq!(malformed.load(Ordering::Relaxed), 0);
        // Ten transfers: dropped after four and again after four more; its
        // last two come out as a chain of their own, which no log decodes.
        let long = chain(CODE, 10, 100);
        assert_eq!(ids(&reassembler.consume(&long, &malformed)), vec![vec![108, 109]]);
        assert_eq!(malformed.load(Ordering::Relaxed), 2);
        // The next chain is read whole.
        assert_eq!(
            ids(&reassembler.consume(&chain(CODE, 2, 200), &malformed)),
            vec![vec![200, 201]]
        );
        assert_eq!(malformed.load(Ordering::Relaxed), 2);
    }
}
