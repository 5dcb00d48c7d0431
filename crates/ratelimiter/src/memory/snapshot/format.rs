//! The snapshot's file format (see the module's documentation): its encoding,
//! and a decoding that checks everything before anything is restored.

use sha2::{Digest, Sha256};

use crate::base::clock::BootInstant;
use crate::memory::lease_table::{LeaseHold, LiveLease};
use crate::model::definition::LimitKind;
use crate::model::key::LimitKey;
use crate::model::retry::Streak;
use crate::model::wire::REQUIREMENTS_MAX;

use super::content::{LimitSnapshot, MemorySnapshot, SettledGroup};

/// The first bytes of every snapshot file: tells a snapshot from any other file.
pub const SNAPSHOT_MAGIC: [u8; 8] = *b"RLMEMSNP";
/// The format version written: 2 added the boot clock and the denial
/// streaks, 3 when each limit owes until. A reader takes this one back to
/// [`SNAPSHOT_FORMAT_VERSION_OLDEST`], and refuses any other: a newer file
/// after a downgrade is reported damaged rather than misread.
pub const SNAPSHOT_FORMAT_VERSION: u32 = 3;
/// The oldest format version still read: version 1 files (no boot clock, no
/// streaks) restore with the wall clock and calm streaks, as they did.
pub const SNAPSHOT_FORMAT_VERSION_OLDEST: u32 = 1;
/// Bytes of a SHA-256 checksum.
pub(super) const CHECKSUM_BYTES: usize = 32;
/// Bytes before the body: magic, version, body length.
pub(super) const HEADER_BYTES: usize = 8 + 4 + 8;

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
            put_u64(&mut out, limit.owed_until_unix_ms);
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
        let limit_bytes_min = if version >= 3 {
            2 + 1 + 1 + 8 + 12 + 8 + 4
        } else if version >= 2 {
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
    let owed_until_unix_ms = if version >= 3 { r.u64()? } else { 0 };
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
        owed_until_unix_ms,
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
