//! A snapshot's round trip through its encoding and its refusal of damaged files.

use sha2::{Digest, Sha256};

use crate::base::clock::BootInstant;
use crate::memory::lease_table::{LeaseHold, LiveLease};
use crate::model::definition::LimitKind;
use crate::model::key::LimitKey;
use crate::model::retry::Streak;

use super::content::LimitSnapshot;
use super::format::{CHECKSUM_BYTES, HEADER_BYTES};
use super::*;

/// A version 3 encoding of a snapshot with one limit rewritten as version
/// 1 wrote it: no boot clock after the seed, no streak nor owing after the debt.
fn as_version_1(v2: &[u8], key_bytes: usize) -> Vec<u8> {
    let body_start = HEADER_BYTES;
    let boot_at = body_start + 16;
    // limits count u32, key length u16, key, kind u8, debt u64: the streak follows.
    let streak_at = boot_at + 32 + 4 + 2 + key_bytes + 1 + 8;
    let mut v1 = v2[..boot_at].to_vec();
    v1.extend_from_slice(&v2[boot_at + 32..streak_at]);
    v1.extend_from_slice(&v2[streak_at + 12 + 8..v2.len() - CHECKSUM_BYTES]);
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
            owed_until_unix_ms: 70_000,
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
            owed_until_unix_ms: 0,
            ..snapshot.limits[0].clone()
        }],
        ..snapshot.clone()
    };
    assert_eq!(v1, expected);
}
