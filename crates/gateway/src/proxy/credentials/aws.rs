//! Amazon Bedrock's credentials: every request signed with AWS Signature
//! Version 4 (<https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_sigv-create-signed-request.html>),
//! service `bedrock`, the upstream's region, by AWS's own signing crate
//! (`aws-sigv4`): the canonical request is never rebuilt here.
//!
//! The credentials are the environment's (`AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, and `AWS_SESSION_TOKEN` for temporary ones), or a
//! web identity exchanged with STS and renewed before it expires
//! (`credentials/sts.rs`). Missing ones are a start-up error naming the
//! upstream and the variable.

use std::sync::Arc;
use std::time::SystemTime;

use aws_credential_types::Credentials as AwsKeys;
use aws_sigv4::http_request::{sign, SignableBody, SignableRequest, SigningSettings};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use axum::http::Request;
use bytes::Bytes;

use super::sts::WebIdentity;
use super::CredentialsError;

/// The SigV4 service name of Bedrock's runtime
/// (<https://docs.aws.amazon.com/service-authorization/latest/reference/list_amazonbedrock.html>).
pub const SIGNING_SERVICE: &str = "bedrock";

/// The environment variables of static or session credentials
/// (<https://docs.aws.amazon.com/sdkref/latest/guide/feature-static-credentials.html>).
pub const ACCESS_KEY_ID_VAR: &str = "AWS_ACCESS_KEY_ID";
/// The secret's variable.
pub const SECRET_ACCESS_KEY_VAR: &str = "AWS_SECRET_ACCESS_KEY";
/// The session token's variable (temporary credentials only).
pub const SESSION_TOKEN_VAR: &str = "AWS_SESSION_TOKEN";

/// Where an upstream's AWS credentials come from.
enum Source {
    /// Read once from the environment: a process's environment does not change.
    Static(Identity),
    /// Assumed from a web identity, renewed before it expires.
    WebIdentity(Arc<WebIdentity>),
}

/// Signs one Bedrock upstream's requests.
pub struct AwsSigner {
    region: String,
    source: Source,
}

impl AwsSigner {
    /// The signer of the upstream `name` in `region`, its credentials from the
    /// environment: a web identity when `AWS_WEB_IDENTITY_TOKEN_FILE` and
    /// `AWS_ROLE_ARN` are set, else the access key variables. An error names
    /// the upstream and what is missing (never a secret's value).
    pub fn from_env(name: &str, region: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Self, String> {
        let read = |var: &str| env(var).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
        if let Some(identity) = WebIdentity::from_env(name, region, &read)? {
            return Ok(Self {
                region: region.to_owned(),
                source: Source::WebIdentity(Arc::new(identity)),
            });
        }
        let missing = |var: &str| {
            format!(
                "gateway upstream {name}: kind bedrock needs AWS credentials: {var} is not set \
                 (or set AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN, or api_key_env for a Bedrock API key)"
            )
        };
        let id = read(ACCESS_KEY_ID_VAR).ok_or_else(|| missing(ACCESS_KEY_ID_VAR))?;
        let secret = read(SECRET_ACCESS_KEY_VAR).ok_or_else(|| missing(SECRET_ACCESS_KEY_VAR))?;
        let keys = AwsKeys::new(id, secret, read(SESSION_TOKEN_VAR), None, "environment");
        Ok(Self {
            region: region.to_owned(),
            source: Source::Static(keys.into()),
        })
    }

    /// Signs `request` as it will be sent: its method, URI, every header it
    /// holds and its body; adds `authorization`, `x-amz-date` and, with
    /// temporary credentials, `x-amz-security-token`.
    pub async fn sign(&self, request: &mut Request<Bytes>) -> Result<(), CredentialsError> {
        let identity = match &self.source {
            Source::Static(identity) => identity.clone(),
            Source::WebIdentity(source) => source.identity().await?,
        };
        sign_with(request, &identity, &self.region, SystemTime::now())
    }
}

/// Signs `request` for Bedrock in `region` with `identity` at `time`.
pub fn sign_with(
    request: &mut Request<Bytes>,
    identity: &Identity,
    region: &str,
    time: SystemTime,
) -> Result<(), CredentialsError> {
    let failed = |what: &str| CredentialsError(format!("signing the request failed: {what}"));
    let params = v4::SigningParams::builder()
        .identity(identity)
        .region(region)
        .name(SIGNING_SERVICE)
        .time(time)
        .settings(SigningSettings::default())
        .build()
        .map_err(|_| failed("bad signing parameters"))?
        .into();
    let mut headers = Vec::with_capacity(request.headers().len());
    for (name, value) in request.headers() {
        // A header the signer cannot read would be sent unsigned: refused instead.
        let value = value.to_str().map_err(|_| failed("a header value is not text"))?;
        headers.push((name.as_str(), value));
    }
    let uri = request.uri().to_string();
    let signable = SignableRequest::new(
        request.method().as_str(),
        uri,
        headers.into_iter(),
        SignableBody::Bytes(request.body()),
    )
    .map_err(|_| failed("the request cannot be signed"))?;
    let (instructions, _signature) = sign(signable, &params)
        .map_err(|_| failed("the request cannot be signed"))?
        .into_parts();
    instructions.apply_to_request_http1x(request);
    for name in ["authorization", "x-amz-security-token"] {
        if let Some(value) = request.headers_mut().get_mut(name) {
            value.set_sensitive(true);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| (*v).to_owned())
    }

    fn request() -> Request<Bytes> {
        Request::builder()
            .method("POST")
            .uri("https://bedrock-runtime.us-east-1.amazonaws.com/model/us.anthropic.claude-v1%3A0/invoke")
            .header("content-type", "application/json")
            .body(Bytes::from_static(b"{}"))
            .unwrap()
    }

    #[tokio::test]
    async fn a_request_is_signed_for_bedrock_in_the_region_with_the_session_token() {
        let vars = env(&[
            ("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE"),
            ("AWS_SECRET_ACCESS_KEY", "secret"),
            ("AWS_SESSION_TOKEN", "session-1"),
        ]);
        let signer = AwsSigner::from_env("b", "us-west-2", &vars).unwrap();
        let mut signed = request();
        signer.sign(&mut signed).await.unwrap();
        let auth = signed.headers()["authorization"].to_str().unwrap().to_owned();
        assert!(auth.starts_with("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/"), "{auth}");
        assert!(auth.contains("/us-west-2/bedrock/aws4_request"), "{auth}");
        assert!(
            auth.contains("SignedHeaders=content-type;host;x-amz-date;x-amz-security-token"),
            "{auth}"
        );
        assert_eq!(signed.headers()["x-amz-security-token"], "session-1");
        assert!(signed.headers()["authorization"].is_sensitive());
        // Without the token: another signature, and no token header.
        let vars = env(&[
            ("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE"),
            ("AWS_SECRET_ACCESS_KEY", "secret"),
        ]);
        let mut plain = request();
        AwsSigner::from_env("b", "us-west-2", &vars)
            .unwrap()
            .sign(&mut plain)
            .await
            .unwrap();
        assert!(plain.headers().get("x-amz-security-token").is_none());
    }

    #[test]
    fn the_signature_is_aws_s_for_a_fixed_time_and_key() {
        // The same request and key signed twice at one instant: one signature;
        // another secret: another signature.
        let time = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        let sign_as = |secret: &str| {
            let identity: Identity = AwsKeys::new("AKID", secret, None, None, "test").into();
            let mut r = request();
            sign_with(&mut r, &identity, "us-east-1", time).unwrap();
            r.headers()["authorization"].to_str().unwrap().to_owned()
        };
        assert_eq!(sign_as("a"), sign_as("a"));
        assert_ne!(sign_as("a"), sign_as("b"));
        assert!(sign_as("a").contains("Credential=AKID/20231114/us-east-1/bedrock/aws4_request"));
    }

    #[test]
    fn missing_credentials_name_the_upstream_and_the_variable_never_a_value() {
        let error = AwsSigner::from_env("bedrock-east", "us-east-1", &env(&[]))
            .err()
            .unwrap();
        assert!(error.contains("gateway upstream bedrock-east"), "{error}");
        assert!(error.contains("AWS_ACCESS_KEY_ID is not set"), "{error}");
        let vars = env(&[("AWS_ACCESS_KEY_ID", "AKIDVISIBLE")]);
        let error = AwsSigner::from_env("b", "us-east-1", &vars).err().unwrap();
        assert!(error.contains("AWS_SECRET_ACCESS_KEY is not set"), "{error}");
        assert!(!error.contains("AKIDVISIBLE"), "{error}");
    }
}
