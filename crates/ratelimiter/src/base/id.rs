//! Identifiers (docs/lease-ids.md): ULID lease ids, one per reserve attempt ("Lease ids
//! on the wire"), and the deterministic u128 ids derived from labels for TigerBeetle
//! accounts and transfers ("Deterministic TigerBeetle ids").

use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Derives a deterministic u128 id from `label`: the first 16 bytes of
/// SHA-256(label) read as little-endian. TigerBeetle rejects 0 and `u128::MAX`,
/// so those two values have their lowest bit flipped.
pub fn id128(label: &str) -> u128 {
    let digest = Sha256::digest(label.as_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    fix_reserved_id(u128::from_le_bytes(bytes))
}

fn fix_reserved_id(id: u128) -> u128 {
    if id == 0 || id == u128::MAX {
        id ^ 1
    } else {
        id
    }
}

/// Why a string is not a valid [`LeaseId`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("lease_id {value:?} is not a ULID (26 characters of Crockford base32)")]
pub struct LeaseIdError {
    /// The rejected input, cut to a printable length.
    pub value: String,
}

/// The longest part of a rejected lease id echoed in an error: enough to recognise
/// it, bounded so a huge input does not make a huge error message.
const LEASE_ID_ECHO_CHARS_MAX: usize = 40;

/// The id of one reserve attempt: a ULID, new for every attempt after a denial.
///
/// Stored as the ULID's 128 bits; its text form is always the canonical upper-case
/// spelling, so `01arz3…` and `01ARZ3…` are the same lease and derive the same ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct LeaseId(ulid::Ulid);

impl LeaseId {
    /// A fresh lease id from the system clock and a random source.
    pub fn generate() -> Self {
        Self(ulid::Ulid::new())
    }

    /// Parses and validates a ULID string.
    pub fn parse(text: &str) -> Result<Self, LeaseIdError> {
        let error = || LeaseIdError {
            value: text.chars().take(LEASE_ID_ECHO_CHARS_MAX).collect(),
        };
        // 26 base32 digits carry 130 bits; a first digit above 7 overflows 128.
        if !matches!(text.as_bytes().first(), Some(b'0'..=b'7')) {
            return Err(error());
        }
        ulid::Ulid::from_string(text).map(Self).map_err(|_| error())
    }

    /// The 128 bits of the ULID: a compact map key.
    pub fn to_u128(self) -> u128 {
        self.0 .0
    }

    /// Builds a lease id from its 128 bits.
    pub fn from_u128(bits: u128) -> Self {
        Self(ulid::Ulid(bits))
    }
}

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl std::str::FromStr for LeaseId {
    type Err = LeaseIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl TryFrom<String> for LeaseId {
    type Error = LeaseIdError;

    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse(&value)
    }
}

impl From<LeaseId> for String {
    fn from(id: LeaseId) -> Self {
        id.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Vectors computed independently with Python's hashlib:
    /// `int.from_bytes(hashlib.sha256(label.encode()).digest()[:16], "little")`.
    #[test]
    fn id128_matches_independent_vectors() {
        assert_eq!(id128("acct:operator"), 0xee06f35fb94212edc7e42a11203bfca8);
        assert_eq!(
            id128("acct:limit:global:llm:openai:gpt-4o:rpm"),
            0x5d3c6e5c7ffc849315cfc5f4cb10615e
        );
        assert_eq!(
            id128("xfer:reserve:01ARZ3NDEKTSV4RRFFQ69G5FAV:global:llm:openai:gpt-4o:tpm"),
            0xd0bf1ef341cd4698a8bf9e1d677e06c5
        );
    }

    #[test]
    fn reserved_ids_are_flipped() {
        assert_eq!(fix_reserved_id(0), 1);
        assert_eq!(fix_reserved_id(u128::MAX), u128::MAX - 1);
        assert_eq!(fix_reserved_id(42), 42);
    }

    #[test]
    fn lease_ids_parse_canonically() {
        let lower = LeaseId::parse("01arz3ndektsv4rrffq69g5fav").unwrap();
        let upper = LeaseId::parse("01ARZ3NDEKTSV4RRFFQ69G5FAV").unwrap();
        assert_eq!(lower, upper);
        assert_eq!(lower.to_string(), "01ARZ3NDEKTSV4RRFFQ69G5FAV");
        assert_eq!(LeaseId::from_u128(upper.to_u128()), upper);
    }

    #[test]
    fn bad_lease_ids_are_rejected() {
        for bad in [
            "",
            "not-a-ulid",
            "01ARZ3NDEKTSV4RRFFQ69G5FA",
            "01ARZ3NDEKTSV4RRFFQ69G5FAVX",
            "8ZZZZZZZZZZZZZZZZZZZZZZZZZ",
            "01ARZ3NDEKTSV4RRFFQ69G5FAU!",
        ] {
            assert!(LeaseId::parse(bad).is_err(), "{bad:?}");
        }
        let long = "x".repeat(10_000);
        assert_eq!(LeaseId::parse(&long).unwrap_err().value.len(), LEASE_ID_ECHO_CHARS_MAX);
    }

    #[test]
    fn generated_lease_ids_are_unique_and_round_trip() {
        let a = LeaseId::generate();
        let b = LeaseId::generate();
        assert_ne!(a, b);
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(serde_json::from_str::<LeaseId>(&json).unwrap(), a);
    }
}
