//! The keys themselves: generated from the operating system's generator, shown
//! once, and kept only as their SHA-256 ([`KeyHash`]) with a short hint of their
//! last characters, so a stolen store or a memory dump yields no usable key.

use rand::rngs::OsRng;
use rand::RngCore;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};

/// What every generated key starts with: an operator or a secret scanner
/// recognises a gateway key at a glance (as `sk-` marks OpenAI's).
pub const KEY_PREFIX: &str = "rlk-";
/// Random bytes in a key: 256 bits from the operating system's generator,
/// twice the 128 bits below which a key could be guessed.
pub const KEY_RANDOM_BYTES: usize = 32;
/// Characters of the key's end kept as its hint: enough to tell two keys
/// apart in a list, too few to help a guess (24 of 256 bits).
pub const KEY_HINT_CHARS: usize = 4;
/// The longest key the gateway hashes: a presented key longer than this is
/// unknown without being hashed, so a flood of huge keys costs no more than
/// a flood of short ones.
pub const PRESENTED_KEY_BYTES_MAX: usize = 512;

/// The SHA-256 of a key: what the directory keeps and looks keys up by.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyHash([u8; 32]);

impl KeyHash {
    /// The hash of `key` as presented (no trimming: the caller trims).
    pub fn of(key: &str) -> Self {
        Self(Sha256::digest(key.as_bytes()).into())
    }

    /// The 32 bytes.
    pub fn bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl std::fmt::Debug for KeyHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyHash(<redacted>)")
    }
}

impl Serialize for KeyHash {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let hex: String = self.0.iter().map(|b| format!("{b:02x}")).collect();
        serializer.serialize_str(&hex)
    }
}

impl<'de> Deserialize<'de> for KeyHash {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        let invalid = || serde::de::Error::custom("a key hash is 64 hexadecimal digits");
        if text.len() != 64 || !text.is_ascii() {
            return Err(invalid());
        }
        let mut bytes = [0u8; 32];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).map_err(|_| invalid())?;
        }
        Ok(Self(bytes))
    }
}

/// A key just generated: the only time its text exists on the server.
pub struct NewKey {
    /// The key to hand to its user, once.
    pub text: String,
    /// What the directory keeps.
    pub hash: KeyHash,
    /// Its last [`KEY_HINT_CHARS`] characters, shown in lists.
    pub hint: String,
}

impl std::fmt::Debug for NewKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewKey")
            .field("hint", &self.hint)
            .finish_non_exhaustive()
    }
}

impl NewKey {
    /// A key of [`KEY_RANDOM_BYTES`] from the operating system's generator,
    /// in URL-safe base64 without padding after [`KEY_PREFIX`].
    pub fn generate() -> Self {
        let mut random = [0u8; KEY_RANDOM_BYTES];
        OsRng.fill_bytes(&mut random);
        let text = format!("{KEY_PREFIX}{}", base64_url(&random));
        let hint = text[text.len() - KEY_HINT_CHARS..].to_owned();
        Self {
            hash: KeyHash::of(&text),
            hint,
            text,
        }
    }
}

/// URL-safe base64 without padding: keys travel in headers and shells unquoted.
fn base64_url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_prefixed_long_distinct_and_kept_as_their_hash() {
        let a = NewKey::generate();
        let b = NewKey::generate();
        assert!(a.text.starts_with(KEY_PREFIX));
        assert_eq!(a.text.len(), KEY_PREFIX.len() + 43, "256 bits in 43 base64 characters");
        assert_ne!(a.text, b.text);
        assert_eq!(a.hash, KeyHash::of(&a.text));
        assert!(a.text.ends_with(&a.hint));
        assert!(!format!("{a:?}{:?}", a.hash).contains(&a.text[KEY_PREFIX.len()..]));
        let json = serde_json::to_string(&a.hash).unwrap();
        assert_eq!(serde_json::from_str::<KeyHash>(&json).unwrap(), a.hash);
        assert!(serde_json::from_str::<KeyHash>("\"00\"").is_err());
    }

    #[test]
    fn base64_matches_the_standard_alphabet() {
        assert_eq!(base64_url(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64_url(b"fo"), "Zm8");
        assert_eq!(base64_url(&[0xfb, 0xff]), "-_8");
    }
}
