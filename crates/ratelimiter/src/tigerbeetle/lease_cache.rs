//! The lease cache: what Complete needs to know about a reservation (when it was made,
//! what it holds), kept in memory only and bounded (docs/tigerbeetle-backend.md, "The
//! lease cache"). A lease that is not here is read back from the cluster by its
//! Complete. Completed leases stay until room is needed, so retries of their Reserve
//! or Complete are answered without another round trip.
//!
//! Shared fairly, as the memory backend's lease table (docs/memory-backend.md,
//! "Shares of the lease table"): each owner (a client token, a gateway tenant) keeps
//! at most its share of the cache in live leases, and a reserve past it is refused;
//! room is made by dropping completed leases first, then live ones whose holds all
//! ended in the cluster, never a lease still in force: a reserve that finds only
//! those is refused too. So no owner's flood pushes out another's live leases.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use crate::base::recent_ids::RecentIds;

use crate::base::id::LeaseId;
use crate::memory::TOO_MANY_LEASES_RETRY_MS;
use crate::model::definition::LimitKind;
use crate::model::error::LimiterError;
use crate::model::key::LimitKey;
use crate::model::owner::LeaseOwner;

/// One reserved requirement as it was sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldRequirement {
    /// The limit.
    pub key: LimitKey,
    /// The units reserved.
    pub amount: u64,
    /// The limit's kind when reserved: concurrency holds are voided on Complete,
    /// rolling ones reconciled.
    pub kind: LimitKind,
    /// The pending transfer's timeout in seconds (window plus margin rounded up,
    /// or hold timeout), so the reconciled reservation ends when the original
    /// one would have.
    pub timeout_seconds: u64,
    /// The id of its pending transfer, which a void names: derived from the
    /// lease and the requirement's index ([`super::ids::reservation_id`]), or,
    /// for a lease reserved by an earlier version, from the lease and the key.
    pub reservation_id: u128,
}

/// A fingerprint of a set of (key, amount) requirements, independent of their
/// order: what a completed lease keeps to tell a retry from a reuse.
pub fn fingerprint<'a>(requirements: impl Iterator<Item = (&'a LimitKey, u64)>) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut sorted: Vec<(&LimitKey, u64)> = requirements.collect();
    sorted.sort_unstable();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    sorted.hash(&mut hasher);
    hasher.finish()
}

/// What is remembered of one lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRecord {
    /// When the reservation was made (or attempted, for an unknown outcome).
    pub reserved_at_unix_ms: u64,
    /// The cluster's time stamp of the lease's latest reservation, in ns,
    /// for a lease read back from the cluster (reserved by another process):
    /// Complete then measures the window's elapsed time on the cluster's
    /// clock, not against another process's `reserved_at_unix_ms`. `None` for
    /// a lease this process reserved, timed by its own monotonic clock.
    pub reserved_at_cluster_ns: Option<u64>,
    /// The requirements in request order; emptied once completed, since only
    /// the fingerprint is needed from then on.
    pub held: Vec<HeldRequirement>,
    /// The fingerprint of the requirements ([`fingerprint`]): a retry of the
    /// lease must ask for exactly the same, in any order.
    pub fingerprint: u64,
    /// True once TigerBeetle confirmed the reservation; false while its outcome
    /// is unknown (a timeout), when Complete still voids by id to be safe.
    pub confirmed: bool,
    /// True once Complete ran: a second Complete changes nothing, and the same
    /// lease reserved again is answered from here without reserving anything.
    pub completed: bool,
}

/// A live lease: its owner's tag and when its last hold ends in the cluster.
#[derive(Debug)]
struct Live {
    owner: Option<u64>,
    ends_at_unix_ms: u64,
    record: LeaseRecord,
}

/// Live and completed leases, at most `leases_max` in all.
#[derive(Debug)]
struct Leases {
    leases_max: usize,
    owner_leases_max: usize,
    live: HashMap<u128, Live>,
    /// (end of the last hold, id) of every live lease: the first ends first.
    ending: BTreeSet<(u64, u128)>,
    /// Live leases per owner tag; owners holding none are removed.
    owners: HashMap<u64, usize>,
    /// Completed leases, oldest first out.
    completed: RecentIds<LeaseRecord>,
    /// Live leases dropped while some of their holds were still in force.
    evicted_total: u64,
    /// Reserves refused for want of room (the owner's share, or a cache full
    /// of leases in force).
    refused_total: u64,
}

/// When the last hold of `record` ends in the cluster: its reservation time plus
/// its longest timeout (a record of no hold ends at once).
fn ends_at_unix_ms(record: &LeaseRecord) -> u64 {
    let longest_s = record.held.iter().map(|h| h.timeout_seconds).max().unwrap_or(0);
    record
        .reserved_at_unix_ms
        .saturating_add(longest_s.saturating_mul(1_000))
}

impl Leases {
    fn len(&self) -> usize {
        self.live.len() + self.completed.len()
    }

    fn take_live(&mut self, id: u128) -> Option<Live> {
        let live = self.live.remove(&id)?;
        self.ending.remove(&(live.ends_at_unix_ms, id));
        if let Some(owner) = live.owner {
            if let Some(count) = self.owners.get_mut(&owner) {
                *count -= 1;
                if *count == 0 {
                    self.owners.remove(&owner);
                }
            }
        }
        Some(live)
    }

    fn put_live(&mut self, id: u128, owner: Option<u64>, record: LeaseRecord) {
        let ends_at_unix_ms = ends_at_unix_ms(&record);
        self.ending.insert((ends_at_unix_ms, id));
        if let Some(owner) = owner {
            *self.owners.entry(owner).or_default() += 1;
        }
        self.live.insert(
            id,
            Live {
                owner,
                ends_at_unix_ms,
                record,
            },
        );
    }

    /// Drops the live leases whose holds all ended by `now_unix_ms`: nothing is
    /// left in the cluster for their Complete to release.
    fn drop_ended(&mut self, now_unix_ms: u64) {
        while let Some(&(ends_at, id)) = self.ending.first() {
            if ends_at > now_unix_ms {
                break;
            }
            self.take_live(id);
        }
    }

    /// Makes room for one more lease: the oldest completed lease goes first,
    /// else, when `force`, the live lease that ends first (counted). False when
    /// there is no room and nothing may go.
    fn make_room(&mut self, force: bool) -> bool {
        if self.len() < self.leases_max {
            return true;
        }
        if self.completed.remove_oldest().is_some() {
            return true;
        }
        if !force {
            return false;
        }
        if let Some(&(_, id)) = self.ending.first() {
            self.take_live(id);
            self.evicted_total += 1;
        }
        true
    }

    /// Keeps `record`: as live (for `owner`) or completed, forcing room.
    fn keep(&mut self, id: u128, owner: Option<u64>, record: LeaseRecord) {
        let owner = self.take_live(id).map_or(owner, |previous| previous.owner.or(owner));
        let since = record.reserved_at_unix_ms;
        if self.completed.remove(id).is_none() {
            self.make_room(true);
        }
        if record.completed {
            self.completed.insert(id, since, record);
        } else {
            self.put_live(id, owner, record);
        }
    }
}

/// The lease cache: live leases by owner share, completed ones for retries.
#[derive(Debug)]
pub struct LeaseCache {
    inner: Mutex<Leases>,
}

impl LeaseCache {
    /// A cache of at most `leases_max` leases, `owner_leases_max` of them live
    /// leases of one owner (both at least 1).
    pub fn new(leases_max: usize, owner_leases_max: usize) -> Self {
        assert!(leases_max >= 1 && owner_leases_max >= 1, "room for one lease");
        Self {
            inner: Mutex::new(Leases {
                leases_max,
                owner_leases_max,
                live: HashMap::new(),
                ending: BTreeSet::new(),
                owners: HashMap::new(),
                completed: RecentIds::new(leases_max),
                evicted_total: 0,
                refused_total: 0,
            }),
        }
    }

    fn locked(&self) -> std::sync::MutexGuard<'_, Leases> {
        self.inner.lock().expect("lease cache lock poisoned")
    }

    /// Remembers the live `record` of a reserve of `lease` for `owner`, before
    /// it is sent; refused, with nothing changed, when the owner holds its whole
    /// share of the cache in live leases, or when the cache holds only leases
    /// still in force. A lease already remembered is replaced in place.
    pub fn admit(
        &self,
        lease: LeaseId,
        owner: Option<&LeaseOwner>,
        record: LeaseRecord,
        now_unix_ms: u64,
    ) -> Result<(), LimiterError> {
        let id = lease.to_u128();
        let mut leases = self.locked();
        if leases.live.contains_key(&id) || leases.completed.get(id).is_some() {
            leases.keep(id, owner.map(LeaseOwner::tag), record);
            return Ok(());
        }
        leases.drop_ended(now_unix_ms);
        let tag = owner.map(LeaseOwner::tag);
        let held = tag.map_or(0, |t| leases.owners.get(&t).copied().unwrap_or(0));
        let message = if let (Some(owner), true) = (owner, held >= leases.owner_leases_max) {
            format!(
                "{} holds {held} live leases, its share of the lease cache ({} of {}); complete some first",
                owner.name(),
                leases.owner_leases_max,
                leases.leases_max
            )
        } else if !leases.make_room(false) {
            let live = leases.live.len();
            format!("the lease cache is full: its {live} leases are all in force; complete some first")
        } else {
            leases.put_live(id, tag, record);
            return Ok(());
        };
        leases.refused_total += 1;
        Err(LimiterError::TooManyLeases {
            retry_after_ms: TOO_MANY_LEASES_RETRY_MS,
            message,
        })
    }

    /// Remembers `record` for `lease`, replacing an older one (its owner kept),
    /// making room when needed: completed leases go first, then the live lease
    /// that ends first (an eviction).
    pub fn insert(&self, lease: LeaseId, record: LeaseRecord) {
        self.locked().keep(lease.to_u128(), None, record);
    }

    /// Replaces the record of `lease`, keeping its owner, or inserts it when it
    /// is not remembered (any more): a completed record moves the lease out of
    /// its owner's share.
    pub fn update(&self, lease: LeaseId, record: LeaseRecord) {
        self.insert(lease, record);
    }

    /// The record of `lease`, if remembered.
    pub fn get(&self, lease: LeaseId) -> Option<LeaseRecord> {
        let leases = self.locked();
        let id = lease.to_u128();
        match leases.live.get(&id) {
            Some(live) => Some(live.record.clone()),
            None => leases.completed.get(id).cloned(),
        }
    }

    /// Forgets `lease` (a reserve that sent nothing).
    pub fn remove(&self, lease: LeaseId) {
        let mut leases = self.locked();
        let id = lease.to_u128();
        if leases.take_live(id).is_none() {
            leases.completed.remove(id);
        }
    }

    /// How many leases are remembered.
    pub fn len(&self) -> usize {
        self.locked().len()
    }

    /// The live leases remembered for the owner tagged `owner`.
    pub fn live_of(&self, owner: u64) -> usize {
        self.locked().owners.get(&owner).copied().unwrap_or(0)
    }

    /// How many live leases were forgotten, holds still in force, to respect
    /// `leases_max` (never by a reserve: only when a lease read back from the
    /// cluster needed room).
    pub fn evicted(&self) -> u64 {
        self.locked().evicted_total
    }

    /// Reserves refused for want of room: the owner's share, or a cache full
    /// of leases in force.
    pub fn refused(&self) -> u64 {
        self.locked().refused_total
    }

    /// True when no lease is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(at: u64) -> LeaseRecord {
        LeaseRecord {
            reserved_at_unix_ms: at,
            reserved_at_cluster_ns: None,
            held: vec![HeldRequirement {
                key: LimitKey::new("k").unwrap(),
                amount: 1,
                kind: LimitKind::Rolling,
                timeout_seconds: 60,
                reservation_id: 1,
            }],
            fingerprint: 0,
            confirmed: true,
            completed: false,
        }
    }

    #[test]
    fn fingerprints_ignore_order_only() {
        let (a, b) = (LimitKey::new("a").unwrap(), LimitKey::new("b").unwrap());
        let ab = fingerprint([(&a, 1), (&b, 2)].into_iter());
        assert_eq!(ab, fingerprint([(&b, 2), (&a, 1)].into_iter()));
        assert_ne!(ab, fingerprint([(&a, 1), (&b, 3)].into_iter()));
        assert_ne!(ab, fingerprint([(&a, 1)].into_iter()));
    }

    fn completed(at: u64) -> LeaseRecord {
        LeaseRecord {
            held: Vec::new(),
            completed: true,
            ..record(at)
        }
    }

    fn id(i: u128) -> LeaseId {
        LeaseId::from_u128(i)
    }

    #[test]
    fn the_lease_ending_first_is_dropped_beyond_capacity() {
        let cache = LeaseCache::new(2, 2);
        cache.insert(id(1), record(1));
        cache.insert(id(2), record(2));
        cache.insert(id(3), record(3));
        assert_eq!(cache.len(), 2);
        assert!(cache.get(id(1)).is_none());
        assert_eq!(cache.evicted(), 1);
        assert_eq!(cache.get(id(2)).unwrap().reserved_at_unix_ms, 2);
        assert_eq!(cache.get(id(3)).unwrap().reserved_at_unix_ms, 3);
    }

    #[test]
    fn updates_keep_the_owner_and_completion_frees_the_share() {
        let cache = LeaseCache::new(8, 2);
        let web = LeaseOwner::new("gateway tenant web");
        cache.admit(id(1), Some(&web), record(1), 1).unwrap();
        for at in 10..20 {
            cache.update(id(1), record(at));
        }
        assert_eq!(cache.get(id(1)).unwrap().reserved_at_unix_ms, 19);
        assert_eq!(cache.live_of(web.tag()), 1, "an update is no second lease");
        cache.update(id(1), completed(20));
        assert_eq!(cache.live_of(web.tag()), 0);
        assert!(cache.get(id(1)).unwrap().completed);
        cache.remove(id(1));
        assert!(cache.is_empty());
    }

    #[test]
    fn an_owner_past_its_share_is_refused_and_crowds_out_no_one() {
        let cache = LeaseCache::new(8, 2);
        let (web, batch) = (LeaseOwner::new("client_tokens[0]"), LeaseOwner::new("client_tokens[1]"));
        cache.admit(id(1_000_000), Some(&batch), record(1), 1).unwrap();
        cache.admit(id(1), Some(&web), record(1), 1).unwrap();
        cache.admit(id(2), Some(&web), record(1), 1).unwrap();
        let refused = cache.admit(id(3), Some(&web), record(1), 1).unwrap_err();
        let LimiterError::TooManyLeases { message, .. } = refused else {
            panic!("{refused:?}")
        };
        assert!(message.contains("client_tokens[0] holds 2 live leases"), "{message}");
        assert!(cache.get(id(3)).is_none(), "a refused reserve changes nothing");
        // Its flood of reserve-and-complete fills the cache with completed
        // leases: they go first, the other owner's live lease stays.
        cache.update(id(1), completed(1));
        cache.update(id(2), completed(1));
        for i in 3..10_000 {
            cache.admit(id(i), Some(&web), record(2), 2).unwrap();
            cache.update(id(i), completed(2));
        }
        assert!(cache.get(id(1_000_000)).is_some_and(|r| !r.completed));
        assert_eq!((cache.evicted(), cache.refused()), (0, 1));
        assert_eq!(cache.live_of(batch.tag()), 1);
    }

    #[test]
    fn a_cache_of_leases_in_force_refuses_and_ended_leases_make_room() {
        let cache = LeaseCache::new(2, 2);
        cache.admit(id(1), None, record(0), 0).unwrap();
        cache.admit(id(2), None, record(0), 0).unwrap();
        let full = cache.admit(id(3), None, record(0), 0).unwrap_err();
        assert!(full.to_string().contains("all in force"), "{full}");
        assert!(cache.get(id(1)).is_some() && cache.get(id(2)).is_some());
        // Their holds end after 60 s: room again, nothing evicted.
        cache.admit(id(3), None, record(60_000), 60_000).unwrap();
        assert_eq!((cache.len(), cache.evicted()), (1, 0));
    }

    #[test]
    fn the_cache_stays_bounded_under_churn() {
        let cache = LeaseCache::new(4, 4);
        for i in 1..=10_000u128 {
            let lease = LeaseId::from_u128(i);
            cache.insert(lease, record(i as u64));
            cache.remove(lease);
        }
        assert!(cache.is_empty());
        assert_eq!(cache.evicted(), 0, "removed leases are not evictions");
    }
}
