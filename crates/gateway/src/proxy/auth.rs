//! Tenants by gateway key (docs/gateway.md, "Tenants"): the key each SDK sends
//! (`Authorization: Bearer` for OpenAI's, `x-api-key` for Anthropic's) is compared
//! with every tenant's in constant time, and is never logged.

use axum::http::header::AUTHORIZATION;
use axum::http::{HeaderMap, HeaderName};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::{TenantConfig, TENANT_KEY_BYTES_MIN};

/// One tenant's key, kept as its SHA-256: comparing digests takes the same time
/// whatever the lengths, and the key itself is not kept in memory dumps.
#[derive(Clone)]
pub struct TenantKey {
    digest: [u8; 32],
}

impl std::fmt::Debug for TenantKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TenantKey(<redacted>)")
    }
}

impl TenantKey {
    /// Keeps `key`'s digest.
    pub fn new(key: &str) -> Self {
        Self {
            digest: Sha256::digest(key.as_bytes()).into(),
        }
    }
}

/// Reads every tenant's key from its environment variable, trimmed of surrounding
/// whitespace (a key file read with its trailing newline must not lock its tenant
/// out). An unset variable, an empty or short key, and two tenants with one key
/// (the second would be charged for the first's calls) are errors naming them.
pub fn read_tenant_keys(tenants: &[TenantConfig]) -> Result<Vec<TenantKey>, String> {
    let mut keys: Vec<TenantKey> = Vec::with_capacity(tenants.len());
    for (i, tenant) in tenants.iter().enumerate() {
        let name = &tenant.name;
        let var = &tenant.api_key_env;
        let raw =
            std::env::var(var).map_err(|_| format!("gateway tenant {name}: environment variable {var} is not set"))?;
        let key = raw.trim();
        if key.is_empty() {
            return Err(format!("gateway tenant {name}: the key in {var} is empty"));
        }
        if key.len() < TENANT_KEY_BYTES_MIN {
            return Err(format!(
                "gateway tenant {name}: the key in {var} is shorter than {TENANT_KEY_BYTES_MIN} bytes"
            ));
        }
        let key = TenantKey::new(key);
        if let Some(j) = keys.iter().position(|k| k.digest == key.digest) {
            let other = &tenants[j];
            return Err(format!(
                "gateway tenants {} ({}) and {name} ({var}) have the same key: each tenant needs its own",
                other.name, other.api_key_env
            ));
        }
        debug_assert_eq!(keys.len(), i);
        keys.push(key);
    }
    Ok(keys)
}

/// The key a request presents: `x-api-key`, else `Authorization: Bearer <key>`.
pub fn presented_key(headers: &HeaderMap) -> Option<&str> {
    // Names made once: a name given as text is parsed again at every lookup.
    const X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");
    if let Some(key) = headers.get(X_API_KEY).and_then(|v| v.to_str().ok()) {
        return Some(key.trim());
    }
    let value = headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, key) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| key.trim())
}

/// The index of the tenant whose key is `presented`: every key is compared, in
/// constant time, so the answer's timing tells nothing about which came close.
pub fn find_tenant(keys: &[TenantKey], presented: &str) -> Option<usize> {
    let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
    let mut found = None;
    for (i, key) in keys.iter().enumerate() {
        if bool::from(key.digest.ct_eq(&digest)) {
            found = Some(i);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn either_header_names_the_tenant() {
        let keys = [
            TenantKey::new("key-of-acme-0123456789"),
            TenantKey::new("key-of-beta-0123456789"),
        ];
        let mut headers = HeaderMap::new();
        assert_eq!(presented_key(&headers), None);
        headers.insert(
            "authorization",
            HeaderValue::from_static("Bearer key-of-beta-0123456789"),
        );
        assert_eq!(find_tenant(&keys, presented_key(&headers).unwrap()), Some(1));
        headers.insert("x-api-key", HeaderValue::from_static("key-of-acme-0123456789"));
        assert_eq!(find_tenant(&keys, presented_key(&headers).unwrap()), Some(0));
        assert_eq!(find_tenant(&keys, "key-of-acme-012345678"), None);
        assert_eq!(format!("{:?}", keys[0]), "TenantKey(<redacted>)");
    }

    fn tenant(name: &str, var: &str) -> TenantConfig {
        serde_yaml::from_str(&format!("{{name: {name}, api_key_env: {var}}}")).unwrap()
    }

    #[test]
    fn keys_are_trimmed_and_empty_or_shared_keys_refused() {
        std::env::set_var("AUTH_TEST_TRIMMED", "  key-of-acme-0123456789\n");
        std::env::set_var("AUTH_TEST_EMPTY", " \n");
        std::env::set_var("AUTH_TEST_SAME", "key-of-acme-0123456789");
        let keys = read_tenant_keys(&[tenant("acme", "AUTH_TEST_TRIMMED")]).unwrap();
        assert_eq!(find_tenant(&keys, "key-of-acme-0123456789"), Some(0));
        let error = read_tenant_keys(&[tenant("acme", "AUTH_TEST_EMPTY")]).unwrap_err();
        assert!(
            error.contains("acme") && error.contains("AUTH_TEST_EMPTY") && error.contains("empty"),
            "{error}"
        );
        let error =
            read_tenant_keys(&[tenant("acme", "AUTH_TEST_TRIMMED"), tenant("beta", "AUTH_TEST_SAME")]).unwrap_err();
        assert!(
            error.contains("acme") && error.contains("beta") && error.contains("same key"),
            "{error}"
        );
    }
}
