//! `server.client_tokens` entries (docs/http-api.md, "Authentication"): a plain
//! token may reserve and complete on every key; a token read from the
//! environment may be scoped to key prefixes, so that a service holding it
//! cannot reserve on, or complete with, another service's or tenant's keys.

use ratelimiter::LimitKey;
use serde::Deserialize;

/// The most prefixes of one scoped token: each is compared per key per request.
pub const KEY_PREFIXES_MAX: usize = 32;

/// One `client_tokens` entry.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum ClientTokenConfig {
    /// The token itself: every key.
    Plain(String),
    /// A token read from the environment, scoped or not.
    FromEnv(ScopedTokenConfig),
}

impl From<String> for ClientTokenConfig {
    fn from(token: String) -> Self {
        ClientTokenConfig::Plain(token)
    }
}

/// `{token_env: ..., key_prefixes: [...]}`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ScopedTokenConfig {
    /// The environment variable holding the token (trimmed of surrounding whitespace).
    pub token_env: String,
    /// The key prefixes the token may use; absent: every key.
    #[serde(default)]
    pub key_prefixes: Option<Vec<String>>,
}

/// What a token may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyScope {
    /// Every key.
    All,
    /// Keys starting with one of these.
    Prefixes(std::sync::Arc<[String]>),
}

/// The characters that end a key's segment: a prefix ending with one covers
/// exactly the keys under it.
const KEY_SEPARATORS: [char; 2] = [':', '/'];

impl KeyScope {
    /// The prefixes that do not end with a separator: `svc:a` also covers
    /// `svc:ab:rpm`, which is rarely meant (warned at startup).
    pub fn unterminated_prefixes(&self) -> Vec<&str> {
        match self {
            KeyScope::All => Vec::new(),
            KeyScope::Prefixes(prefixes) => prefixes
                .iter()
                .filter(|p| !p.ends_with(KEY_SEPARATORS))
                .map(String::as_str)
                .collect(),
        }
    }

    /// `Err` with the first key of `keys` outside the scope.
    pub fn check<'a>(&self, keys: impl IntoIterator<Item = &'a LimitKey>) -> Result<(), &'a LimitKey> {
        let KeyScope::Prefixes(prefixes) = self else {
            return Ok(());
        };
        for key in keys {
            if !prefixes.iter().any(|p| key.as_str().starts_with(p.as_str())) {
                return Err(key);
            }
        }
        Ok(())
    }
}

impl ClientTokenConfig {
    /// The token and its scope, the environment read; the error says what is wrong
    /// (the caller names the entry).
    pub fn resolve(&self) -> Result<(String, KeyScope), String> {
        let entry = match self {
            ClientTokenConfig::Plain(token) => return Ok((token.clone(), KeyScope::All)),
            ClientTokenConfig::FromEnv(entry) => entry,
        };
        let token = std::env::var(&entry.token_env)
            .map_err(|_| format!("environment variable {} is not set", entry.token_env))?
            .trim()
            .to_owned();
        let Some(prefixes) = &entry.key_prefixes else {
            return Ok((token, KeyScope::All));
        };
        if prefixes.is_empty() || prefixes.len() > KEY_PREFIXES_MAX {
            return Err(format!(
                "key_prefixes: give 1..={KEY_PREFIXES_MAX} prefixes (leave it out for every key)"
            ));
        }
        for prefix in prefixes {
            if prefix.is_empty() || LimitKey::new(prefix.as_str()).is_err() {
                return Err(format!("key_prefixes: {prefix:?} is not the start of a valid key"));
            }
        }
        Ok((token, KeyScope::Prefixes(prefixes.clone().into())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_and_scoped_entries_parse_and_resolve() {
        std::env::set_var("CLIENT_TOKENS_TEST_SEARCH", "search-token-0123456789\n");
        let entries: Vec<ClientTokenConfig> = serde_yaml::from_str(
            "[plain-token-0123456789, {token_env: CLIENT_TOKENS_TEST_SEARCH, key_prefixes: [\"svc:search:\"]}]",
        )
        .unwrap();
        assert_eq!(
            entries[0].resolve().unwrap(),
            ("plain-token-0123456789".into(), KeyScope::All)
        );
        let (token, scope) = entries[1].resolve().unwrap();
        assert_eq!(token, "search-token-0123456789");
        let inside = LimitKey::new("svc:search:rpm").unwrap();
        let outside = LimitKey::new("svc:billing:rpm").unwrap();
        assert_eq!(scope.check([&inside]), Ok(()));
        assert_eq!(scope.check([&inside, &outside]), Err(&outside));
        let empty: ClientTokenConfig =
            serde_yaml::from_str("{token_env: CLIENT_TOKENS_TEST_SEARCH, key_prefixes: []}").unwrap();
        assert!(empty.resolve().unwrap_err().contains("key_prefixes"));
        let unset: ClientTokenConfig = serde_yaml::from_str("{token_env: CLIENT_TOKENS_TEST_UNSET}").unwrap();
        assert!(unset.resolve().unwrap_err().contains("CLIENT_TOKENS_TEST_UNSET"));
    }

    #[test]
    fn prefixes_without_their_separator_are_reported() {
        let scope = KeyScope::Prefixes(vec!["svc:a".to_owned(), "svc:b:".to_owned(), "tenant/x/".to_owned()].into());
        assert_eq!(scope.unterminated_prefixes(), ["svc:a"]);
        assert!(KeyScope::All.unterminated_prefixes().is_empty());
    }
}
