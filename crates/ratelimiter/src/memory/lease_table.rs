//! Live leases: what each allowed, not yet completed lease holds, so Complete
//! can release and reconcile it. Bounded as a whole and per owner; a lease is
//! never pushed out while a hold of it is in force.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::fast_map::FastMap;
use super::stack_vec::StackVec;

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
    /// Insertion number, telling a stale slot of the end order from a live one.
    sequence: u64,
    /// The tag of its owner ([`crate::LeaseOwner::tag`]); `None`: no owner.
    owner: Option<u64>,
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
            owner: None,
        }
    }

    /// The holds, sorted by limit.
    pub fn holds(&self) -> &[LeaseHold] {
        match &self.holds {
            LeaseHolds::Inline(inline) => inline.as_slice(),
            LeaseHolds::Spilled(spilled) => spilled,
        }
    }

    /// Its insertion number in its table: a lower one is older.
    pub fn age(&self) -> u64 {
        self.sequence
    }

    /// The hold on `limit`, if the lease has one.
    pub fn hold(&self, limit: LimitIndex) -> Option<&LeaseHold> {
        let holds = self.holds();
        holds.binary_search_by_key(&limit, |h| h.limit).ok().map(|i| &holds[i])
    }

    /// When its last hold ends: from then on the lease holds nothing.
    pub fn ends_at_unix_ms(&self) -> u64 {
        self.holds().iter().map(|h| h.expires_at_unix_ms).max().unwrap_or(0)
    }
}

/// Why the table has no room for a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Crowded {
    /// The owner holds its whole share: this many leases.
    OwnerShare(usize),
    /// Every slot holds a lease still in force: this many.
    Full(usize),
}

/// Live leases by id: at most `leases_max`, and at most `owner_leases_max` of
/// one owner. A lease is never pushed out while one of its holds is in force;
/// when there is no room, a lease whose holds have all ended goes first (the
/// earliest to end), else the new lease is refused.
#[derive(Debug)]
pub struct LeaseTable {
    leases_max: usize,
    owner_leases_max: usize,
    leases: FastMap<u128, LiveLease>,
    /// Live leases per owner tag; owners holding none are removed.
    owners: FastMap<u64, usize>,
    /// Lease ids by the instant their last hold ends, earliest on top.
    /// Completed leases leave their entry behind; the entries are compacted
    /// when stale ones outnumber live ones, so this stays O(live).
    ends: BinaryHeap<Reverse<(u64, u64, u128)>>,
    next_sequence: u64,
}

impl LeaseTable {
    /// An empty table for at most `leases_max` leases, `owner_leases_max` of
    /// one owner (both at least 1).
    pub fn new(leases_max: usize, owner_leases_max: usize) -> Self {
        assert!(leases_max >= 1, "the lease table needs room for one lease");
        assert!(owner_leases_max >= 1, "an owner needs room for one lease");
        Self {
            leases_max,
            owner_leases_max,
            leases: FastMap::default(),
            owners: FastMap::default(),
            ends: BinaryHeap::new(),
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

    /// The live leases of the owner tagged `owner`.
    pub fn owned_by(&self, owner: u64) -> usize {
        self.owners.get(&owner).copied().unwrap_or(0)
    }

    /// Every live lease, in no order: what a snapshot copies. A walk of the
    /// map's memory in order, several times faster than following the age
    /// order's random lookups; [`LiveLease::age`] sorts them afterwards.
    pub fn iter(&self) -> impl Iterator<Item = (u128, &LiveLease)> + '_ {
        self.leases.iter().map(|(&id, lease)| (id, lease))
    }

    /// `Some` when a lease of `owner` would find no room now.
    pub fn crowding(&self, owner: Option<u64>) -> Option<Crowded> {
        if let Some(held) = owner.map(|o| self.owned_by(o)).filter(|&n| n >= self.owner_leases_max) {
            return Some(Crowded::OwnerShare(held));
        }
        (self.leases.len() >= self.leases_max).then_some(Crowded::Full(self.leases.len()))
    }

    /// Adds a lease that is not in the table, for `owner`; the caller made
    /// room ([`LeaseTable::crowding`] is `None` for it).
    pub fn insert(&mut self, id: u128, mut lease: LiveLease, owner: Option<u64>) {
        assert!(!self.leases.contains_key(&id), "lease inserted twice");
        debug_assert!(self.leases.len() < self.leases_max, "inserted without room");
        lease.sequence = self.next_sequence;
        lease.owner = owner;
        self.next_sequence += 1;
        if let Some(owner) = owner {
            *self.owners.entry(owner).or_insert(0) += 1;
        }
        self.ends.push(Reverse((lease.ends_at_unix_ms(), lease.sequence, id)));
        self.leases.insert(id, lease);
    }

    /// Removes and returns the live lease `id`.
    pub fn remove(&mut self, id: u128) -> Option<LiveLease> {
        let lease = self.leases.remove(&id)?;
        if let Some(owner) = lease.owner {
            let held = self.owners.get_mut(&owner).expect("an owned lease is counted");
            *held -= 1;
            if *held == 0 {
                self.owners.remove(&owner);
            }
        }
        if self.ends.len() > 2 * self.leases.len() + 64 {
            let leases = &self.leases;
            self.ends
                .retain(|Reverse((_, sequence, id))| leases.get(id).is_some_and(|l| l.sequence == *sequence));
        }
        Some(lease)
    }

    /// Removes and returns the live lease that ends first, when all its holds
    /// ended by `now_unix_ms` (it holds nothing any more).
    pub fn pop_ended(&mut self, now_unix_ms: u64) -> Option<(u128, LiveLease)> {
        self.pop_first_ending(|ends_at_unix_ms| ends_at_unix_ms <= now_unix_ms)
    }

    /// Removes and returns the live lease that ends first, whether or not it
    /// ended: only for a restore into a smaller table, never for a grant.
    pub fn pop_first_ending_anyway(&mut self) -> Option<(u128, LiveLease)> {
        self.pop_first_ending(|_| true)
    }

    fn pop_first_ending(&mut self, take: impl Fn(u64) -> bool) -> Option<(u128, LiveLease)> {
        while let Some(&Reverse((ends_at_unix_ms, sequence, id))) = self.ends.peek() {
            if self.leases.get(&id).is_none_or(|l| l.sequence != sequence) {
                self.ends.pop();
                continue;
            }
            if !take(ends_at_unix_ms) {
                return None;
            }
            self.ends.pop();
            return self.remove(id).map(|lease| (id, lease));
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
    fn a_full_table_takes_the_place_of_an_ended_lease_only() {
        let mut t = LeaseTable::new(2, 2);
        t.insert(1, lease(1), None);
        t.insert(2, lease(30), None);
        assert_eq!(t.crowding(None), Some(Crowded::Full(2)));
        assert!(t.pop_ended(10).is_none(), "lease 1 holds until 11");
        let (id, ended) = t.pop_ended(11).unwrap();
        assert_eq!((id, ended.reserved_at_unix_ms), (1, 1));
        assert!(t.pop_ended(11).is_none(), "lease 2 holds until 40");
        assert_eq!(t.crowding(None), None);
        t.insert(3, lease(5), None);
        assert!(t.get(2).is_some() && t.get(3).is_some());
    }

    #[test]
    fn an_owner_is_bounded_by_its_share_and_others_are_not() {
        let mut t = LeaseTable::new(10, 2);
        t.insert(1, lease(1), Some(7));
        assert_eq!(t.crowding(Some(7)), None);
        t.insert(2, lease(1), Some(7));
        assert_eq!(t.crowding(Some(7)), Some(Crowded::OwnerShare(2)));
        assert_eq!(t.crowding(Some(8)), None);
        assert_eq!(t.crowding(None), None);
        t.remove(1);
        assert_eq!((t.owned_by(7), t.crowding(Some(7))), (1, None));
        t.remove(2);
        assert!(t.owners.is_empty(), "an owner without leases is forgotten");
    }

    #[test]
    fn stale_end_entries_stay_bounded() {
        let mut t = LeaseTable::new(10, 10);
        for id in 0..10_000u128 {
            t.insert(id, lease(id as u64), Some(1));
            t.remove(id);
        }
        assert!(t.ends.len() <= 2 * t.len() + 65);
        t.insert(5, lease(0), None);
        assert!(t.remove(5).is_some(), "a reused id is live again");
    }
}
