//! What a snapshot holds: every limit's held units, the live leases and the
//! settled- and failed-lease memories, copied from the backend's state under
//! its lock, and moved by a wall-clock step between two processes.

use crate::base::clock::BootInstant;
use crate::memory::lease_table::{LeaseHold, LiveLease};
use crate::memory::settled_leases::SettledGeneration;
use crate::memory::state::MemoryState;
use crate::model::definition::LimitKind;
use crate::model::key::LimitKey;
use crate::model::retry::Streak;

/// One limit's held units, as saved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct LimitSnapshot {
    /// Names the limit in the next process, whose indices differ.
    pub(super) key: LimitKey,
    /// A limit redefined with another kind meanwhile is not this one.
    pub(super) kind: LimitKind,
    /// Overage recorded as debt, a report that should survive too.
    pub(super) debt: u64,
    /// Until when an `overage: owe` limit refuses every reservation (0: it
    /// never owed), so a restart does not admit past a budget that owes.
    pub(super) owed_until_unix_ms: u64,
    /// The denial streak, so a restart does not reset a contended key's
    /// backoff and let every waiting client retry at once.
    pub(super) streak: Streak,
    /// (expires_at_unix_ms, units), earliest first: held units, leased or not
    /// (evicted leases' and reconciled overage's units are held too). Empty for a bucket.
    pub(super) holds: Vec<(u64, u64)>,
    /// A bucket's (level, instant of the last refill boundary it includes);
    /// `None` for the other kinds.
    pub(super) bucket: Option<(u64, u64)>,
}

/// Settled leases that share a settlement time (at or after each settled):
/// a generation of the settled-lease memory.
#[derive(Debug, Clone)]
pub(super) struct SettledGroup {
    /// The group's newest settlement: each is remembered from then on.
    pub(super) settled_at_unix_ms: u64,
    /// (id low, id high, reserved at, fingerprint), oldest first.
    pub(super) entries: Vec<[u64; 4]>,
    /// The serial of the generation copied (0: decoded from a file), so the
    /// next periodic copy of the same generation appends only what settled
    /// since instead of copying it whole under the backend's lock.
    pub(super) generation: u64,
}

/// Equal when they hold the same leases: where they were copied from is not
/// part of what a snapshot says.
impl PartialEq for SettledGroup {
    fn eq(&self, other: &Self) -> bool {
        self.settled_at_unix_ms == other.settled_at_unix_ms && self.entries == other.entries
    }
}

impl Eq for SettledGroup {}

/// The memory backend's live state at one instant: what
/// [`crate::memory::MemoryBackend::restore`] puts back after a restart.
#[derive(Debug, Clone)]
pub struct MemorySnapshot {
    /// When it was copied: holds ending by then are not in it, and lease
    /// holds missing from their limit must have ended by then.
    pub(super) taken_at_unix_ms: u64,
    /// The boot clock at `taken_at_unix_ms`, when known.
    pub(super) taken_at_boot: Option<BootInstant>,
    /// `taken_at_unix_ms` to the microsecond, so a restore measures a clock
    /// step exactly (version 1 files: the milliseconds).
    pub(super) taken_at_unix_micros: u64,
    /// The key of settled leases' fingerprints, so a restore computes the same.
    pub(super) fingerprint_seed: u64,
    /// Every limit, at the writer's index.
    pub(super) limits: Vec<LimitSnapshot>,
    /// Live leases in the table's order, see
    /// [`MemorySnapshot::leases_oldest_first`]; their holds name limits by
    /// position in `limits`, which is the writer's limit index.
    pub(super) leases: Vec<(u128, LiveLease)>,
    /// Settled leases, a group per generation of the settled memory, oldest first.
    pub(super) settled: Vec<SettledGroup>,
    /// (id, failed at), oldest first.
    pub(super) failed: Vec<(u128, u64)>,
}

impl PartialEq for MemorySnapshot {
    /// Equal content; the leases' ages within the writer's table are not content.
    fn eq(&self, other: &Self) -> bool {
        let lease = |(id, lease): &(u128, LiveLease)| (*id, lease.reserved_at_unix_ms, lease.holds().to_vec());
        self.taken_at_unix_ms == other.taken_at_unix_ms
            && self.taken_at_boot == other.taken_at_boot
            && self.taken_at_unix_micros == other.taken_at_unix_micros
            && self.fingerprint_seed == other.fingerprint_seed
            && self.limits == other.limits
            && self
                .leases_oldest_first()
                .into_iter()
                .map(lease)
                .eq(other.leases_oldest_first().into_iter().map(lease))
            && self.settled == other.settled
            && self.failed == other.failed
    }
}

/// What a restore put back and what it left out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RestoreReport {
    /// Units put back on limits, summed over limits (ended holds excluded).
    pub units_held: u64,
    /// Live leases put back, Complete-able as before.
    pub leases_live: u64,
    /// Leases whose every hold had ended: remembered as settled instead, so
    /// their replays are still answered.
    pub leases_settled: u64,
    /// Leases left out because a limit they hold no longer exists (or changed
    /// kind); their units on the other limits are still held.
    pub leases_dropped: u64,
    /// Live leases a smaller `leases_max` than the writer's had no room for
    /// (the first to end went): their holds stay until they end, unreconciled.
    pub leases_evicted: u64,
    /// Limits of the snapshot not defined now (or of another kind): their
    /// holds were left out.
    pub limits_dropped: u64,
    /// Settled lease ids remembered again.
    pub settled_remembered: u64,
    /// Denied lease ids remembered again.
    pub failed_remembered: u64,
    /// How far the snapshot's instants were moved to this process's clock:
    /// the wall clock's step between the two processes (0 without one, or
    /// when the boot clock could not tell: another boot, a version 1 file).
    pub clock_step_ms: i64,
}

impl MemorySnapshot {
    /// When it was taken.
    pub fn taken_at_unix_ms(&self) -> u64 {
        self.taken_at_unix_ms
    }

    /// The live leases in it.
    pub fn leases_len(&self) -> usize {
        self.leases.len()
    }

    /// An empty snapshot, to copy into with [`crate::memory::MemoryBackend::snapshot_into`].
    pub fn empty() -> Self {
        Self {
            taken_at_unix_ms: 0,
            taken_at_boot: None,
            taken_at_unix_micros: 0,
            fingerprint_seed: 0,
            limits: Vec::new(),
            leases: Vec::new(),
            settled: Vec::new(),
            failed: Vec::new(),
        }
    }

    /// Copies `state` at `now_unix_ms` over this snapshot's content: plain
    /// copies in memory order, into the vectors of the last copy, so the
    /// caller's lock is held for as short as a copy takes (a fresh copy also
    /// faults in every page of its vectors under the lock). Holds that ended
    /// are left out.
    pub(in crate::memory) fn copy_from(
        &mut self,
        state: &MemoryState,
        now_unix_micros: u64,
        now_boot: Option<BootInstant>,
    ) {
        let now_unix_ms = now_unix_micros / 1_000;
        self.taken_at_unix_ms = now_unix_ms;
        self.taken_at_boot = now_boot;
        self.taken_at_unix_micros = now_unix_micros;
        self.fingerprint_seed = state.fingerprint_seed;
        self.limits.truncate(state.limits.len());
        for (i, limit) in state.limits.iter().enumerate() {
            if i == self.limits.len() {
                self.limits.push(LimitSnapshot {
                    key: limit.state().definition().key().clone(),
                    kind: limit.kind(),
                    debt: 0,
                    owed_until_unix_ms: 0,
                    streak: Streak::default(),
                    holds: Vec::new(),
                    bucket: None,
                });
            }
            let saved = &mut self.limits[i];
            if &saved.key != limit.state().definition().key() {
                saved.key = limit.state().definition().key().clone();
            }
            saved.kind = limit.kind();
            saved.debt = limit.debt();
            saved.owed_until_unix_ms = limit.owed_until_unix_ms();
            saved.streak = limit.streak();
            saved.holds.clear();
            saved.holds.extend(limit.holds().filter(|&(at, _)| at > now_unix_ms));
            saved.bucket = limit.bucket().map(|b| (b.level(), b.refilled_at_unix_ms()));
        }
        self.leases.clear();
        self.leases
            .extend(state.leases.iter().map(|(id, lease)| (id, lease.clone())));
        self.copy_settled(state.settled.generations_oldest_first());
        self.failed.clear();
        self.failed.extend(state.failed.iter_oldest_first());
    }

    /// Copies the settled generations, appending to the previous copy of a
    /// generation only what settled since (same serial: the copy is a prefix),
    /// so that the pause under the lock grows with the leases settled between
    /// two snapshots, not with the memory's bound (up to a million leases,
    /// 32 MB, copied every second before). A cleared generation is copied
    /// whole, into a spare group's allocation when there is one.
    fn copy_settled(&mut self, generations: [SettledGeneration<'_>; 2]) {
        let serials = generations.map(|generation| generation.serial);
        let mut spare = std::mem::take(&mut self.settled);
        for generation in generations {
            if generation.entries.is_empty() {
                continue;
            }
            let found = (spare.iter().position(|group| group.generation == generation.serial))
                .or_else(|| spare.iter().position(|group| !serials.contains(&group.generation)));
            let mut group = found.map_or_else(
                || SettledGroup {
                    settled_at_unix_ms: 0,
                    entries: Vec::new(),
                    generation: 0,
                },
                |i| spare.swap_remove(i),
            );
            if group.generation != generation.serial || group.entries.len() > generation.entries.len() {
                group.entries.clear();
                group.generation = generation.serial;
            }
            let copied = group.entries.len();
            debug_assert!(
                copied == 0 || group.entries[copied - 1] == generation.entries[copied - 1],
                "a generation's entries are only appended under one serial"
            );
            group.entries.extend_from_slice(&generation.entries[copied..]);
            group.settled_at_unix_ms = generation.newest_unix_ms;
            self.settled.push(group);
        }
    }

    /// The live leases oldest first, the order the lease table evicts in: a
    /// copy keeps the table's order (sorting under the lock would lengthen the
    /// pause); a decoded snapshot is in this order already (and ages all 0,
    /// which the stable sort keeps).
    pub(super) fn leases_oldest_first(&self) -> Vec<&(u128, LiveLease)> {
        let mut leases: Vec<&(u128, LiveLease)> = self.leases.iter().collect();
        leases.sort_by_key(|(_, lease)| lease.age());
        leases
    }

    /// How far the wall clock of the process reading `now_unix_ms` and
    /// `now_boot` stepped since this snapshot was taken: its wall time minus
    /// the snapshot's, less the real time that passed. 0 when the boot clock
    /// cannot tell (another boot, a version 1 file, no boot clock).
    pub fn clock_step_ms(&self, now_unix_micros: u64, now_boot: Option<BootInstant>) -> i64 {
        let (Some(then), Some(now)) = (self.taken_at_boot, now_boot) else {
            return 0;
        };
        if then.boot_id != now.boot_id || now.since_boot_micros < then.since_boot_micros {
            return 0;
        }
        let elapsed_micros = i128::from(now.since_boot_micros - then.since_boot_micros);
        let wall_micros = i128::from(now_unix_micros) - i128::from(self.taken_at_unix_micros);
        // Rounded up to whole milliseconds: holds end at most 1 ms late, never
        // early. Without a step the readings agree to a few µs: 0 or 1 ms.
        let step_micros = wall_micros - elapsed_micros;
        let step_ms = step_micros.div_euclid(1_000) + i128::from(step_micros.rem_euclid(1_000) != 0);
        i64::try_from(step_ms).unwrap_or(0)
    }

    /// A copy with every instant moved by `step_ms`, into the timeline of a
    /// process whose wall clock is that far from the writer's: the ends of
    /// holds, and the times retention and streaks count from. Grant times
    /// (`reserved_at_unix_ms`) stay as they were answered, so a replay after
    /// the restart is answered the same.
    pub fn shifted(&self, step_ms: i64) -> MemorySnapshot {
        let at = |instant: u64| instant.saturating_add_signed(step_ms);
        let mut shifted = self.clone();
        shifted.taken_at_unix_ms = at(self.taken_at_unix_ms);
        for limit in &mut shifted.limits {
            limit
                .holds
                .iter_mut()
                .for_each(|(expires_at, _)| *expires_at = at(*expires_at));
            let (denials, updated_unix_ms) = limit.streak.parts();
            limit.streak = Streak::from_parts(denials, at(updated_unix_ms));
            if limit.owed_until_unix_ms > 0 {
                limit.owed_until_unix_ms = at(limit.owed_until_unix_ms);
            }
            // A bucket refills from the shifted instant: a forward step does not
            // refill it at once, a backward one does not starve it.
            if let Some((_, refilled_at)) = limit.bucket.as_mut() {
                *refilled_at = at(*refilled_at);
            }
        }
        for (_, lease) in &mut shifted.leases {
            let holds: Vec<LeaseHold> = lease
                .holds()
                .iter()
                .map(|hold| LeaseHold {
                    expires_at_unix_ms: at(hold.expires_at_unix_ms),
                    ..*hold
                })
                .collect();
            *lease = LiveLease::new(lease.reserved_at_unix_ms, &holds);
        }
        for group in &mut shifted.settled {
            group.settled_at_unix_ms = at(group.settled_at_unix_ms);
        }
        shifted
            .failed
            .iter_mut()
            .for_each(|(_, failed_at)| *failed_at = at(*failed_at));
        shifted
    }
}
