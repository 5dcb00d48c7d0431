//! Live leases: what each allowed, not yet completed lease holds, so Complete
//! can release and reconcile it. Bounded; the oldest lease goes first.

use std::collections::VecDeque;

use super::stack_vec::StackVec;
use super::FastMap;

/// Holds kept inside the lease record: an LLM call needs four (rpm, tpm,
/// concurrency, budget), so the common lease costs no allocation.
pub const HOLDS_INLINE: usize = 4;

/// Index of a limit inside the memory backend (limits are never removed).
pub type LimitIndex = u32;

/// One requirement of a live lease.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeaseHold {
    /// The limit held.
    pub limit: LimitIndex,
    /// The amount the request asked for: compared on an idempotent retry.
    pub amount: u64,
    /// When the hold ends: the instant it is recorded under in the limit.
    pub expires_at_unix_ms: u64,
}

/// The holds of one lease: up to [`HOLDS_INLINE`] in place, more on the heap.
#[derive(Debug, Clone)]
enum LeaseHolds {
    Inline(StackVec<LeaseHold, HOLDS_INLINE>),
    Spilled(Box<[LeaseHold]>),
}

/// An allowed lease that has not completed.
#[derive(Debug, Clone)]
pub struct LiveLease {
    /// When it was granted: answered again on an idempotent retry.
    pub reserved_at_unix_ms: u64,
    /// Its holds, sorted by limit so two requirement lists compare as sets.
    holds: LeaseHolds,
    /// Insertion number, telling a stale slot of the age order from a live one.
    sequence: u64,
}

impl LiveLease {
    /// A lease granted at `reserved_at_unix_ms` with `holds` sorted by limit.
    pub fn new(reserved_at_unix_ms: u64, holds: &[LeaseHold]) -> Self {
        debug_assert!(
            holds.windows(2).all(|w| w[0].limit < w[1].limit),
            "holds sorted by limit"
        );
        let holds = if holds.len() <= HOLDS_INLINE {
            let mut inline = StackVec::new();
            holds.iter().for_each(|&h| inline.push(h));
            LeaseHolds::Inline(inline)
        } else {
            LeaseHolds::Spilled(holds.into())
        };
        Self {
            reserved_at_unix_ms,
            holds,
            sequence: 0,
        }
    }

    /// The holds, sorted by limit.
    pub fn holds(&self) -> &[LeaseHold] {
        match &self.holds {
            LeaseHolds::Inline(inline) => inline.as_slice(),
            LeaseHolds::Spilled(spilled) => spilled,
        }
    }

    /// Its insertion number in its table: a lower one is older, evicted first.
    pub fn age(&self) -> u64 {
        self.sequence
    }

    /// The hold on `limit`, if the lease has one.
    pub fn hold(&self, limit: LimitIndex) -> Option<&LeaseHold> {
        let holds = self.holds();
        holds.binary_search_by_key(&limit, |h| h.limit).ok().map(|i| &holds[i])
    }
}

/// Live leases by id, at most `leases_max`, evicting the oldest when full.
#[derive(Debug)]
pub struct LeaseTable {
    leases_max: usize,
    leases: FastMap<u128, LiveLease>,
    /// Lease ids by age. Completed leases leave their slot behind; the slots are
    /// compacted when stale ones outnumber live ones, so this stays O(live).
    age_order: VecDeque<(u128, u64)>,
    next_sequence: u64,
}

impl LeaseTable {
    /// An empty table for at most `leases_max` leases (at least 1).
    pub fn new(leases_max: usize) -> Self {
        assert!(leases_max >= 1, "the lease table needs room for one lease");
        Self {
            leases_max,
            leases: FastMap::default(),
            age_order: VecDeque::new(),
            next_sequence: 0,
        }
    }

    /// The live lease `id`.
    pub fn get(&self, id: u128) -> Option<&LiveLease> {
        self.leases.get(&id)
    }

    /// The number of live leases.
    pub fn len(&self) -> usize {
        self.leases.len()
    }

    /// Every live lease, in no order: what a snapshot copies. A walk of the
    /// map's memory in order, several times faster than following the age
    /// order's random lookups; [`LiveLease::age`] sorts them afterwards.
    pub fn iter(&self) -> impl Iterator<Item = (u128, &LiveLease)> + '_ {
        self.leases.iter().map(|(&id, lease)| (id, lease))
    }

    /// Adds a lease that is not in the table; returns the oldest one when it had
    /// to make room.
    pub fn insert(&mut self, id: u128, mut lease: LiveLease) -> Option<(u128, LiveLease)> {
        assert!(!self.leases.contains_key(&id), "lease inserted twice");
        let evicted = if self.leases.len() >= self.leases_max {
            self.pop_oldest()
        } else {
            None
        };
        lease.sequence = self.next_sequence;
        self.next_sequence += 1;
        self.age_order.push_back((id, lease.sequence));
        self.leases.insert(id, lease);
        evicted
    }

    /// Removes and returns the live lease `id`.
    pub fn remove(&mut self, id: u128) -> Option<LiveLease> {
        let lease = self.leases.remove(&id)?;
        if self.age_order.len() > 2 * self.leases.len() + 64 {
            let leases = &self.leases;
            self.age_order
                .retain(|(id, sequence)| leases.get(id).is_some_and(|l| l.sequence == *sequence));
        }
        Some(lease)
    }

    fn pop_oldest(&mut self) -> Option<(u128, LiveLease)> {
        while let Some((id, sequence)) = self.age_order.pop_front() {
            if self.leases.get(&id).is_some_and(|l| l.sequence == sequence) {
                return self.leases.remove(&id).map(|lease| (id, lease));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(at: u64) -> LiveLease {
        let hold = LeaseHold {
            limit: 0,
            amount: 1,
            expires_at_unix_ms: at + 10,
        };
        LiveLease::new(at, &[hold])
    }

    #[test]
    fn holds_beyond_the_inline_room_spill_to_the_heap() {
        let holds: Vec<LeaseHold> = (0..9)
            .map(|limit| LeaseHold {
                limit,
                amount: u64::from(limit) + 1,
                expires_at_unix_ms: 5,
            })
            .collect();
        for n in [0, 1, HOLDS_INLINE, HOLDS_INLINE + 1, 9] {
            let lease = LiveLease::new(0, &holds[..n]);
            assert_eq!(lease.holds(), &holds[..n]);
            assert_eq!(lease.hold(3).map(|h| h.amount), (n > 3).then_some(4));
        }
    }

    #[test]
    fn the_oldest_live_lease_is_evicted_when_full() {
        let mut t = LeaseTable::new(2);
        assert!(t.insert(1, lease(1)).is_none());
        assert!(t.insert(2, lease(2)).is_none());
        assert!(t.remove(1).is_some());
        assert!(t.insert(3, lease(3)).is_none());
        let (id, evicted) = t.insert(4, lease(4)).unwrap();
        assert_eq!((id, evicted.reserved_at_unix_ms), (2, 2));
        assert_eq!(t.len(), 2);
        assert!(t.get(3).is_some() && t.get(4).is_some());
    }

    #[test]
    fn stale_age_slots_stay_bounded() {
        let mut t = LeaseTable::new(10);
        for id in 0..10_000u128 {
            t.insert(id, lease(id as u64));
            t.remove(id);
        }
        assert!(t.age_order.len() <= 2 * t.len() + 65);
        t.insert(5, lease(0));
        assert!(t.remove(5).is_some(), "a reused id is live again");
    }
}
