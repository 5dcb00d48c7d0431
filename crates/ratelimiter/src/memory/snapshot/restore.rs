//! Putting a snapshot back into a fresh backend's state: limits mapped by key,
//! leases by their holds, the settled and failed memories remembered again.

use crate::memory::lease_table::{LeaseHold, LiveLease};
use crate::memory::settled_leases::SettledLease;
use crate::memory::state::MemoryState;

use super::content::{MemorySnapshot, RestoreReport};
use super::error::SnapshotError;

impl MemoryState {
    /// Puts `snapshot` back at `now_unix_ms` into a state whose limits are
    /// defined (from the registry) and that has served nothing yet: units and
    /// debt of limits that still exist with the same kind, then settled and
    /// failed ids still within their retention, then live leases (a lease
    /// whose holds all ended is remembered as settled instead).
    pub(in crate::memory) fn restore(
        &mut self,
        snapshot: &MemorySnapshot,
        now_unix_ms: u64,
    ) -> Result<RestoreReport, SnapshotError> {
        if self.leases.len() > 0 || self.settled.len() > 0 || !self.failed.is_empty() {
            return Err(SnapshotError::NotFresh);
        }
        self.set_fingerprint_seed(snapshot.fingerprint_seed);
        let mut report = RestoreReport::default();
        let map: Vec<Option<u32>> = snapshot
            .limits
            .iter()
            .map(|saved| {
                let &i = self.index.get(&saved.key)?;
                (self.limits[i as usize].kind() == saved.kind).then_some(i)
            })
            .collect();
        for (saved, i) in snapshot.limits.iter().zip(&map) {
            let Some(i) = *i else {
                report.limits_dropped += 1;
                continue;
            };
            let limit = &mut self.limits[i as usize];
            limit.expire(now_unix_ms);
            if let Some((level, refilled_at_unix_ms)) = saved.bucket {
                limit.restore_bucket(level, refilled_at_unix_ms);
                report.units_held = report.units_held.saturating_add(limit.in_use());
            }
            for &(at, units) in saved.holds.iter().filter(|&&(at, _)| at > now_unix_ms) {
                if limit.can_hold(at) {
                    limit.hold(at, units);
                    report.units_held = report.units_held.saturating_add(units);
                }
            }
            limit.add_debt(saved.debt);
            limit.owe_until(saved.owed_until_unix_ms);
            *limit.streak_mut() = saved.streak;
        }
        for group in &snapshot.settled {
            if group.settled_at_unix_ms.saturating_add(self.retention_ms) <= now_unix_ms {
                continue;
            }
            for entry in &group.entries {
                let id = u128::from(entry[0]) | (u128::from(entry[1]) << 64);
                if self.settled.get(id).is_none() {
                    let lease = SettledLease {
                        reserved_at_unix_ms: entry[2],
                        fingerprint: entry[3],
                    };
                    self.settled
                        .insert(id, lease, group.settled_at_unix_ms, self.retention_ms);
                    report.settled_remembered += 1;
                }
            }
        }
        for &(id, failed_at_unix_ms) in &snapshot.failed {
            if failed_at_unix_ms.saturating_add(self.retention_ms) > now_unix_ms {
                self.failed.insert(id, failed_at_unix_ms, ());
                report.failed_remembered += 1;
            }
        }
        for (id, lease) in snapshot.leases_oldest_first() {
            self.restore_lease(*id, lease, &map, now_unix_ms, &mut report);
        }
        Ok(report)
    }

    /// Puts back one live lease with its holds mapped to this state's limits.
    fn restore_lease(
        &mut self,
        id: u128,
        saved: &LiveLease,
        map: &[Option<u32>],
        now_unix_ms: u64,
        report: &mut RestoreReport,
    ) {
        if self.leases.get(id).is_some() || self.settled.get(id).is_some() {
            return;
        }
        let mut holds = Vec::with_capacity(saved.holds().len());
        for hold in saved.holds() {
            let Some(limit) = map[hold.limit as usize] else {
                report.leases_dropped += 1;
                return;
            };
            holds.push(LeaseHold { limit, ..*hold });
        }
        holds.sort_unstable_by_key(|h| h.limit);
        let lease = LiveLease::new(saved.reserved_at_unix_ms, &holds);
        if holds.iter().all(|h| h.expires_at_unix_ms <= now_unix_ms) {
            self.settle(id, &lease, now_unix_ms);
            report.leases_settled += 1;
            return;
        }
        if self.leases.crowding(None).is_some() {
            // A smaller `leases_max` than the writer's: the lease that ends
            // first goes, in the open (counted, and logged by the restore).
            let (evicted_id, evicted) = (self.leases.pop_ended(now_unix_ms))
                .or_else(|| self.leases.pop_first_ending_anyway())
                .expect("a full table holds a lease");
            self.count_restore_eviction(evicted_id, &evicted, now_unix_ms);
            report.leases_evicted += 1;
            report.leases_live -= 1;
        }
        for hold in lease.holds().iter().filter(|h| h.expires_at_unix_ms > now_unix_ms) {
            (self.limits[hold.limit as usize]).hold_in_flight(hold.expires_at_unix_ms, hold.amount);
        }
        self.leases.insert(id, lease, None);
        report.leases_live += 1;
    }
}
