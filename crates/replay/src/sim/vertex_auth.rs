//! Google's OAuth token endpoint for a service account, as the simulator plays
//! it, and the check of the access tokens it issued
//! (<https://developers.google.com/identity/protocols/oauth2/service-account#httprest>).
//!
//! `POST /token` takes the form `grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer&assertion=JWT`;
//! the assertion must be signed RS256 by the configured service account's key,
//! name the account in `iss`, Google's token endpoint or this endpoint's own
//! URL in `aud`, the
//! `cloud-platform` scope, and an `iat`..`exp` of at most an hour around now.
//! The answer is `{"access_token", "expires_in", "token_type": "Bearer"}`, an
//! opaque token of the configured lifetime; a bad assertion is Google's 400
//! `{"error": "invalid_grant", "error_description": ...}`. A Vertex AI call
//! whose bearer token is missing, unknown or expired is Google's 401
//! `UNAUTHENTICATED` ([`unauthenticated`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ring::signature::{KeyPair, RsaKeyPair, UnparsedPublicKey, RSA_PKCS1_2048_8192_SHA256};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::PrivatePkcs8KeyDer;

/// The audience Google documents for every assertion ("When making an access
/// token request this value is always `https://oauth2.googleapis.com/token`"),
/// which google-auth sends whatever the key file's `token_uri`.
pub const GOOGLE_TOKEN_AUDIENCE: &str = "https://oauth2.googleapis.com/token";
/// The grant type of a service account's assertion (RFC 7523).
pub const JWT_BEARER_GRANT: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
/// The scope Vertex AI's calls need.
pub const CLOUD_PLATFORM_SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";
/// The longest an assertion may be valid, in seconds: "a maximum of 1 hour after the issued time".
pub const ASSERTION_LIFETIME_S_MAX: u64 = 3_600;
/// How far ahead of the simulator's clock an assertion's `iat` may be, in
/// seconds: clocks of one machine agree; a minute covers a client's skew.
pub const CLOCK_SKEW_S_MAX: u64 = 60;
/// The lifetime of an issued token by default, in seconds: Google's ("expires_in": 3599 or 3600).
pub const TOKEN_LIFETIME_S_DEFAULT: u64 = 3_600;
/// The most tokens remembered: the expired ones are dropped at each issue;
/// past this many live ones, the oldest go.
pub const TOKENS_MAX: usize = 100_000;

/// The service account the token endpoint trusts, and the tokens it issued.
#[derive(Debug)]
pub struct VertexAuth {
    account: Option<Account>,
    lifetime_s: u64,
    tokens: Mutex<HashMap<String, u64>>,
    issued: AtomicU64,
    refused_tokens: AtomicU64,
}

#[derive(Debug)]
struct Account {
    client_email: String,
    public_key: Vec<u8>,
}

impl Default for VertexAuth {
    /// No service account: every assertion and every Vertex AI call is refused.
    fn default() -> Self {
        Self {
            account: None,
            lifetime_s: TOKEN_LIFETIME_S_DEFAULT,
            tokens: Mutex::new(HashMap::new()),
            issued: AtomicU64::new(0),
            refused_tokens: AtomicU64::new(0),
        }
    }
}

impl VertexAuth {
    /// Trusts the service account of the key file `key_file` (its
    /// `client_email`, and the public half of its `private_key`), issuing
    /// tokens that last `lifetime_s`. The error names the field, never a value.
    pub fn from_key_file(key_file: &[u8], lifetime_s: u64) -> Result<Self, String> {
        if lifetime_s == 0 {
            return Err("the token lifetime must be at least 1 s".to_owned());
        }
        let file: serde_json::Value = serde_json::from_slice(key_file).map_err(|_| "not a JSON key file".to_owned())?;
        let field = |name: &str| {
            (file[name].as_str())
                .filter(|v| !v.is_empty())
                .ok_or_else(|| format!("the field {name} is missing"))
        };
        let client_email = field("client_email")?.to_owned();
        let der = PrivatePkcs8KeyDer::from_pem_slice(field("private_key")?.as_bytes())
            .map_err(|_| "the field private_key is not a PEM PKCS#8 key".to_owned())?;
        let key = RsaKeyPair::from_pkcs8(der.secret_pkcs8_der())
            .map_err(|_| "the field private_key is not an RSA key of 2048 to 8192 bits".to_owned())?;
        Ok(Self {
            account: Some(Account {
                client_email,
                public_key: key.public_key().as_ref().to_vec(),
            }),
            lifetime_s,
            ..Self::default()
        })
    }

    /// Tokens issued since the start.
    pub fn issued(&self) -> u64 {
        self.issued.load(Ordering::SeqCst)
    }

    /// Calls refused for a missing, unknown or expired token since the start.
    pub fn refused_tokens(&self) -> u64 {
        self.refused_tokens.load(Ordering::SeqCst)
    }

    /// `POST /token` at `now_ms`, reached as `http(s)://{host}/token`.
    pub fn token(&self, host: &str, form: &str, now_ms: u64) -> Response {
        let verified = self
            .verify(host, form, now_ms / 1_000)
            .and_then(|()| self.issue(now_ms));
        match verified {
            Ok(token) => Json(serde_json::json!({
                "access_token": token, "expires_in": self.lifetime_s, "token_type": "Bearer",
            }))
            .into_response(),
            Err(description) => {
                let body = serde_json::json!({"error": "invalid_grant", "error_description": description});
                (StatusCode::BAD_REQUEST, Json(body)).into_response()
            }
        }
    }

    /// Checks the form's assertion: its signature by the account's key, then its claims.
    fn verify(&self, host: &str, form: &str, now_s: u64) -> Result<(), String> {
        let account = self.account.as_ref().ok_or("no service account is configured")?;
        let field = |name: &str| {
            form.split('&')
                .filter_map(|pair| pair.split_once('='))
                .find(|(key, _)| *key == name)
                .map(|(_, value)| {
                    percent_encoding::percent_decode_str(&value.replace('+', " "))
                        .decode_utf8_lossy()
                        .into_owned()
                })
        };
        if field("grant_type").as_deref() != Some(JWT_BEARER_GRANT) {
            return Err(format!("grant_type must be {JWT_BEARER_GRANT}"));
        }
        let assertion = field("assertion").ok_or("the assertion is missing")?;
        let mut parts = assertion.split('.');
        let (Some(header), Some(claims), Some(signature), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err("the assertion is not a JWT".to_owned());
        };
        let decode = |part: &str| {
            URL_SAFE_NO_PAD
                .decode(part)
                .map_err(|_| "the assertion is not base64url".to_owned())
        };
        let json = |bytes: Vec<u8>| -> Result<serde_json::Value, String> {
            serde_json::from_slice(&bytes).map_err(|_| "the assertion's JSON is malformed".to_owned())
        };
        if json(decode(header)?)?["alg"] != "RS256" {
            return Err("the assertion's alg must be RS256".to_owned());
        }
        UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, &account.public_key)
            .verify(format!("{header}.{claims}").as_bytes(), &decode(signature)?)
            .map_err(|_| "Invalid JWT Signature.".to_owned())?;
        check_claims(&json(decode(claims)?)?, &account.client_email, host, now_s)
    }

    /// A new opaque token, remembered until it expires.
    fn issue(&self, now_ms: u64) -> Result<String, String> {
        let n = self.issued.fetch_add(1, Ordering::SeqCst) + 1;
        let token = format!("ya29.sim-{n}-{now_ms}");
        let mut tokens = self.tokens.lock().expect("tokens lock");
        tokens.retain(|_, expires_ms| *expires_ms > now_ms);
        if tokens.len() >= TOKENS_MAX {
            let oldest = tokens.iter().min_by_key(|(_, e)| **e).map(|(t, _)| t.clone());
            tokens.remove(&oldest.expect("full"));
        }
        tokens.insert(token.clone(), now_ms + self.lifetime_s * 1_000);
        Ok(token)
    }

    /// Checks a Vertex AI call's `Authorization: Bearer` at `now_ms`; `Err` is
    /// Google's 401 to answer.
    pub fn authorize(&self, headers: &HeaderMap, now_ms: u64) -> Result<(), Box<Response>> {
        let sent = (headers.get("authorization").and_then(|v| v.to_str().ok())).and_then(|v| v.strip_prefix("Bearer "));
        let tokens = self.tokens.lock().expect("tokens lock");
        let valid = sent
            .and_then(|t| tokens.get(t))
            .is_some_and(|expires_ms| now_ms < *expires_ms);
        if valid {
            return Ok(());
        }
        self.refused_tokens.fetch_add(1, Ordering::SeqCst);
        Err(Box::new(unauthenticated()))
    }
}

/// The claims of a service account's assertion: `iss` the account, `aud`
/// Google's token endpoint or this one, the `cloud-platform` scope, issued at most [`CLOCK_SKEW_S_MAX`]
/// ahead, not expired, and valid for at most an hour.
fn check_claims(claims: &serde_json::Value, client_email: &str, host: &str, now_s: u64) -> Result<(), String> {
    if claims["iss"] != client_email {
        return Err("the assertion's iss is not the service account".to_owned());
    }
    let audience = claims["aud"].as_str().unwrap_or_default();
    let own = [format!("http://{host}/token"), format!("https://{host}/token")];
    if audience != GOOGLE_TOKEN_AUDIENCE && !own.iter().any(|a| a == audience) {
        return Err("Invalid JWT: the aud claim is not this token endpoint".to_owned());
    }
    let scopes = claims["scope"].as_str().unwrap_or_default();
    if !scopes.split(' ').any(|s| s == CLOUD_PLATFORM_SCOPE) {
        return Err("the assertion does not ask for the cloud-platform scope".to_owned());
    }
    let (Some(iat), Some(exp)) = (claims["iat"].as_u64(), claims["exp"].as_u64()) else {
        return Err("the assertion's iat and exp must be whole seconds".to_owned());
    };
    if iat > now_s + CLOCK_SKEW_S_MAX || exp <= now_s || exp < iat || exp - iat > ASSERTION_LIFETIME_S_MAX {
        return Err(
            "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe".to_owned(),
        );
    }
    Ok(())
}

/// Google's 401 for a missing, unknown or expired access token
/// (<https://cloud.google.com/apis/design/errors#http_mapping>).
pub fn unauthenticated() -> Response {
    let body = serde_json::json!({"error": {"code": 401,
        "message": "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid authentication credential. See https://developers.google.com/identity/sign-in/web/devconsole-project.",
        "status": "UNAUTHENTICATED"}});
    (StatusCode::UNAUTHORIZED, Json(body)).into_response()
}

#[cfg(test)]
#[path = "vertex_auth_tests.rs"]
mod tests;
