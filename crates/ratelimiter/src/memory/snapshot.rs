//! Saving and restoring the memory backend's live state (issue 15): held
//! units per limit, live leases with what Complete needs to reconcile them,
//! and the settled- and failed-lease memories, so a restart neither hands out
//! capacity the provider still counts nor forgets an idempotent answer.
//!
//! A snapshot is copied under the backend's lock (plain copies, no encoding)
//! and encoded outside it. Every instant in it is wall time (Unix ms) as the
//! writing process's clock read it, with the boot clock read at the same
//! moment: the next process of the same boot moves every instant by what its
//! own wall clock says minus the real time that passed, so a wall-clock step
//! between the two (NTP, an operator) neither ends holds early (over-admission)
//! nor makes them last longer (issue 21). Across a reboot the wall clock is
//! all there is.
//!
//! The file format, all integers little-endian:
//!
//! ```text
//! magic "RLMEMSNP" | version u32 | body length u64 | body | SHA-256 of all before it
//! body: taken_at u64, fingerprint_seed u64,
//!       (version 2) boot id u128 (0: unknown), taken at since boot µs u64, taken at Unix µs u64,
//!       limits u32 × (key length u16, key, kind u8, debt u64,
//!                     (version 2) streak denials u32, streak updated_at u64,
//!                     holds u32 × (expires_at u64, units u64),
//!                     (kind 2, a bucket: no holds, then level u64, refilled_at u64)),
//!       leases u32 × (id u128, reserved_at u64, holds u8 × (limit u32, amount u64, expires_at u64)),
//!       settled groups u32 × (settled_at u64, leases u32 × (id u128, reserved_at u64, fingerprint u64)),
//!       failed u32 × (id u128, failed_at u64)
//! ```
//!
//! A lease's holds name limits by their position in the snapshot's own limit
//! list, and a restore maps them by key, since indices differ between
//! processes. Decoding checks everything before anything is restored, so a
//! damaged file is rejected whole, never half-loaded.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::base::clock::BootInstant;
use crate::model::definition::LimitKind;
use crate::model::key::LimitKey;
use crate::model::retry::Streak;
use crate::model::wire::REQUIREMENTS_MAX;

use super::lease_table::{LeaseHold, LiveLease};
use super::settled_leases::{SettledGeneration, SettledLease};
use super::state::MemoryState;

/// The first bytes of every snapshot file: tells a snapshot from any other file.
pub const SNAPSHOT_MAGIC: [u8; 8] = *b"RLMEMSNP";
/// The format version written: 2 added the boot clock and the denial
/// streaks. A reader takes this one and [`SNAPSHOT_FORMAT_VERSION_OLDEST`],
/// and refuses any other: a newer file after a downgrade is reported damaged
/// rather than misread.
pub const SNAPSHOT_FORMAT_VERSION: u32 = 2;
/// The oldest format version still read: version 1 files (no boot clock, no
/// streaks) restore with the wall clock and calm streaks, as they did.
pub const SNAPSHOT_FORMAT_VERSION_OLDEST: u32 = 1;
/// Bytes of a SHA-256 checksum.
const CHECKSUM_BYTES: usize = 32;
/// Bytes before the body: magic, version, body length.
const HEADER_BYTES: usize = 8 + 4 + 8;

/// Why a snapshot cannot be read or restored. Every message names the file.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The file could not be read or written.
    #[error("memory snapshot {path}: {source}")]
    Io {
        /// The snapshot file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The file is not a whole snapshot of this format: nothing was restored.
    #[error("memory snapshot {path} is damaged: {reason}")]
    Damaged {
        /// The snapshot file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A restore into a backend that already settled or holds leases: their
    /// fingerprints and memories would mix with the snapshot's.
    #[error("memory snapshot: a restore needs a backend that has served no request yet")]
    NotFresh,
}

/// One limit's held units, as saved.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LimitSnapshot {
    /// Names the limit in the next process, whose indices differ.
    key: LimitKey,
    /// A limit redefined with another kind meanwhile is not this one.
    kind: LimitKind,
    /// Overage recorded as debt, a report that should survive too.
    debt: u64,
    /// The denial streak, so a restart does not reset a contended key's
    /// backoff and let every waiting client retry at once.
    streak: Streak,
    /// (expires_at_unix_ms, units), earliest first: held units, leased or not
    /// (evicted leases' and reconciled overage's units are held too). Empty for a bucket.
    holds: Vec<(u64, u64)>,
    /// A bucket's (level, instant of the last refill boundary it includes);
    /// `None` for the other kinds.
    bucket: Option<(u64, u64)>,
}

/// Settled leases that share a settlement time (at or after each settled):
/// a generation of the settled-lease memory.
#[derive(Debug, Clone)]
struct SettledGroup {
    /// The group's newest settlement: each is remembered from then on.
    settled_at_unix_ms: u64,
    /// (id low, id high, reserved at, fingerprint), oldest first.
    entries: Vec<[u64; 4]>,
    /// The serial of the generation copied (0: decoded from a file), so the
    /// next periodic copy of the same generation appends only what settled
    /// since instead of copying it whole under the backend's lock.
    generation: u64,
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
/// [`super::MemoryBackend::restore`] puts back after a restart.
#[derive(Debug, Clone)]
pub struct MemorySnapshot {
    /// When it was copied: holds ending by then are not in it, and lease
    /// holds missing from their limit must have ended by then.
    taken_at_unix_ms: u64,
    /// The boot clock at `taken_at_unix_ms`, when known.
    taken_at_boot: Option<BootInstant>,
    /// `taken_at_unix_ms` to the microsecond, so a restore measures a clock
    /// step exactly (version 1 files: the milliseconds).
    taken_at_unix_micros: u64,
    /// The key of settled leases' fingerprints, so a restore computes the same.
    fingerprint_seed: u64,
    /// Every limit, at the writer's index.
    limits: Vec<LimitSnapshot>,
    /// Live leases in the table's order, see
    /// [`MemorySnapshot::leases_oldest_first`]; their holds name limits by
    /// position in `limits`, which is the writer's limit index.
    leases: Vec<(u128, LiveLease)>,
    /// Settled leases, a group per generation of the settled memory, oldest first.
    settled: Vec<SettledGroup>,
    /// (id, failed at), oldest first.
    failed: Vec<(u128, u64)>,
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

    /// An empty snapshot, to copy into with [`super::MemoryBackend::snapshot_into`].
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
    pub(super) fn copy_from(&mut self, state: &MemoryState, now_unix_micros: u64, now_boot: Option<BootInstant>) {
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
    fn leases_oldest_first(&self) -> Vec<&(u128, LiveLease)> {
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

impl MemoryState {
    /// Puts `snapshot` back at `now_unix_ms` into a state whose limits are
    /// defined (from the registry) and that has served nothing yet: units and
    /// debt of limits that still exist with the same kind, then settled and
    /// failed ids still within their retention, then live leases (a lease
    /// whose holds all ended is remembered as settled instead).
    pub(super) fn restore(
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

impl MemorySnapshot {
    /// The snapshot in the file format above.
    pub fn encode(&self) -> Vec<u8> {
        let settled_len: usize = self.settled.iter().map(|g| g.entries.len()).sum();
        let mut out = Vec::with_capacity(HEADER_BYTES + 112 * self.leases.len() + 32 * settled_len + 64);
        out.extend_from_slice(&SNAPSHOT_MAGIC);
        out.extend_from_slice(&SNAPSHOT_FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&0u64.to_le_bytes());
        let put_u64 = |out: &mut Vec<u8>, v: u64| out.extend_from_slice(&v.to_le_bytes());
        let put_len = |out: &mut Vec<u8>, n: usize| {
            out.extend_from_slice(&u32::try_from(n).expect("fewer than 2^32 items").to_le_bytes())
        };
        put_u64(&mut out, self.taken_at_unix_ms);
        put_u64(&mut out, self.fingerprint_seed);
        let boot = self.taken_at_boot.map_or((0, 0), |b| (b.boot_id, b.since_boot_micros));
        out.extend_from_slice(&boot.0.to_le_bytes());
        put_u64(&mut out, boot.1);
        put_u64(&mut out, self.taken_at_unix_micros);
        put_len(&mut out, self.limits.len());
        for limit in &self.limits {
            let key = limit.key.as_str().as_bytes();
            out.extend_from_slice(&u16::try_from(key.len()).expect("keys are short").to_le_bytes());
            out.extend_from_slice(key);
            out.push(kind_byte(limit.kind));
            put_u64(&mut out, limit.debt);
            let (denials, updated_unix_ms) = limit.streak.parts();
            out.extend_from_slice(&denials.to_le_bytes());
            put_u64(&mut out, updated_unix_ms);
            put_len(&mut out, limit.holds.len());
            for &(at, units) in &limit.holds {
                put_u64(&mut out, at);
                put_u64(&mut out, units);
            }
            if let Some((level, refilled_at_unix_ms)) = limit.bucket {
                put_u64(&mut out, level);
                put_u64(&mut out, refilled_at_unix_ms);
            }
        }
        put_len(&mut out, self.leases.len());
        for (id, lease) in self.leases_oldest_first() {
            out.extend_from_slice(&id.to_le_bytes());
            put_u64(&mut out, lease.reserved_at_unix_ms);
            out.push(u8::try_from(lease.holds().len()).expect("at most REQUIREMENTS_MAX holds"));
            for hold in lease.holds() {
                out.extend_from_slice(&hold.limit.to_le_bytes());
                put_u64(&mut out, hold.amount);
                put_u64(&mut out, hold.expires_at_unix_ms);
            }
        }
        put_len(&mut out, self.settled.len());
        for group in &self.settled {
            put_u64(&mut out, group.settled_at_unix_ms);
            put_len(&mut out, group.entries.len());
            // Id low and high words first: the id as a little-endian u128.
            for word in group.entries.iter().flatten() {
                put_u64(&mut out, *word);
            }
        }
        put_len(&mut out, self.failed.len());
        for (id, failed_at) in &self.failed {
            out.extend_from_slice(&id.to_le_bytes());
            put_u64(&mut out, *failed_at);
        }
        let body_bytes = (out.len() - HEADER_BYTES) as u64;
        out[12..HEADER_BYTES].copy_from_slice(&body_bytes.to_le_bytes());
        let checksum = Sha256::digest(&out);
        out.extend_from_slice(&checksum);
        out
    }

    /// Reads the file format above. Every check passes before a snapshot is
    /// returned; the error says what failed.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        if bytes.len() < HEADER_BYTES + CHECKSUM_BYTES || bytes[..8] != SNAPSHOT_MAGIC {
            return Err("not a memory snapshot (no magic)".to_owned());
        }
        let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        if !(SNAPSHOT_FORMAT_VERSION_OLDEST..=SNAPSHOT_FORMAT_VERSION).contains(&version) {
            return Err(format!(
                "format version {version}; this build reads versions {SNAPSHOT_FORMAT_VERSION_OLDEST} to \
                 {SNAPSHOT_FORMAT_VERSION}"
            ));
        }
        let body_bytes = u64::from_le_bytes(bytes[12..HEADER_BYTES].try_into().expect("8 bytes"));
        let expected = (HEADER_BYTES + CHECKSUM_BYTES) as u64 + body_bytes;
        if bytes.len() as u64 != expected {
            return Err(format!(
                "{} bytes where the header promises {expected} (truncated?)",
                bytes.len()
            ));
        }
        let (content, checksum) = bytes.split_at(bytes.len() - CHECKSUM_BYTES);
        if Sha256::digest(content).as_slice() != checksum {
            return Err("checksum mismatch".to_owned());
        }
        let mut reader = Reader {
            bytes: &content[HEADER_BYTES..],
        };
        let snapshot = Self::read_body(&mut reader, version)?;
        if !reader.bytes.is_empty() {
            return Err(format!("{} bytes after the last section", reader.bytes.len()));
        }
        Ok(snapshot)
    }

    fn read_body(r: &mut Reader, version: u32) -> Result<Self, String> {
        let taken_at_unix_ms = r.u64()?;
        let fingerprint_seed = r.u64()?;
        let (taken_at_boot, taken_at_unix_micros) = if version >= 2 {
            let boot_id = r.u128()?;
            let since_boot_micros = r.u64()?;
            let boot = (boot_id != 0).then_some(BootInstant {
                boot_id,
                since_boot_micros,
            });
            (boot, r.u64()?)
        } else {
            (None, taken_at_unix_ms.saturating_mul(1_000))
        };
        let limit_bytes_min = if version >= 2 {
            2 + 1 + 1 + 8 + 12 + 4
        } else {
            2 + 1 + 1 + 8 + 4
        };
        let limits = r.items(limit_bytes_min, |r| read_limit(r, version))?;
        let leases = r.items(16 + 8 + 1, |r| read_lease(r, limits.len()))?;
        let settled = r.items(8 + 4, |r| {
            let settled_at_unix_ms = r.u64()?;
            let entries = r.items(32, |r| Ok([r.u64()?, r.u64()?, r.u64()?, r.u64()?]))?;
            Ok(SettledGroup {
                settled_at_unix_ms,
                entries,
                generation: 0,
            })
        })?;
        let failed = r.items(16 + 8, |r| Ok((r.u128()?, r.u64()?)))?;
        let snapshot = Self {
            taken_at_unix_ms,
            taken_at_boot,
            taken_at_unix_micros,
            fingerprint_seed,
            limits,
            leases,
            settled,
            failed,
        };
        snapshot.check_leases_within_holds()?;
        Ok(snapshot)
    }

    /// Checks what every snapshot the backend writes satisfies: live leases
    /// hold no more at an instant than their limit holds there (a lease that
    /// completes gives its units back, so fewer would make the restored
    /// server release units it never held), and a lease's hold missing from
    /// its limit had ended when the snapshot was taken.
    fn check_leases_within_holds(&self) -> Result<(), String> {
        let mut left: std::collections::HashMap<(u32, u64), u64> = self
            .limits
            .iter()
            .enumerate()
            .flat_map(|(i, limit)| limit.holds.iter().map(move |&(at, units)| ((i as u32, at), units)))
            .collect();
        for (id, lease) in &self.leases {
            // A bucket keeps a level, not holds: a lease's units on it came back by refill or not.
            let on_window = |limit: u32| self.limits[limit as usize].kind != LimitKind::Bucket;
            for hold in lease.holds().iter().filter(|hold| on_window(hold.limit)) {
                match left.get_mut(&(hold.limit, hold.expires_at_unix_ms)) {
                    Some(units) if *units >= hold.amount => *units -= hold.amount,
                    None if hold.expires_at_unix_ms <= self.taken_at_unix_ms => {}
                    _ => {
                        return Err(format!(
                            "lease {id:x} holds {} on limit {} more than the limit holds",
                            hold.amount, self.limits[hold.limit as usize].key
                        ))
                    }
                }
            }
        }
        Ok(())
    }

    /// Writes the snapshot to `path` atomically: a temporary file beside it,
    /// fsync, rename over the old file, fsync of the directory. A crash at any
    /// point leaves the old snapshot or the new one, never a torn file.
    /// Returns the bytes written.
    pub fn write_atomic(&self, path: &Path) -> Result<usize, SnapshotError> {
        let bytes = self.encode();
        write_atomic(path, &bytes)?;
        Ok(bytes.len())
    }

    /// Reads the snapshot at `path`: `None` when there is none.
    pub fn read(path: &Path) -> Result<Option<Self>, SnapshotError> {
        let bytes = match fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(SnapshotError::Io {
                    path: path.to_owned(),
                    source,
                })
            }
        };
        Self::decode(&bytes).map(Some).map_err(|reason| SnapshotError::Damaged {
            path: path.to_owned(),
            reason,
        })
    }
}

/// `bytes` to `path` through `<path>.tmp`, durably. A failed write (a full or
/// read-only disk) removes the temporary file: its space returns, and the
/// previous snapshot stays whole.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), SnapshotError> {
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".tmp");
    let tmp = path.with_file_name(name);
    let result = write_then_rename(path, &tmp, bytes);
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// [`write_atomic`]'s steps, through `tmp`.
fn write_then_rename(path: &Path, tmp: &Path, bytes: &[u8]) -> Result<(), SnapshotError> {
    let io = |source| SnapshotError::Io {
        path: path.to_owned(),
        source,
    };
    let directory = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_owned(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&directory).map_err(io)?;
    let mut file = private_file(tmp).map_err(io)?;
    file.write_all(bytes).map_err(io)?;
    file.sync_all().map_err(io)?;
    drop(file);
    fs::rename(tmp, path).map_err(io)?;
    File::open(&directory).and_then(|d| d.sync_all()).map_err(io)
}

/// Creates (or truncates) `path` readable and writable by its owner only
/// (0600 on Unix): a snapshot holds every live lease id, and whoever reads one
/// may complete that lease. A file left by an earlier version with wider
/// permissions is narrowed too.
fn private_file(path: &Path) -> std::io::Result<File> {
    let mut options = fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let file = options.open(path)?;
    #[cfg(unix)]
    file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    Ok(file)
}

fn kind_byte(kind: LimitKind) -> u8 {
    match kind {
        LimitKind::Rolling => 0,
        LimitKind::Concurrency => 1,
        LimitKind::Bucket => 2,
    }
}

fn read_limit(r: &mut Reader, version: u32) -> Result<LimitSnapshot, String> {
    let key_bytes = usize::from(r.u16()?);
    let key = std::str::from_utf8(r.take(key_bytes)?).map_err(|e| format!("limit key: {e}"))?;
    let key = LimitKey::new(key).map_err(|e| format!("limit key: {e}"))?;
    let kind = match r.u8()? {
        0 => LimitKind::Rolling,
        1 => LimitKind::Concurrency,
        2 => LimitKind::Bucket,
        other => return Err(format!("limit {key}: kind {other}")),
    };
    let debt = r.u64()?;
    let streak = if version >= 2 {
        Streak::from_parts(r.u32()?, r.u64()?)
    } else {
        Streak::default()
    };
    let holds = r.items(16, |r| Ok((r.u64()?, r.u64()?)))?;
    if holds.iter().any(|&(_, units)| units == 0) || holds.windows(2).any(|w| w[0].0 >= w[1].0) {
        return Err(format!("limit {key}: holds empty or out of order"));
    }
    let bucket = match kind {
        LimitKind::Bucket if holds.is_empty() => Some((r.u64()?, r.u64()?)),
        LimitKind::Bucket => return Err(format!("limit {key}: a bucket with holds")),
        LimitKind::Rolling | LimitKind::Concurrency => None,
    };
    Ok(LimitSnapshot {
        key,
        kind,
        debt,
        streak,
        holds,
        bucket,
    })
}

fn read_lease(r: &mut Reader, limits: usize) -> Result<(u128, LiveLease), String> {
    let id = r.u128()?;
    let reserved_at_unix_ms = r.u64()?;
    let count = usize::from(r.u8()?);
    if count == 0 || count > REQUIREMENTS_MAX {
        return Err(format!("lease {id:x}: {count} holds"));
    }
    let mut holds = Vec::with_capacity(count);
    for _ in 0..count {
        let hold = LeaseHold {
            limit: r.u32()?,
            amount: r.u64()?,
            expires_at_unix_ms: r.u64()?,
        };
        if hold.limit as usize >= limits || hold.amount == 0 {
            return Err(format!("lease {id:x}: a hold on limit {} of {limits}", hold.limit));
        }
        holds.push(hold);
    }
    if holds.windows(2).any(|w| w[0].limit >= w[1].limit) {
        return Err(format!("lease {id:x}: holds out of order"));
    }
    Ok((id, LiveLease::new(reserved_at_unix_ms, &holds)))
}

/// Reads the body front to back; every read checks the bytes are there.
struct Reader<'a> {
    /// What is left to read.
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.bytes.len() < n {
            return Err("truncated body".to_owned());
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2 bytes")))
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    fn u128(&mut self) -> Result<u128, String> {
        Ok(u128::from_le_bytes(self.take(16)?.try_into().expect("16 bytes")))
    }

    /// A count, then that many items of at least `item_bytes_min` each: the
    /// count is checked against the bytes left before anything is allocated,
    /// so a damaged count cannot ask for gigabytes.
    fn items<T>(
        &mut self,
        item_bytes_min: usize,
        mut read: impl FnMut(&mut Self) -> Result<T, String>,
    ) -> Result<Vec<T>, String> {
        let count = self.u32()? as usize;
        if count.saturating_mul(item_bytes_min) > self.bytes.len() {
            return Err(format!("a count of {count} past the end of the file"));
        }
        (0..count).map(|_| read(self)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A version 2 encoding of a snapshot with one limit rewritten as version
    /// 1 wrote it: no boot clock after the seed, no streak after the debt.
    fn as_version_1(v2: &[u8], key_bytes: usize) -> Vec<u8> {
        let body_start = HEADER_BYTES;
        let boot_at = body_start + 16;
        // limits count u32, key length u16, key, kind u8, debt u64: the streak follows.
        let streak_at = boot_at + 32 + 4 + 2 + key_bytes + 1 + 8;
        let mut v1 = v2[..boot_at].to_vec();
        v1.extend_from_slice(&v2[boot_at + 32..streak_at]);
        v1.extend_from_slice(&v2[streak_at + 12..v2.len() - CHECKSUM_BYTES]);
        v1[8..12].copy_from_slice(&1u32.to_le_bytes());
        let body_bytes = (v1.len() - HEADER_BYTES) as u64;
        v1[12..HEADER_BYTES].copy_from_slice(&body_bytes.to_le_bytes());
        let checksum = Sha256::digest(&v1);
        v1.extend_from_slice(&checksum);
        v1
    }

    #[test]
    fn version_1_files_still_read_without_boot_clock_or_streaks() {
        let key = LimitKey::new("tpm").unwrap();
        let snapshot = MemorySnapshot {
            taken_at_unix_ms: 1_000,
            taken_at_boot: Some(BootInstant {
                boot_id: 9,
                since_boot_micros: 5,
            }),
            taken_at_unix_micros: 1_000_321,
            fingerprint_seed: 42,
            limits: vec![LimitSnapshot {
                key: key.clone(),
                kind: LimitKind::Rolling,
                debt: 3,
                streak: Streak::from_parts(6, 900),
                holds: vec![(61_000, 10)],
                bucket: None,
            }],
            leases: vec![(
                77,
                LiveLease::new(
                    1_000,
                    &[LeaseHold {
                        limit: 0,
                        amount: 10,
                        expires_at_unix_ms: 61_000,
                    }],
                ),
            )],
            settled: Vec::new(),
            failed: vec![(5, 999)],
        };
        let v2 = snapshot.encode();
        assert_eq!(MemorySnapshot::decode(&v2).unwrap(), snapshot);
        let v1 = MemorySnapshot::decode(&as_version_1(&v2, key.as_str().len())).unwrap();
        let expected = MemorySnapshot {
            taken_at_boot: None,
            taken_at_unix_micros: 1_000_000,
            limits: vec![LimitSnapshot {
                streak: Streak::default(),
                ..snapshot.limits[0].clone()
            }],
            ..snapshot.clone()
        };
        assert_eq!(v1, expected);
    }
}
