//! The one bounded map of recent lease ids both backends remember things by:
//! the memory backend's denied (failed) leases, the TigerBeetle backend's denied
//! leases and its lease cache. Bounded by count, oldest first out, optionally
//! forgotten after a retention; evictions are counted for metrics.

use std::collections::hash_map::Entry;
use std::collections::VecDeque;

/// foldhash: several times faster than SipHash on 128-bit ids, with a random
/// per-process seed so chosen ids cannot force collisions cheaply.
type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// How many stale slots the insertion order may hold beyond twice the live
/// entries before it is compacted: compaction is O(entries), so it runs at
/// most once per this many insertions at small sizes.
const STALE_SLOTS_SLACK: usize = 64;

/// A bounded map from lease id to `V`, in insertion order. Entries are kept for
/// at least the retention the caller passes to [`RecentIds::expire`], unless the
/// bound forces the oldest out first; those evictions are counted.
#[derive(Debug)]
pub struct RecentIds<V> {
    entries_max: usize,
    entries: FastMap<u128, (u64, V)>,
    /// (id, since): insertion order, so the front is always the oldest.
    order: VecDeque<(u128, u64)>,
    evicted_total: u64,
}

impl<V> RecentIds<V> {
    /// An empty map for at most `entries_max` ids (at least 1).
    pub fn new(entries_max: usize) -> Self {
        assert!(entries_max >= 1, "room for one id at least");
        Self {
            entries_max,
            entries: FastMap::default(),
            order: VecDeque::new(),
            evicted_total: 0,
        }
    }

    /// The value remembered for `id`.
    pub fn get(&self, id: u128) -> Option<&V> {
        self.entries.get(&id).map(|(_, v)| v)
    }

    /// Forgets `id` now (not an eviction); its slot in the order goes stale.
    pub fn remove(&mut self, id: u128) -> Option<V> {
        self.entries.remove(&id).map(|(_, v)| v)
    }

    /// Replaces the value of `id` in place, keeping its age, or inserts it at
    /// `now_unix_ms` when it is not remembered (any more). A later state of the
    /// same lease thus costs no second slot in the insertion order.
    pub fn update(&mut self, id: u128, now_unix_ms: u64, value: V) {
        match self.entries.get_mut(&id) {
            Some(entry) => entry.1 = value,
            None => self.insert(id, now_unix_ms, value),
        }
    }

    /// Remembers `id` from `now_unix_ms` on, evicting the oldest when full.
    pub fn insert(&mut self, id: u128, now_unix_ms: u64, value: V) {
        if let Some(entry) = self.entries.get_mut(&id) {
            if entry.0 == now_unix_ms {
                // Same id, same instant: its slot in `order` is already right.
                entry.1 = value;
                return;
            }
        }
        if self.entries.len() >= self.entries_max && !self.entries.contains_key(&id) {
            self.evict_oldest();
        }
        self.entries.insert(id, (now_unix_ms, value));
        self.order.push_back((id, now_unix_ms));
        if self.order.len() > 2 * self.entries.len() + STALE_SLOTS_SLACK {
            // Re-inserted and removed ids left slots behind; drop those.
            let entries = &self.entries;
            self.order
                .retain(|(id, since)| entries.get(id).is_some_and(|(s, _)| s == since));
        }
    }

    /// Forgets ids remembered for `retention_ms` or longer at `now_unix_ms`.
    pub fn expire(&mut self, now_unix_ms: u64, retention_ms: u64) {
        while let Some(&(id, since)) = self.order.front() {
            if since.saturating_add(retention_ms) > now_unix_ms {
                break;
            }
            self.order.pop_front();
            self.remove_if_since(id, since);
        }
    }

    /// Forgets the oldest id now (not an eviction: the caller chose to make
    /// room); `None` when the map is empty. Stale slots it passes are dropped
    /// for good, so a run of calls costs O(1) each, amortized.
    pub fn remove_oldest(&mut self) -> Option<u128> {
        while let Some((id, since)) = self.order.pop_front() {
            if self.remove_if_since(id, since) {
                return Some(id);
            }
        }
        None
    }

    fn evict_oldest(&mut self) {
        while let Some((id, since)) = self.order.pop_front() {
            if self.remove_if_since(id, since) {
                self.evicted_total += 1;
                return;
            }
        }
    }

    /// Removes `id` if its entry is the one inserted at `since` (a re-inserted id
    /// leaves an older slot in `order`).
    fn remove_if_since(&mut self, id: u128, since: u64) -> bool {
        match self.entries.entry(id) {
            Entry::Occupied(entry) if entry.get().0 == since => {
                entry.remove();
                true
            }
            _ => false,
        }
    }

    /// Every id remembered with the time it was remembered from, oldest first:
    /// what a snapshot saves.
    pub fn iter_oldest_first(&self) -> impl Iterator<Item = (u128, u64)> + '_ {
        self.order
            .iter()
            .copied()
            .filter(|(id, since)| self.entries.get(id).is_some_and(|(s, _)| s == since))
    }

    /// Ids remembered now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no id is remembered.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Ids forgotten early because the map was full.
    pub fn evicted_total(&self) -> u64 {
        self.evicted_total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_kept_for_the_retention_then_forgotten() {
        let mut r = RecentIds::new(10);
        r.insert(1, 100, 'a');
        r.insert(2, 150, 'b');
        r.expire(199, 100);
        assert_eq!((r.get(1), r.get(2)), (Some(&'a'), Some(&'b')));
        r.expire(200, 100);
        assert_eq!((r.get(1), r.get(2)), (None, Some(&'b')));
        r.expire(10_000, 100);
        assert_eq!(r.len(), 0);
        assert_eq!(r.evicted_total(), 0);
    }

    #[test]
    fn the_bound_evicts_the_oldest_and_counts_it() {
        let mut r = RecentIds::new(2);
        r.insert(1, 0, ());
        r.insert(2, 1, ());
        r.insert(3, 2, ());
        assert!(r.get(1).is_none() && r.get(2).is_some() && r.get(3).is_some());
        assert_eq!(r.evicted_total(), 1);
        r.insert(3, 5, ());
        assert_eq!(r.len(), 2, "re-inserting an id takes no new room");
        r.expire(6, 3);
        assert!(r.get(2).is_none());
        assert!(r.get(3).is_some(), "the re-inserted id counts from its new time");
    }

    #[test]
    fn removed_and_updated_ids_keep_the_order_exact_and_bounded() {
        let mut r = RecentIds::new(2);
        r.insert(1, 0, 'a');
        r.insert(2, 1, 'b');
        r.update(1, 9, 'A');
        assert_eq!(r.get(1), Some(&'A'), "an update replaces the value");
        r.insert(3, 2, 'c');
        assert!(r.get(1).is_none(), "an update keeps the age: 1 is still the oldest");
        assert_eq!(r.remove(2), Some('b'));
        r.update(4, 3, 'd');
        assert_eq!((r.len(), r.evicted_total()), (2, 1), "a removal is not an eviction");
        r.remove(3);
        r.remove(4);
        for i in 10..10_000u128 {
            r.insert(i, i as u64, 'x');
            r.remove(i);
        }
        assert!(
            r.order.len() <= 2 * r.len() + STALE_SLOTS_SLACK + 1,
            "churn leaves no unbounded order"
        );
        assert_eq!((r.len(), r.evicted_total()), (0, 1));
    }

    #[test]
    fn the_oldest_is_removed_on_demand_past_stale_slots_without_counting() {
        let mut r = RecentIds::new(4);
        for id in 1..=3 {
            r.insert(id, id as u64, ());
        }
        r.remove(1);
        r.insert(2, 10, ()); // 2 moves to the back
        assert_eq!(r.remove_oldest(), Some(3));
        assert_eq!(r.remove_oldest(), Some(2));
        assert_eq!(r.remove_oldest(), None);
        assert_eq!((r.len(), r.evicted_total(), r.order.len()), (0, 0, 0));
    }
}
