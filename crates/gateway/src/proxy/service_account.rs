//! A Google service account's key file, read and checked at start-up, and the
//! signed assertion (a JWT, RS256) the gateway exchanges for an OAuth access
//! token at the key file's own `token_uri`
//! (<https://developers.google.com/identity/protocols/oauth2/service-account#httprest>).
//!
//! The key never leaves this file: [`ServiceAccount`]'s `Debug` omits it and
//! every error names the upstream, the file and the field, never a value read
//! from it.

use std::path::Path;
use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ring::rand::SystemRandom;
use ring::signature::{RsaKeyPair, RSA_PKCS1_SHA256};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::PrivatePkcs8KeyDer;

/// The scope the token is asked for: Vertex AI's calls need
/// `cloud-platform` (<https://docs.anthropic.com/en/api/claude-on-vertex-ai>,
/// <https://cloud.google.com/vertex-ai/docs/authentication>).
pub const CLOUD_PLATFORM_SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";
/// How long an assertion is good for, in seconds: Google's maximum ("The
/// expiration time of the assertion ... This value has a maximum of 1 hour
/// after the issued time", the page above); it only has to reach `token_uri`.
pub const ASSERTION_LIFETIME_S: u64 = 3_600;
/// The largest key file read, in bytes: a key file is about 2.4 KB; a larger
/// file is the wrong file, and is refused before it is parsed.
pub const KEY_FILE_BYTES_MAX: u64 = 64 * 1024;
/// The `type` of a service account's key file.
pub const SERVICE_ACCOUNT_TYPE: &str = "service_account";

/// A service account's key, as the gateway signs with it.
#[derive(Clone)]
pub struct ServiceAccount {
    /// The account's address: the assertion's `iss` and `sub`.
    pub client_email: String,
    /// The key's id: the assertion header's `kid`.
    pub private_key_id: String,
    /// Where the assertion is exchanged for an access token (its `aud`).
    pub token_uri: String,
    key: Arc<RsaKeyPair>,
}

impl std::fmt::Debug for ServiceAccount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceAccount")
            .field("client_email", &self.client_email)
            .field("token_uri", &self.token_uri)
            .finish_non_exhaustive()
    }
}

/// The fields of a key file the gateway reads; the others (`project_id`,
/// `client_id`, the certificate URLs) are not needed to sign.
#[derive(serde::Deserialize)]
struct KeyFile {
    #[serde(rename = "type")]
    kind: Option<String>,
    client_email: Option<String>,
    private_key: Option<String>,
    private_key_id: Option<String>,
    token_uri: Option<String>,
}

impl ServiceAccount {
    /// Reads the key file at `path` for upstream `upstream`; the error names
    /// both, and the field that is missing or wrong.
    pub fn from_file(upstream: &str, path: &Path) -> Result<Self, String> {
        let context = |what: String| {
            format!(
                "gateway upstream {upstream}: credentials_file {}: {what}",
                path.display()
            )
        };
        let size = std::fs::metadata(path)
            .map_err(|e| context(format!("cannot be read ({})", e.kind())))?
            .len();
        if size > KEY_FILE_BYTES_MAX {
            return Err(context(format!(
                "is {size} bytes, more than a key file's {KEY_FILE_BYTES_MAX}"
            )));
        }
        let text = std::fs::read(path).map_err(|e| context(format!("cannot be read ({})", e.kind())))?;
        Self::from_json(&text).map_err(context)
    }

    /// Parses a key file's text; the error names the field, never its value.
    pub fn from_json(text: &[u8]) -> Result<Self, String> {
        // serde's message quotes the text it stopped at: the position only.
        let file: KeyFile = serde_json::from_slice(text)
            .map_err(|e| format!("not a JSON key file (line {}, column {})", e.line(), e.column()))?;
        let field = |value: Option<String>, name: &str| {
            value
                .filter(|v| !v.trim().is_empty())
                .ok_or_else(|| format!("the field {name} is missing or empty"))
        };
        let kind = field(file.kind, "type")?;
        if kind != SERVICE_ACCOUNT_TYPE {
            return Err(format!(
                "the field type is {kind:?}, not {SERVICE_ACCOUNT_TYPE:?}: only a service account's key is read"
            ));
        }
        let client_email = field(file.client_email, "client_email")?;
        let private_key_id = field(file.private_key_id, "private_key_id")?;
        let token_uri = field(file.token_uri, "token_uri")?;
        if token_uri
            .parse::<hyper::Uri>()
            .ok()
            .and_then(|u| u.host().map(str::len))
            .is_none()
        {
            return Err("the field token_uri is not an absolute URL".to_owned());
        }
        let pem = field(file.private_key, "private_key")?;
        let der = PrivatePkcs8KeyDer::from_pem_slice(pem.as_bytes())
            .map_err(|_| "the field private_key is not a PEM PKCS#8 private key".to_owned())?;
        let key = RsaKeyPair::from_pkcs8(der.secret_pkcs8_der())
            .map_err(|_| "the field private_key is not an RSA key of 2048 to 8192 bits".to_owned())?;
        Ok(Self {
            client_email,
            private_key_id,
            token_uri,
            key: Arc::new(key),
        })
    }

    /// The signed assertion issued at `now_unix_s`: the JWT whose claims ask
    /// `token_uri` for a token of `scope` for this account, good for
    /// [`ASSERTION_LIFETIME_S`].
    pub fn assertion(&self, now_unix_s: u64, scope: &str) -> String {
        let header = serde_json::json!({"alg": "RS256", "typ": "JWT", "kid": self.private_key_id});
        let claims = serde_json::json!({
            "iss": self.client_email, "sub": self.client_email, "aud": self.token_uri,
            "scope": scope, "iat": now_unix_s, "exp": now_unix_s + ASSERTION_LIFETIME_S,
        });
        let signed = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let mut signature = vec![0; self.key.public().modulus_len()];
        self.key
            .sign(
                &RSA_PKCS1_SHA256,
                &SystemRandom::new(),
                signed.as_bytes(),
                &mut signature,
            )
            .expect("a signature the size of the modulus over any message");
        format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::signature::{UnparsedPublicKey, RSA_PKCS1_2048_8192_SHA256};

    /// The test-only key (tests/fixtures/README.md).
    const TEST_KEY: &str = include_str!("../../../../tests/fixtures/vertex-test-only-key.pem");

    /// A key file as Google writes one, with `field` changed (or removed with `None`).
    pub(crate) fn key_file(field: &str, value: Option<&str>) -> String {
        let mut file = serde_json::json!({
            "type": "service_account", "project_id": "acme-ml", "private_key_id": "k1",
            "private_key": TEST_KEY, "client_email": "gw@acme-ml.iam.gserviceaccount.com",
            "client_id": "1", "token_uri": "https://oauth2.googleapis.com/token",
        });
        match value {
            Some(value) => file[field] = value.into(),
            None => drop(file.as_object_mut().unwrap().remove(field)),
        }
        file.to_string()
    }

    #[test]
    fn the_assertion_is_signed_by_the_key_and_asks_for_the_scope_at_the_token_uri() {
        let account = ServiceAccount::from_json(key_file("type", Some("service_account")).as_bytes()).unwrap();
        let jwt = account.assertion(1_700_000_000, CLOUD_PLATFORM_SCOPE);
        let parts: Vec<&str> = jwt.split('.').collect();
        assert_eq!(parts.len(), 3);
        let decode = |part: &str| -> serde_json::Value {
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(part).unwrap()).unwrap()
        };
        assert_eq!(
            decode(parts[0]),
            serde_json::json!({"alg": "RS256", "typ": "JWT", "kid": "k1"})
        );
        let claims = decode(parts[1]);
        assert_eq!(claims["aud"], "https://oauth2.googleapis.com/token");
        assert_eq!(
            (claims["iss"].as_str(), claims["sub"].as_str()),
            (Some(account.client_email.as_str()), Some(account.client_email.as_str()))
        );
        assert_eq!(claims["scope"], CLOUD_PLATFORM_SCOPE);
        assert_eq!(
            claims["exp"].as_u64().unwrap() - claims["iat"].as_u64().unwrap(),
            ASSERTION_LIFETIME_S
        );
        let public = UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, account.key.public().as_ref().to_vec());
        let signature = URL_SAFE_NO_PAD.decode(parts[2]).unwrap();
        let signed = format!("{}.{}", parts[0], parts[1]);
        public.verify(signed.as_bytes(), &signature).unwrap();
        assert!(public.verify(b"another message", &signature).is_err());
    }

    #[test]
    fn a_bad_key_file_names_the_field_and_never_its_value() {
        let cases = [
            ("type", Some("authorized_user"), "the field type"),
            ("client_email", None, "client_email is missing"),
            ("private_key_id", Some(""), "private_key_id is missing or empty"),
            ("token_uri", Some("/token"), "token_uri is not an absolute URL"),
            (
                "private_key",
                Some("-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n-----END PRIVATE KEY-----\n"),
                "private_key is not",
            ),
            ("private_key", Some("not a pem"), "private_key is not a PEM"),
        ];
        for (field, value, expected) in cases {
            let error = ServiceAccount::from_json(key_file(field, value).as_bytes()).unwrap_err();
            assert!(error.contains(expected), "{field}: {error}");
            assert!(!error.contains("c2VjcmV0") && !error.contains("BEGIN"), "{error}");
        }
        let error =
            ServiceAccount::from_json(format!("{{\"private_key\": \"{}\"", &TEST_KEY[..40]).as_bytes()).unwrap_err();
        assert!(
            error.starts_with("not a JSON key file") && !error.contains("BEGIN"),
            "{error}"
        );
    }

    #[test]
    fn a_key_file_error_names_the_upstream_and_the_file() {
        let dir = std::env::temp_dir().join(format!("gw-sa-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("missing.json");
        let error = ServiceAccount::from_file("vertex-east", &missing).unwrap_err();
        assert!(
            error.starts_with("gateway upstream vertex-east: credentials_file ") && error.contains("missing.json"),
            "{error}"
        );
        let bad = dir.join("bad.json");
        std::fs::write(&bad, key_file("client_email", None)).unwrap();
        let error = ServiceAccount::from_file("vertex-east", &bad).unwrap_err();
        assert!(error.contains("bad.json: the field client_email is missing"), "{error}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
