//! One completed call, as the spend ledger records it.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::SpendError;

/// The longest tenant, key, model or deployment name recorded, in bytes: names in
/// the gateway's configuration and directory are far shorter, and a bound keeps
/// one entry a short line.
pub const SPEND_NAME_BYTES_MAX: usize = 256;

/// One completed call: who made it, through what, when, what it used and what it
/// cost. Tokens are as the provider reported them; `micro_usd` is the billed cost
/// (`crate::price::billed_micro_usd`). Only valid entries exist
/// ([`SpendEntry::validate`]). The names are shared (`Arc<str>`): every completed
/// call makes an entry, and its names are the gateway's own, so an entry takes
/// them without an allocation, and the recorder's queue holds no copies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpendEntry {
    /// When the call completed, in ms since the Unix epoch: its day in UTC is the
    /// day it counts on.
    pub at_unix_ms: u64,
    /// The tenant.
    pub tenant: Arc<str>,
    /// The key's id; empty for a call made without a gateway key.
    pub key: Arc<str>,
    /// The model the call asked for.
    pub model: Arc<str>,
    /// The deployment that served it.
    pub deployment: Arc<str>,
    /// Prompt tokens not read from the provider's cache (cache writes included).
    pub input_tokens: u64,
    /// Prompt tokens read from the provider's cache.
    pub cached_tokens: u64,
    /// Output tokens, reasoning included.
    pub output_tokens: u64,
    /// The billed cost, in micro-dollars.
    pub micro_usd: u64,
    /// True when the call's model has no known price: `micro_usd` is 0 for want
    /// of one, not because the call was free (a report counts these calls apart).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unpriced: bool,
}

impl SpendEntry {
    /// Checks the names: tenant, model and deployment are not empty; no name is
    /// longer than [`SPEND_NAME_BYTES_MAX`] or holds a control character. The
    /// error names the field.
    pub fn validate(&self) -> Result<(), SpendError> {
        for (field, value, required) in [
            ("tenant", &self.tenant, true),
            ("key", &self.key, false),
            ("model", &self.model, true),
            ("deployment", &self.deployment, true),
        ] {
            let invalid = |why: &str| Err(SpendError::Invalid(format!("{field}: {why}")));
            if required && value.is_empty() {
                return invalid("must not be empty");
            }
            if value.len() > SPEND_NAME_BYTES_MAX {
                return invalid(&format!("at most {SPEND_NAME_BYTES_MAX} bytes, got {}", value.len()));
            }
            if value.chars().any(char::is_control) {
                return invalid("must not hold a control character");
            }
        }
        Ok(())
    }

    /// Appends the entry as one JSON object, the bytes `serde_json` writes for
    /// it: written by hand because every call's entry passes here, and a
    /// valid entry's names hold no control character, so only `"` and `\`
    /// ever need an escape (a test holds the two writers equal).
    pub fn write_json(&self, out: &mut Vec<u8>) {
        let number = |out: &mut Vec<u8>, key: &str, value: u64| {
            out.extend_from_slice(key.as_bytes());
            out.extend_from_slice(itoa::Buffer::new().format(value).as_bytes());
        };
        number(out, "{\"at_unix_ms\":", self.at_unix_ms);
        for (key, value) in [
            (",\"tenant\":", &self.tenant),
            (",\"key\":", &self.key),
            (",\"model\":", &self.model),
            (",\"deployment\":", &self.deployment),
        ] {
            out.extend_from_slice(key.as_bytes());
            json_string(out, value);
        }
        number(out, ",\"input_tokens\":", self.input_tokens);
        number(out, ",\"cached_tokens\":", self.cached_tokens);
        number(out, ",\"output_tokens\":", self.output_tokens);
        number(out, ",\"micro_usd\":", self.micro_usd);
        if self.unpriced {
            out.extend_from_slice(b",\"unpriced\":true");
        }
        out.push(b'}');
    }
}

/// `value` as a JSON string; a control character, which no valid entry
/// holds, is escaped as `serde_json` escapes it.
fn json_string(out: &mut Vec<u8>, value: &str) {
    if value.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20) {
        serde_json::to_writer(&mut *out, value).expect("a string serializes");
        return;
    }
    out.reserve(value.len() + 2);
    out.push(b'"');
    out.extend_from_slice(value.as_bytes());
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hand_written_line_is_the_one_serde_json_writes() {
        let names = ["acme", "", "a \"quoted\" \\ name", "ünï 名前", "tab\there"];
        for (n, name) in names.iter().enumerate() {
            for unpriced in [false, true] {
                let entry = SpendEntry {
                    at_unix_ms: 1_765_000_000_000 + n as u64,
                    tenant: (*name).into(),
                    key: format!("k{n}{name}").into(),
                    model: (*name).into(),
                    deployment: "d".into(),
                    input_tokens: u64::MAX,
                    cached_tokens: 0,
                    output_tokens: n as u64,
                    micro_usd: 12_345,
                    unpriced,
                };
                let mut ours = Vec::new();
                entry.write_json(&mut ours);
                assert_eq!(
                    String::from_utf8(ours).unwrap(),
                    serde_json::to_string(&entry).unwrap(),
                    "{name:?}"
                );
            }
        }
    }

    fn entry() -> SpendEntry {
        SpendEntry {
            at_unix_ms: 0,
            tenant: "acme".into(),
            key: "".into(),
            model: "gpt-4o".into(),
            deployment: "azure-east".into(),
            input_tokens: 1,
            cached_tokens: 0,
            output_tokens: 1,
            micro_usd: 13,
            unpriced: false,
        }
    }

    #[test]
    fn names_are_checked_field_by_field() {
        assert!(entry().validate().is_ok(), "an empty key is a call without one");
        let cases = [
            (
                SpendEntry {
                    tenant: "".into(),
                    ..entry()
                },
                "tenant: must not be empty",
            ),
            (
                SpendEntry {
                    model: "m\n".into(),
                    ..entry()
                },
                "model: must not hold",
            ),
            (
                SpendEntry {
                    deployment: "".into(),
                    ..entry()
                },
                "deployment: must not be empty",
            ),
            (
                SpendEntry {
                    key: "k".repeat(SPEND_NAME_BYTES_MAX + 1).into(),
                    ..entry()
                },
                "key: at most 256 bytes",
            ),
        ];
        for (bad, message) in cases {
            let error = bad.validate().unwrap_err().to_string();
            assert!(error.contains(message), "{error}");
        }
    }
}
