//! Temporary AWS credentials from a web identity (a Kubernetes service
//! account's token, EKS's IRSA): the token file's token exchanged with STS
//! `AssumeRoleWithWebIdentity`
//! (<https://docs.aws.amazon.com/STS/latest/APIReference/API_AssumeRoleWithWebIdentity.html>),
//! held and renewed before it expires. The call needs no signature: the
//! token is the proof.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials as AwsKeys;
use aws_smithy_runtime_api::client::identity::Identity;
use aws_smithy_types::date_time::{DateTime, Format};
use axum::http::{HeaderValue, Request};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};

use super::CredentialsError;
use crate::proxy::connector::{https_connector, webpki_roots};

/// The web identity's token file (<https://docs.aws.amazon.com/sdkref/latest/guide/feature-assume-role-credentials.html>).
pub const TOKEN_FILE_VAR: &str = "AWS_WEB_IDENTITY_TOKEN_FILE";
/// The role assumed.
pub const ROLE_ARN_VAR: &str = "AWS_ROLE_ARN";
/// The session's name (optional).
pub const SESSION_NAME_VAR: &str = "AWS_ROLE_SESSION_NAME";
/// STS's endpoint, when not the region's
/// (<https://docs.aws.amazon.com/sdkref/latest/guide/feature-ss-endpoints.html>).
pub const ENDPOINT_VAR: &str = "AWS_ENDPOINT_URL_STS";
/// The session name without `AWS_ROLE_SESSION_NAME`.
pub const SESSION_NAME_DEFAULT: &str = "ratelimiterd-gateway";
/// Credentials are renewed when this much of their life is left, at the
/// latest: AWS's SDKs renew 5 minutes before expiry.
pub const RENEW_BEFORE_MS: u64 = 300_000;
/// The renewal margin as a fraction of the lifetime, for short-lived ones:
/// renewed with a tenth of their life left when that is shorter.
pub const RENEW_FRACTION_DIVISOR: u32 = 10;
/// The longest STS answer read.
pub const ANSWER_BYTES_MAX: usize = 64 * 1024;
/// How long an STS call may take.
pub const STS_TIMEOUT_MS: u64 = 10_000;

/// Credentials held, with when they expire and when they are renewed.
#[derive(Clone)]
struct Held {
    identity: Identity,
    expires: SystemTime,
    renew_at: SystemTime,
}

/// A web identity's credentials, renewed before they expire.
pub struct WebIdentity {
    token_file: PathBuf,
    role_arn: String,
    session_name: String,
    endpoint: String,
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    held: Mutex<Option<Held>>,
    renewing: tokio::sync::Mutex<()>,
}

impl WebIdentity {
    /// The web identity of the environment, `None` unless both
    /// `AWS_WEB_IDENTITY_TOKEN_FILE` and `AWS_ROLE_ARN` are set; an error
    /// naming the upstream when the token file cannot be read.
    pub fn from_env(name: &str, region: &str, read: &dyn Fn(&str) -> Option<String>) -> Result<Option<Self>, String> {
        let (Some(token_file), Some(role_arn)) = (read(TOKEN_FILE_VAR), read(ROLE_ARN_VAR)) else {
            return Ok(None);
        };
        let token_file = PathBuf::from(token_file);
        std::fs::metadata(&token_file).map_err(|e| {
            format!(
                "gateway upstream {name}: the web identity token file {} ({TOKEN_FILE_VAR}) cannot be read: {e}",
                token_file.display()
            )
        })?;
        let endpoint = read(ENDPOINT_VAR).unwrap_or_else(|| format!("https://sts.{region}.amazonaws.com"));
        // The gateway's connector, Mozilla's roots: STS is a public AWS endpoint.
        let connector = https_connector(webpki_roots());
        Ok(Some(Self {
            token_file,
            role_arn,
            session_name: read(SESSION_NAME_VAR).unwrap_or_else(|| SESSION_NAME_DEFAULT.to_owned()),
            endpoint,
            client: Client::builder(TokioExecutor::new()).build(connector),
            held: Mutex::new(None),
            renewing: tokio::sync::Mutex::new(()),
        }))
    }

    /// Credentials valid now: those held until their renewal time; then
    /// renewed by one call while the others keep using the held ones as long
    /// as they are valid; a failed renewal keeps them until they expire.
    pub async fn identity(&self) -> Result<Identity, CredentialsError> {
        let now = SystemTime::now();
        let held = self
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let valid = held.filter(|h| h.expires > now);
        if let Some(held) = &valid {
            if held.renew_at > now {
                return Ok(held.identity.clone());
            }
        }
        let guard = match (self.renewing.try_lock(), &valid) {
            (Ok(guard), _) => guard,
            // Another call renews: this one goes on with the valid credentials.
            (Err(_), Some(held)) => return Ok(held.identity.clone()),
            (Err(_), None) => self.renewing.lock().await,
        };
        // Renewed by the call this one waited for?
        if let Some(fresh) = self.fresh() {
            return Ok(fresh);
        }
        let renewed = self.assume().await;
        drop(guard);
        match (renewed, valid) {
            (Ok(held), _) => {
                let identity = held.identity.clone();
                *self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(held);
                Ok(identity)
            }
            (Err(e), Some(held)) => {
                tracing::warn!(error = %e, "gateway: renewing the web identity's AWS credentials failed; the held ones are used until they expire");
                Ok(held.identity)
            }
            (Err(e), None) => Err(e),
        }
    }

    /// The held credentials when not due for renewal.
    fn fresh(&self) -> Option<Identity> {
        let held = self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        (held.as_ref())
            .filter(|h| h.renew_at > SystemTime::now())
            .map(|h| h.identity.clone())
    }

    /// One `AssumeRoleWithWebIdentity` call with the token file's current token.
    async fn assume(&self) -> Result<Held, CredentialsError> {
        let failed = |what: String| CredentialsError(format!("AssumeRoleWithWebIdentity failed: {what}"));
        let token = std::fs::read_to_string(&self.token_file).map_err(|e| {
            failed(format!(
                "the token file {} cannot be read: {e}",
                self.token_file.display()
            ))
        })?;
        let field = |v: &str| utf8_percent_encode(v, NON_ALPHANUMERIC).to_string();
        let form = format!(
            "Action=AssumeRoleWithWebIdentity&Version=2011-06-15&RoleArn={}&RoleSessionName={}&WebIdentityToken={}",
            field(&self.role_arn),
            field(&self.session_name),
            field(token.trim())
        );
        let request = Request::post(format!("{}/", self.endpoint.trim_end_matches('/')))
            .header(
                "content-type",
                HeaderValue::from_static("application/x-www-form-urlencoded"),
            )
            .body(Full::new(Bytes::from(form)))
            .map_err(|e| failed(e.to_string()))?;
        let call = async {
            let response = self.client.request(request).await.map_err(|e| failed(e.to_string()))?;
            let status = response.status();
            let body = http_body_util::Limited::new(response.into_body(), ANSWER_BYTES_MAX);
            let body = body.collect().await.map_err(|e| failed(e.to_string()))?.to_bytes();
            if !status.is_success() {
                // STS's error names its code; the body never holds the token.
                let code = tag(&String::from_utf8_lossy(&body), "Code")
                    .unwrap_or_default()
                    .to_owned();
                return Err(failed(format!("STS answered {} {code}", status.as_u16())));
            }
            parse_answer(&String::from_utf8_lossy(&body), SystemTime::now()).map_err(failed)
        };
        (tokio::time::timeout(Duration::from_millis(STS_TIMEOUT_MS), call).await)
            .map_err(|_| failed("STS did not answer in time".to_owned()))?
    }
}

/// The credentials of an `AssumeRoleWithWebIdentity` answer received at
/// `now`, with their renewal time.
fn parse_answer(xml: &str, now: SystemTime) -> Result<Held, String> {
    let need = |name: &str| tag(xml, name).ok_or_else(|| format!("the answer has no {name}"));
    let expires = need("Expiration")?;
    let expires = DateTime::from_str(expires, Format::DateTime)
        .ok()
        .and_then(|t| SystemTime::try_from(t).ok())
        .ok_or_else(|| "the answer's Expiration is not a date".to_owned())?;
    let keys = AwsKeys::new(
        need("AccessKeyId")?,
        need("SecretAccessKey")?,
        Some(need("SessionToken")?.to_owned()),
        Some(expires),
        "web identity",
    );
    let life = expires.duration_since(now).unwrap_or_default();
    let margin = Duration::from_millis(RENEW_BEFORE_MS).min(life / RENEW_FRACTION_DIVISOR);
    Ok(Held {
        identity: keys.into(),
        expires,
        renew_at: expires - margin,
    })
}

/// The text of the first `<name>` element of an STS answer (its fields are
/// plain text: ids, base64 and dates, no entities).
fn tag<'a>(xml: &'a str, name: &str) -> Option<&'a str> {
    let start = xml.find(&format!("<{name}>"))? + name.len() + 2;
    let end = xml[start..].find(&format!("</{name}>"))?;
    Some(xml[start..start + end].trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ANSWER: &str = "<AssumeRoleWithWebIdentityResponse><AssumeRoleWithWebIdentityResult><Credentials>\
        <SessionToken>tok</SessionToken><SecretAccessKey>sec</SecretAccessKey>\
        <Expiration>2026-01-01T01:00:00Z</Expiration><AccessKeyId>ASIA1</AccessKeyId>\
        </Credentials></AssumeRoleWithWebIdentityResult></AssumeRoleWithWebIdentityResponse>";

    #[test]
    fn an_answer_gives_session_credentials_renewed_before_they_expire() {
        let expires =
            SystemTime::try_from(DateTime::from_str("2026-01-01T01:00:00Z", Format::DateTime).unwrap()).unwrap();
        let hour_before = expires - Duration::from_secs(3_600);
        let held = parse_answer(ANSWER, hour_before).unwrap();
        let keys = held.identity.data::<AwsKeys>().unwrap();
        assert_eq!((keys.access_key_id(), keys.session_token()), ("ASIA1", Some("tok")));
        assert_eq!(held.expires, expires);
        assert_eq!(
            held.renew_at,
            expires - Duration::from_millis(RENEW_BEFORE_MS),
            "an hour: 5 minutes before"
        );
        let short = parse_answer(ANSWER, expires - Duration::from_secs(60)).unwrap();
        assert_eq!(
            short.renew_at,
            expires - Duration::from_secs(6),
            "a minute: a tenth before"
        );
        let error = parse_answer("<x/>", hour_before).err().unwrap();
        assert!(error.contains("no Expiration"), "{error}");
    }

    #[test]
    fn without_both_variables_there_is_no_web_identity_and_an_unreadable_file_is_named() {
        let none = |_: &str| None;
        assert!(WebIdentity::from_env("b", "us-east-1", &none).unwrap().is_none());
        let vars = |name: &str| match name {
            TOKEN_FILE_VAR => Some("/nonexistent/token".to_owned()),
            ROLE_ARN_VAR => Some("arn:aws:iam::1:role/r".to_owned()),
            _ => None,
        };
        let error = WebIdentity::from_env("bedrock-east", "us-east-1", &vars).err().unwrap();
        assert!(
            error.contains("gateway upstream bedrock-east") && error.contains("/nonexistent/token"),
            "{error}"
        );
    }
}
