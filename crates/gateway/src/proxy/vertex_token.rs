//! A Vertex AI upstream's OAuth access token: made from the service account's
//! key ([`ServiceAccount`]), exchanged at the key file's own `token_uri`
//! (<https://developers.google.com/identity/protocols/oauth2/service-account#httprest>),
//! cached, and renewed before it expires.
//!
//! - Renewal starts at the first call once at most min(5 minutes, a tenth of
//!   the token's lifetime) is left ([`renew_before_ms`]); calls keep the current
//!   token meanwhile and never wait on it. Only a call that finds no valid token
//!   waits, and on the one exchange in flight (single flight: N callers, one
//!   exchange).
//! - A token is handed out only while more than [`send_margin_ms`] of it is
//!   left, so that it is still valid when the call reaches Google.
//! - A failed exchange keeps the old token while it is valid and is retried,
//!   by the next call, after a backoff that doubles from
//!   [`RENEW_RETRY_MS_MIN`] to [`RENEW_RETRY_MS_MAX`]; a call with no valid
//!   token during the backoff fails at once with the last failure's reason.
//! - Neither the token nor the key is logged or put in an error.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::http::{HeaderValue, Method, Request};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use ratelimiter::{Clock, SystemClock};

use crate::config::UpstreamConfig;
use crate::proxy::connector::{https_connector, webpki_roots};
use crate::proxy::credentials::{CredentialsError, VertexTokenSource};
use crate::proxy::service_account::{ServiceAccount, CLOUD_PLATFORM_SCOPE};

/// The most of a token's lifetime left when its renewal starts: Google's
/// client libraries renew 5 minutes ahead (and the tokens last an hour).
pub const RENEW_BEFORE_MS_MAX: u64 = 5 * 60_000;
/// Of a shorter token's lifetime, the share left when its renewal starts (one
/// tenth), so that a short-lived token is not renewed on every call.
pub const RENEW_BEFORE_DIVISOR: u64 = 10;
/// The most of a token's lifetime kept unused at its end, so that a token
/// handed to a call is still valid when the call reaches Google: a call's
/// headers leave within a second; ten leave room for a slow connection.
pub const SEND_MARGIN_MS_MAX: u64 = 10_000;
/// Of a shorter token's lifetime, the share kept unused at its end (a
/// twentieth: half the renewal's lead, so renewal always starts first).
pub const SEND_MARGIN_DIVISOR: u64 = 20;
/// The first wait before a failed exchange is tried again: long enough not to
/// hammer a token endpoint that is down, short enough that a blip costs little.
pub const RENEW_RETRY_MS_MIN: u64 = 1_000;
/// The longest wait between two tries: renewal starts 5 minutes before the
/// hour's end, so at least four more tries fit before the token expires.
pub const RENEW_RETRY_MS_MAX: u64 = 60_000;
/// The largest token answer read, in bytes: Google's is under 2 KB.
pub const TOKEN_ANSWER_BYTES_MAX: usize = 64 * 1024;
/// The longest lifetime believed, in seconds: Google's tokens last an hour
/// (at most 12 hours when extended); a larger `expires_in` is not Google's.
pub const TOKEN_LIFETIME_S_MAX: u64 = 12 * 3_600;
/// The most characters of the token endpoint's `error` field kept in a reason.
const ERROR_CODE_CHARS_MAX: usize = 80;
/// How long one exchange may take: Google answers in well under a second; a
/// call waiting for its first token gives up after this.
pub const EXCHANGE_TIMEOUT_MS: u64 = 10_000;
/// The environment variable naming the key file when `credentials_file` is
/// not given, as Google's client libraries read it
/// (<https://cloud.google.com/docs/authentication/application-default-credentials>).
pub const CREDENTIALS_ENV: &str = "GOOGLE_APPLICATION_CREDENTIALS";

/// How long before its expiry a token of `lifetime_ms` is renewed.
pub fn renew_before_ms(lifetime_ms: u64) -> u64 {
    RENEW_BEFORE_MS_MAX.min(lifetime_ms / RENEW_BEFORE_DIVISOR)
}

/// How much of a token of `lifetime_ms` is kept unused at its end.
pub fn send_margin_ms(lifetime_ms: u64) -> u64 {
    SEND_MARGIN_MS_MAX.min(lifetime_ms / SEND_MARGIN_DIVISOR)
}

/// Why a call has no access token to send.
#[derive(Debug, thiserror::Error)]
#[error("gateway upstream {upstream}: no valid Vertex AI access token: {reason}")]
pub struct TokenError {
    /// The upstream's name.
    pub upstream: String,
    /// The last exchange's failure (a status or a transport error, never a secret).
    pub reason: String,
}

/// The cached access token of one Vertex AI upstream; clones share it.
#[derive(Clone)]
pub struct VertexToken {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for VertexToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VertexToken")
            .field("upstream", &self.inner.upstream)
            .field("account", &self.inner.account)
            .finish_non_exhaustive()
    }
}

/// The token endpoint's client: its own small pool (an exchange an hour).
type TokenClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

struct Inner {
    upstream: String,
    account: ServiceAccount,
    client: TokenClient,
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
    /// Woken when an exchange ends, for the calls waiting on it.
    renewed: tokio::sync::Notify,
    exchanges: AtomicU64,
}

/// The token and the renewal's bookkeeping; its lock is never held across an `.await`.
#[derive(Default)]
struct State {
    token: Option<Token>,
    renewing: bool,
    failures: u32,
    retry_at_ms: u64,
    last_error: Option<String>,
}

struct Token {
    header: HeaderValue,
    renew_at_ms: u64,
    usable_until_ms: u64,
}

impl VertexToken {
    /// The token source of upstream `upstream`, signing with `account`,
    /// reading time from `clock`, exchanging over a client of its own that
    /// trusts Mozilla's roots. No exchange is made before the first call.
    pub fn new(upstream: &str, account: ServiceAccount, clock: Arc<dyn Clock>) -> Self {
        let client = Client::builder(TokioExecutor::new()).build(https_connector(webpki_roots()));
        let inner = Inner {
            upstream: upstream.to_owned(),
            account,
            client,
            clock,
            state: Mutex::new(State::default()),
            renewed: tokio::sync::Notify::new(),
            exchanges: AtomicU64::new(0),
        };
        Self { inner: Arc::new(inner) }
    }

    /// The token source of a `vertex` upstream: its `credentials_file`, else
    /// the file `GOOGLE_APPLICATION_CREDENTIALS` names, read and checked now (a
    /// start-up error names the upstream, the file and the field at fault);
    /// on the system clock.
    pub fn of_upstream(config: &UpstreamConfig) -> Result<Self, String> {
        let path = match &config.credentials_file {
            Some(path) => path.clone(),
            None => std::env::var(CREDENTIALS_ENV)
                .ok()
                .filter(|p| !p.is_empty())
                .ok_or_else(|| {
                    format!(
                        "gateway upstream {}: no credentials_file, and {CREDENTIALS_ENV} is not set",
                        config.name
                    )
                })?,
        };
        let account = ServiceAccount::from_file(&config.name, std::path::Path::new(&path))?;
        Ok(Self::new(&config.name, account, Arc::new(SystemClock::new())))
    }

    /// Exchanges made so far, answered or not.
    pub fn exchanges(&self) -> u64 {
        self.inner.exchanges.load(Ordering::SeqCst)
    }

    /// `Authorization: Bearer {token}` with a token valid for more than its
    /// send margin, starting its renewal in the background when it is due.
    pub async fn header(&self) -> Result<HeaderValue, TokenError> {
        let mut waited = false;
        loop {
            let notified = self.inner.renewed.notified();
            tokio::pin!(notified);
            // Registered before the state is read: an exchange that ends between
            // the read and the wait still wakes this call.
            notified.as_mut().enable();
            {
                let mut state = self.inner.state.lock().expect("token lock");
                let now_ms = self.inner.clock.now_unix_ms();
                if let Some(token) = state.token.as_ref().filter(|t| now_ms < t.usable_until_ms) {
                    let header = token.header.clone();
                    if now_ms >= token.renew_at_ms && !state.renewing && now_ms >= state.retry_at_ms {
                        state.renewing = true;
                        self.start_renewal();
                    }
                    return Ok(header);
                }
                if !state.renewing {
                    if waited || now_ms < state.retry_at_ms {
                        return Err(self.error(state.last_error.clone()));
                    }
                    state.renewing = true;
                    self.start_renewal();
                }
            }
            notified.await;
            waited = true;
        }
    }

    fn error(&self, reason: Option<String>) -> TokenError {
        TokenError {
            upstream: self.inner.upstream.clone(),
            reason: reason.unwrap_or_else(|| "the token has expired".to_owned()),
        }
    }

    /// Runs one exchange on its own task: a caller that gives up does not
    /// abandon it.
    fn start_renewal(&self) {
        tokio::spawn(Arc::clone(&self.inner).renew());
    }
}

#[async_trait::async_trait]
impl VertexTokenSource for VertexToken {
    async fn header(&self) -> Result<HeaderValue, CredentialsError> {
        VertexToken::header(self)
            .await
            .map_err(|e| CredentialsError(e.to_string()))
    }
}

impl Inner {
    async fn renew(self: Arc<Self>) {
        let sent_ms = self.clock.now_unix_ms();
        self.exchanges.fetch_add(1, Ordering::SeqCst);
        // The whole exchange, its answer's body included, is bounded: the calls
        // waiting for a first token wait on it.
        let timeout = std::time::Duration::from_millis(EXCHANGE_TIMEOUT_MS);
        let result = match tokio::time::timeout(timeout, self.exchange(sent_ms)).await {
            Ok(result) => result,
            Err(_) => Err(format!("the token endpoint did not answer in {EXCHANGE_TIMEOUT_MS} ms")),
        };
        let mut state = self.state.lock().expect("token lock");
        state.renewing = false;
        match result {
            Ok((header, lifetime_ms)) => {
                // Counted from when the assertion left: never later than Google's count.
                let expires_ms = sent_ms + lifetime_ms;
                state.token = Some(Token {
                    header,
                    renew_at_ms: expires_ms - renew_before_ms(lifetime_ms),
                    usable_until_ms: expires_ms - send_margin_ms(lifetime_ms),
                });
                (state.failures, state.retry_at_ms, state.last_error) = (0, 0, None);
            }
            Err(reason) => {
                state.failures = state.failures.saturating_add(1);
                let doublings = (state.failures - 1).min(u64::BITS - 1);
                let wait_ms = RENEW_RETRY_MS_MIN
                    .saturating_mul(1 << doublings)
                    .min(RENEW_RETRY_MS_MAX);
                state.retry_at_ms = self.clock.now_unix_ms() + wait_ms;
                tracing::warn!(upstream = %self.upstream, %reason, retry_in_ms = wait_ms,
                    "Vertex AI access token exchange failed");
                state.last_error = Some(reason);
            }
        }
        drop(state);
        self.renewed.notify_waiters();
    }

    /// One exchange: the signed assertion for a token and its lifetime in ms.
    async fn exchange(&self, now_ms: u64) -> Result<(HeaderValue, u64), String> {
        let assertion = self.account.assertion(now_ms / 1_000, CLOUD_PLATFORM_SCOPE);
        // The grant type's `:` escaped; the assertion is base64url and dots.
        let body = format!("grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion={assertion}");
        let request = Request::builder()
            .method(Method::POST)
            .uri(&self.account.token_uri)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(Full::new(Bytes::from(body)))
            .map_err(|_| "the key file's token_uri is not a valid request URL".to_owned())?;
        let response = match self.client.request(request).await {
            Err(e) if e.is_connect() => return Err(format!("the token endpoint is unreachable: {e}")),
            Err(e) => return Err(format!("the token exchange failed: {e}")),
            Ok(response) => response,
        };
        let status = response.status();
        let body = Limited::new(response.into_body(), TOKEN_ANSWER_BYTES_MAX)
            .collect()
            .await
            .map_err(|e| format!("the token answer could not be read: {e}"))?
            .to_bytes();
        let answer: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        if !status.is_success() {
            // Google's `error` is a code such as `invalid_grant`: safe to keep.
            let code: String = answer["error"]
                .as_str()
                .unwrap_or("")
                .chars()
                .take(ERROR_CODE_CHARS_MAX)
                .collect();
            return Err(format!("the token endpoint answered {status} {code}")
                .trim_end()
                .to_owned());
        }
        parse_answer(&answer)
    }
}

/// `{access_token, expires_in, token_type: "Bearer"}` as the header to send
/// and the lifetime in ms.
fn parse_answer(answer: &serde_json::Value) -> Result<(HeaderValue, u64), String> {
    let token = answer["access_token"].as_str().filter(|t| !t.is_empty());
    let lifetime_s = answer["expires_in"]
        .as_u64()
        .filter(|s| (1..=TOKEN_LIFETIME_S_MAX).contains(s));
    let bearer = answer["token_type"]
        .as_str()
        .is_some_and(|t| t.eq_ignore_ascii_case("bearer"));
    let (Some(token), Some(lifetime_s), true) = (token, lifetime_s, bearer) else {
        return Err(format!(
            "the token answer lacks a bearer access_token or an expires_in of 1..={TOKEN_LIFETIME_S_MAX} s"
        ));
    };
    let mut header = HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|_| "the access token is not a valid header value".to_owned())?;
    header.set_sensitive(true);
    Ok((header, lifetime_s * 1_000))
}

#[cfg(test)]
#[path = "vertex_token_tests.rs"]
mod tests;
