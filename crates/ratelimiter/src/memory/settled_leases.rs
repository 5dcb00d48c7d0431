//! Leases that stopped being live (completed, or evicted from the lease table),
//! remembered so a retry of their reserve is answered idempotently
//! (`decisions.md` §3: allowed again at the original time, nothing reserved).

use super::FastMap;

/// What a retry of a settled lease's reserve needs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SettledLease {
    /// When it was granted: answered again.
    pub reserved_at_unix_ms: u64,
    /// A keyed hash of its requirements, to tell a retry that asks for
    /// something else (see [`super::state`]).
    pub fingerprint: u64,
}

/// One generation: the leases settled between two rotations.
#[derive(Debug)]
struct Generation {
    leases: FastMap<u128, SettledLease>,
    /// When its first lease settled; meaningless while empty.
    oldest_unix_ms: u64,
    /// When its last lease settled; meaningless while empty.
    newest_unix_ms: u64,
}

impl Generation {
    fn with_capacity(leases_max: usize) -> Self {
        Self {
            leases: FastMap::with_capacity_and_hasher(leases_max, Default::default()),
            oldest_unix_ms: 0,
            newest_unix_ms: 0,
        }
    }

    /// True when every lease in it settled `retention_ms` or longer before
    /// `now_unix_ms`, so forgetting it forgets nothing early.
    fn expired(&self, now_unix_ms: u64, retention_ms: u64) -> bool {
        self.leases.is_empty() || self.newest_unix_ms.saturating_add(retention_ms) <= now_unix_ms
    }
}

/// Settled leases by id, exact (a lookup never confuses two ids) and bounded.
///
/// Two generations of hash maps: leases settle into the current one, a lookup
/// checks both. The previous generation is cleared (keeping its allocation) and
/// the two swap when the current one's oldest lease settled `retention_ms` ago
/// (time), or when the current one holds half the bound (count). So a lease is
/// remembered for between one and two retentions after it settled unless the
/// bound rotates first, and in any case until at least half the bound of later
/// leases settled. Remembering a lease is one
/// hash map insertion and a lookup two probes; nothing is allocated after
/// [`SettledLeases::new`] and nothing is ordered, where an insertion-ordered map
/// with oldest-first eviction cost 17% of the hot path (BENCHMARKS.md).
#[derive(Debug)]
pub struct SettledLeases {
    /// Half the bound: the most leases one generation holds.
    generation_leases_max: usize,
    current: Generation,
    previous: Generation,
    evicted_total: u64,
}

impl SettledLeases {
    /// An empty memory for at most `leases_max` leases (at least 2, so each
    /// generation holds one). Both generations are allocated now: growing a
    /// large hash map later would rehash it under the backend's mutex.
    pub fn new(leases_max: usize) -> Self {
        assert!(leases_max >= 2, "room for one lease per generation at least");
        let generation_leases_max = leases_max / 2;
        Self {
            generation_leases_max,
            current: Generation::with_capacity(generation_leases_max),
            previous: Generation::with_capacity(generation_leases_max),
            evicted_total: 0,
        }
    }

    /// The settled lease `id`, if remembered.
    pub fn get(&self, id: u128) -> Option<SettledLease> {
        let found = self.current.leases.get(&id).or_else(|| self.previous.leases.get(&id));
        found.copied()
    }

    /// Remembers `lease` as `id`, settled at `now_unix_ms`, rotating the
    /// generations first when due; leases still within `retention_ms` that a
    /// rotation forgets are counted as evicted.
    pub fn insert(&mut self, id: u128, lease: SettledLease, now_unix_ms: u64, retention_ms: u64) {
        if let Some(remembered) = self.current.leases.get_mut(&id) {
            // Settled again (only after it was forgotten): keep the newest answer.
            *remembered = lease;
            return;
        }
        if self.rotation_due(now_unix_ms, retention_ms) {
            self.rotate(now_unix_ms, retention_ms);
        }
        let current = &mut self.current;
        if current.leases.is_empty() {
            current.oldest_unix_ms = now_unix_ms;
        }
        current.newest_unix_ms = current.newest_unix_ms.max(now_unix_ms);
        current.leases.insert(id, lease);
        debug_assert!(current.leases.len() <= self.generation_leases_max);
    }

    /// True when the current generation holds half the bound (count), or when
    /// its oldest lease has served `retention_ms` and every lease of the
    /// previous one has too (time: the second test only matters when instants
    /// arrive out of order, so a time rotation never forgets a lease early).
    fn rotation_due(&self, now_unix_ms: u64, retention_ms: u64) -> bool {
        let current = &self.current;
        if current.leases.len() >= self.generation_leases_max {
            return true;
        }
        let aged = current.oldest_unix_ms.saturating_add(retention_ms) <= now_unix_ms;
        !current.leases.is_empty() && aged && self.previous.expired(now_unix_ms, retention_ms)
    }

    /// Forgets the previous generation and makes the current one previous.
    ///
    /// Its leases count as evicted when its newest was still within
    /// `retention_ms`: all of them, an upper bound that is exact unless its
    /// oldest had already served its retention (only when the bound starts to
    /// bite after a quieter period). So the count is zero exactly when no lease
    /// was forgotten early.
    fn rotate(&mut self, now_unix_ms: u64, retention_ms: u64) {
        if !self.previous.expired(now_unix_ms, retention_ms) {
            self.evicted_total += self.previous.leases.len() as u64;
        }
        // Clearing keeps the allocation; for plain-data entries it only resets
        // the control bytes (one byte per slot).
        self.previous.leases.clear();
        std::mem::swap(&mut self.current, &mut self.previous);
    }

    /// Leases remembered now (an id settled again after it was forgotten may
    /// count twice until its older copy's generation is cleared).
    pub fn len(&self) -> usize {
        self.current.leases.len() + self.previous.leases.len()
    }

    /// Leases forgotten before their retention ended because of the bound.
    pub fn evicted_total(&self) -> u64 {
        self.evicted_total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(at: u64) -> SettledLease {
        SettledLease {
            reserved_at_unix_ms: at,
            fingerprint: at.wrapping_mul(7),
        }
    }

    #[test]
    fn leases_are_remembered_for_the_retention_then_forgotten() {
        let mut settled = SettledLeases::new(1_000);
        settled.insert(42, lease(5), 100, 50);
        settled.insert(43, lease(6), 149, 50);
        assert_eq!((settled.get(42), settled.get(44)), (Some(lease(5)), None));
        // 42 is older than the retention at 150: current rotates to previous.
        settled.insert(44, lease(7), 150, 50);
        assert_eq!(settled.get(42), Some(lease(5)), "previous is still answered");
        // At 199 the previous generation (newest 149) is expired, but the
        // current one (oldest 150) is not: no rotation yet.
        settled.insert(45, lease(8), 199, 50);
        assert_eq!(settled.len(), 4);
        settled.insert(46, lease(9), 250, 50);
        assert_eq!(
            (settled.get(42), settled.get(43)),
            (None, None),
            "forgotten past the retention"
        );
        assert_eq!((settled.get(44), settled.get(46)), (Some(lease(7)), Some(lease(9))));
        assert_eq!(settled.evicted_total(), 0, "nothing was forgotten early");
    }

    #[test]
    fn every_lease_of_a_large_run_within_the_retention_is_remembered_exactly() {
        // Far more leases than the old direct-mapped cache had slots (131,072
        // at the default), all within one retention.
        let leases = 300_000u128;
        let mut settled = SettledLeases::new(2 * leases as usize);
        for id in 1..=leases {
            settled.insert(id, lease(id as u64), id as u64 / 100, 60_000);
        }
        assert!((1..=leases).all(|id| settled.get(id) == Some(lease(id as u64))));
        assert_eq!(settled.get(leases + 1), None);
        assert_eq!(settled.evicted_total(), 0);
    }

    #[test]
    fn the_bound_rotates_early_and_counts_what_it_forgets() {
        let mut settled = SettledLeases::new(4);
        for id in 1..=4 {
            settled.insert(id, lease(id as u64), 0, 1_000);
        }
        assert!((1..=4).all(|id| settled.get(id).is_some()), "two generations of two");
        assert_eq!(settled.evicted_total(), 0);
        settled.insert(5, lease(5), 10, 1_000);
        assert_eq!(
            (settled.get(1), settled.get(2), settled.get(5)),
            (None, None, Some(lease(5)))
        );
        assert_eq!(settled.evicted_total(), 2);
        assert_eq!(settled.len(), 3);
        // The bound rotates again, this time past the retention: not counted.
        settled.insert(6, lease(6), 1_000, 1_000);
        settled.insert(7, lease(7), 1_000, 1_000);
        assert_eq!(
            (settled.get(3), settled.get(5), settled.get(7)),
            (None, Some(lease(5)), Some(lease(7)))
        );
        assert_eq!(settled.evicted_total(), 2);
    }

    #[test]
    fn settling_an_id_again_takes_no_new_room() {
        let mut settled = SettledLeases::new(2);
        settled.insert(1, lease(1), 0, 100);
        settled.insert(1, lease(2), 5, 100);
        assert_eq!((settled.get(1), settled.len()), (Some(lease(2)), 1));
        assert_eq!(settled.evicted_total(), 0);
    }
}
