//! Limit keys: the stable, globally unique names of what is limited (docs/http-api.md,
//! "Limit keys"; naming conventions in docs/client-library.md, "Limit keys").

use std::fmt;

use serde::{Deserialize, Serialize};

/// The longest key accepted, in bytes (docs/http-api.md, "Limit keys"). Keys are labels
/// in deterministic TigerBeetle ids and map keys on every hot path, so they stay short.
pub const KEY_BYTES_MAX: usize = 256;

/// Why a string is not a valid [`LimitKey`] or key component.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// Keys must hold at least one byte.
    #[error("key must not be empty")]
    Empty,
    /// Keys are bounded so that ids and maps stay cheap.
    #[error("key is {length_bytes} bytes, more than the {KEY_BYTES_MAX} allowed")]
    TooLong {
        /// The length that was offered.
        length_bytes: usize,
    },
    /// Only `[A-Za-z0-9:_.@/-]` is allowed, so keys are safe in URLs, logs and ids.
    #[error("key contains {character:?}; allowed are A-Z a-z 0-9 and : _ . @ / -")]
    BadCharacter {
        /// The first character outside the allowed set.
        character: char,
    },
    /// A component of a standard key (provider, model, tenant) must not be empty
    /// or contain `:`, or two different inputs would build the same key.
    #[error("key component {component:?} must be non-empty and must not contain ':'")]
    BadComponent {
        /// The offending component.
        component: String,
    },
}

/// A validated limit key such as `global:llm:openai:gpt-4o:tpm`.
///
/// A `LimitKey` can only be built through validation, so every key held by the
/// program is 1..=256 bytes of `[A-Za-z0-9:_.@/-]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct LimitKey(String);

impl LimitKey {
    /// Validates `key` and wraps it.
    pub fn new(key: impl Into<String>) -> Result<Self, KeyError> {
        let key = key.into();
        if key.is_empty() {
            return Err(KeyError::Empty);
        }
        if key.len() > KEY_BYTES_MAX {
            return Err(KeyError::TooLong {
                length_bytes: key.len(),
            });
        }
        if let Some(character) = key.chars().find(|c| !is_key_char(*c)) {
            return Err(KeyError::BadCharacter { character });
        }
        Ok(Self(key))
    }

    /// `global:llm:<provider>:<model>:rpm`: requests per window for one model.
    pub fn llm_rpm(provider: &str, model: &str) -> Result<Self, KeyError> {
        Self::llm_global(provider, model, "rpm")
    }

    /// `global:llm:<provider>:<model>:tpm`: tokens per window for one model.
    pub fn llm_tpm(provider: &str, model: &str) -> Result<Self, KeyError> {
        Self::llm_global(provider, model, "tpm")
    }

    /// `global:llm:<provider>:<model>:concurrency`: calls in flight for one model.
    pub fn llm_concurrency(provider: &str, model: &str) -> Result<Self, KeyError> {
        Self::llm_global(provider, model, "concurrency")
    }

    /// `global:llm:<provider>:<model>:<dimension>`: another limit of one model, such
    /// as a provider profile's `itpm`, `otpm` or `rpd` (`crate::profile`).
    pub fn llm_dimension(provider: &str, model: &str, dimension: &str) -> Result<Self, KeyError> {
        check_component(dimension)?;
        Self::llm_global(provider, model, dimension)
    }

    /// `tenant:<tenant_id>:llm:daily_tokens`: one tenant's token budget.
    pub fn tenant_daily_tokens(tenant_id: &str) -> Result<Self, KeyError> {
        check_component(tenant_id)?;
        Self::new(format!("tenant:{tenant_id}:llm:daily_tokens"))
    }

    fn llm_global(provider: &str, model: &str, dimension: &str) -> Result<Self, KeyError> {
        check_component(provider)?;
        check_component(model)?;
        Self::new(format!("global:llm:{provider}:{model}:{dimension}"))
    }

    /// The key as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn is_key_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, ':' | '_' | '.' | '@' | '/' | '-')
}

fn check_component(component: &str) -> Result<(), KeyError> {
    if component.is_empty() || component.contains(':') {
        return Err(KeyError::BadComponent {
            component: component.to_owned(),
        });
    }
    Ok(())
}

impl TryFrom<String> for LimitKey {
    type Error = KeyError;

    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl std::str::FromStr for LimitKey {
    type Err = KeyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl From<LimitKey> for String {
    fn from(key: LimitKey) -> Self {
        key.0
    }
}

impl AsRef<str> for LimitKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LimitKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_keys_have_the_spec_shape() {
        assert_eq!(
            LimitKey::llm_rpm("openai", "gpt-4o").unwrap().as_str(),
            "global:llm:openai:gpt-4o:rpm"
        );
        assert_eq!(
            LimitKey::llm_tpm("openai", "gpt-4o").unwrap().as_str(),
            "global:llm:openai:gpt-4o:tpm"
        );
        assert_eq!(
            LimitKey::llm_concurrency("anthropic", "claude-3.5").unwrap().as_str(),
            "global:llm:anthropic:claude-3.5:concurrency"
        );
        assert_eq!(
            LimitKey::tenant_daily_tokens("tenant_a").unwrap().as_str(),
            "tenant:tenant_a:llm:daily_tokens"
        );
    }

    #[test]
    fn components_must_not_be_empty_or_contain_colons() {
        assert!(matches!(LimitKey::llm_rpm("", "m"), Err(KeyError::BadComponent { .. })));
        assert!(matches!(
            LimitKey::llm_tpm("a:b", "m"),
            Err(KeyError::BadComponent { .. })
        ));
        assert!(matches!(
            LimitKey::tenant_daily_tokens("t:x"),
            Err(KeyError::BadComponent { .. })
        ));
        assert!(matches!(
            LimitKey::llm_rpm("open ai", "m"),
            Err(KeyError::BadCharacter { character: ' ' })
        ));
    }

    #[test]
    fn validation_bounds_length_and_characters() {
        assert_eq!(LimitKey::new(""), Err(KeyError::Empty));
        assert!(LimitKey::new("a".repeat(KEY_BYTES_MAX)).is_ok());
        assert_eq!(
            LimitKey::new("a".repeat(KEY_BYTES_MAX + 1)),
            Err(KeyError::TooLong {
                length_bytes: KEY_BYTES_MAX + 1
            })
        );
        assert!(LimitKey::new("a-Z_0.9@x/y:z").is_ok());
        for bad in ["a b", "a\u{e9}", "a?b", "a\nb", "a%20"] {
            assert!(
                matches!(LimitKey::new(bad), Err(KeyError::BadCharacter { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn serde_validates() {
        let key: LimitKey = serde_json::from_str("\"tenant:a:llm:daily_tokens\"").unwrap();
        assert_eq!(serde_json::to_string(&key).unwrap(), "\"tenant:a:llm:daily_tokens\"");
        assert!(serde_json::from_str::<LimitKey>("\"bad key\"").is_err());
        assert!(serde_json::from_str::<LimitKey>("\"\"").is_err());
    }
}
