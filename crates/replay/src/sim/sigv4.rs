//! AWS Signature Version 4, checked as Bedrock checks it
//! (<https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_sigv-create-signed-request.html>):
//! the signature recomputed by AWS's own `aws-sigv4` over the request as
//! received (its method, path and query, the headers it names as signed, its
//! body) with the configured secret, and compared; a request signed with
//! another secret or key, or more than five minutes away from the
//! simulator's clock, is refused with Bedrock's 403.

use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{sign, SignableBody, SignableRequest, SigningSettings};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use axum::http::{HeaderMap, Method, Uri};

/// How far a request's `x-amz-date` may be from the clock: AWS refuses a
/// request "more than 5 minutes" old or ahead ("Signature expired").
pub const CLOCK_SKEW_MAX: Duration = Duration::from_secs(300);

/// The credentials the simulated account accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AwsKeys {
    /// `AKIA...` or `ASIA...`.
    pub access_key_id: String,
    /// The secret the signatures are checked with.
    pub secret_access_key: String,
    /// Temporary credentials' token: then every request must carry it.
    pub session_token: Option<String>,
}

/// Why a signature was refused: Bedrock's error type and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// `x-amzn-ErrorType`: `InvalidSignatureException`, `UnrecognizedClientException`...
    pub error_type: &'static str,
    /// The body's `message`.
    pub message: String,
}

fn refused(error_type: &'static str, message: impl Into<String>) -> Refused {
    Refused {
        error_type,
        message: message.into(),
    }
}

/// The parts of an `authorization: AWS4-HMAC-SHA256 ...` header.
struct Authorization<'a> {
    access_key_id: &'a str,
    region: &'a str,
    service: &'a str,
    signed_headers: Vec<&'a str>,
    signature: &'a str,
}

fn parse_authorization(value: &str) -> Option<Authorization<'_>> {
    let rest = value.strip_prefix("AWS4-HMAC-SHA256 ")?;
    let field = |name: &str| {
        rest.split(',')
            .map(str::trim)
            .find_map(|part| part.strip_prefix(name)?.strip_prefix('='))
    };
    let mut scope = field("Credential")?.split('/');
    let access_key_id = scope.next()?;
    let (_date, region, service) = (scope.next()?, scope.next()?, scope.next()?);
    Some(Authorization {
        access_key_id,
        region,
        service,
        signed_headers: field("SignedHeaders")?.split(';').collect(),
        signature: field("Signature")?,
    })
}

/// The access key id a request's `authorization` names, if it is SigV4's.
pub fn access_key_id(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get("authorization")?.to_str().ok()?;
    parse_authorization(value).map(|auth| auth.access_key_id)
}

/// Checks the SigV4 signature of a request to `service` against `keys` at `now`.
pub fn verify(
    keys: &AwsKeys,
    service: &str,
    (method, uri, headers, body): (&Method, &Uri, &HeaderMap, &[u8]),
    now: SystemTime,
) -> Result<(), Refused> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let missing = || refused("MissingAuthenticationTokenException", "Missing Authentication Token");
    let auth = parse_authorization(text("authorization").ok_or_else(missing)?).ok_or_else(missing)?;
    let invalid_token = || {
        refused(
            "UnrecognizedClientException",
            "The security token included in the request is invalid.",
        )
    };
    if auth.access_key_id != keys.access_key_id || auth.service != service {
        return Err(invalid_token());
    }
    if text("x-amz-security-token") != keys.session_token.as_deref() {
        return Err(invalid_token());
    }
    let date = text("x-amz-date").and_then(parse_amz_date).ok_or_else(|| {
        refused(
            "IncompleteSignatureException",
            "Authorization header requires existence of either a 'X-Amz-Date' or a 'Date' header.",
        )
    })?;
    let skew = now
        .duration_since(date)
        .or_else(|e| Ok::<_, ()>(e.duration()))
        .unwrap_or_default();
    if skew > CLOCK_SKEW_MAX {
        return Err(refused(
            "InvalidSignatureException",
            "Signature expired: the request's x-amz-date is more than 5 minutes from the server's time.",
        ));
    }
    let expected = signature_of(keys, &auth, (method, uri, headers, body), date).ok_or_else(missing)?;
    if expected != auth.signature {
        return Err(refused(
            "InvalidSignatureException",
            "The request signature we calculated does not match the signature you provided. Check your AWS Secret Access Key and signing method. Consult the service documentation for details.",
        ));
    }
    Ok(())
}

/// The signature `keys` give the request as received, over the headers it
/// names as signed.
fn signature_of(
    keys: &AwsKeys,
    auth: &Authorization<'_>,
    (method, uri, headers, body): (&Method, &Uri, &HeaderMap, &[u8]),
    time: SystemTime,
) -> Option<String> {
    let mut signed: Vec<(&str, String)> = Vec::new();
    for name in &auth.signed_headers {
        let values: Vec<&str> = headers.get_all(*name).iter().filter_map(|v| v.to_str().ok()).collect();
        if values.is_empty() {
            return None;
        }
        signed.push((name, values.join(",")));
    }
    let host = signed.iter().find(|(n, _)| *n == "host").map(|(_, v)| v.clone())?;
    let identity: Identity = Credentials::new(
        &keys.access_key_id,
        &keys.secret_access_key,
        keys.session_token.clone(),
        None,
        "provider-sim",
    )
    .into();
    let mut settings = SigningSettings::default();
    // Only what the client signed: none of the signer's exclusions apply.
    settings.excluded_headers = None;
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(auth.region)
        .name(auth.service)
        .time(time)
        .settings(settings)
        .build()
        .ok()?
        .into();
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let request = SignableRequest::new(
        method.as_str(),
        format!("http://{host}{path}"),
        signed.iter().map(|(n, v)| (*n, v.as_str())),
        SignableBody::Bytes(body),
    )
    .ok()?;
    let (_, signature) = sign(request, &params).ok()?.into_parts();
    Some(signature)
}

/// `x-amz-date`'s `YYYYMMDDTHHMMSSZ`.
fn parse_amz_date(text: &str) -> Option<SystemTime> {
    let digits = |range: std::ops::Range<usize>| text.get(range)?.parse::<i64>().ok();
    if text.len() != 16 || text.as_bytes()[8] != b'T' || !text.ends_with('Z') {
        return None;
    }
    let (year, month, day) = (digits(0..4)?, digits(4..6)?, digits(6..8)?);
    let (hour, minute, second) = (digits(9..11)?, digits(11..13)?, digits(13..15)?);
    // Days from the civil date (Howard Hinnant's algorithm), 1970-01-01 = 0.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let seconds = days * 86_400 + hour * 3_600 + minute * 60 + second;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(seconds).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(token: Option<&str>) -> AwsKeys {
        AwsKeys {
            access_key_id: "AKIDSIM".to_owned(),
            secret_access_key: "secret".to_owned(),
            session_token: token.map(str::to_owned),
        }
    }

    /// A request as a client signs it with `keys` at `time`.
    fn signed(keys: &AwsKeys, time: SystemTime) -> (Method, Uri, HeaderMap, Vec<u8>) {
        let body = br#"{"anthropic_version":"bedrock-2023-05-31"}"#.to_vec();
        let uri = "http://127.0.0.1:9/model/us.anthropic.claude-v1%3A0/invoke";
        let identity: Identity = Credentials::new(
            &keys.access_key_id,
            &keys.secret_access_key,
            keys.session_token.clone(),
            None,
            "test",
        )
        .into();
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region("us-east-1")
            .name("bedrock")
            .time(time)
            .settings(SigningSettings::default())
            .build()
            .unwrap()
            .into();
        let headers = [("content-type", "application/json"), ("host", "127.0.0.1:9")];
        let signable = SignableRequest::new("POST", uri, headers.into_iter(), SignableBody::Bytes(&body)).unwrap();
        let (instructions, _) = sign(signable, &params).unwrap().into_parts();
        let mut request = axum::http::Request::post(uri).body(()).unwrap();
        for (name, value) in headers {
            request.headers_mut().insert(name, value.parse().unwrap());
        }
        instructions.apply_to_request_http1x(&mut request);
        let uri: Uri = "/model/us.anthropic.claude-v1%3A0/invoke".parse().unwrap();
        (Method::POST, uri, request.headers().clone(), body)
    }

    fn check(keys: &AwsKeys, request: &(Method, Uri, HeaderMap, Vec<u8>), now: SystemTime) -> Result<(), Refused> {
        verify(keys, "bedrock", (&request.0, &request.1, &request.2, &request.3), now)
    }

    #[test]
    fn the_right_signature_passes_and_a_wrong_secret_a_stale_date_or_a_changed_body_do_not() {
        let now = SystemTime::now();
        let keys = keys(Some("token-1"));
        let request = signed(&keys, now);
        check(&keys, &request, now).unwrap();
        let other = AwsKeys {
            secret_access_key: "not-the-secret".to_owned(),
            ..keys.clone()
        };
        let error = check(&keys, &signed(&other, now), now).unwrap_err();
        assert_eq!(error.error_type, "InvalidSignatureException");
        assert!(error
            .message
            .starts_with("The request signature we calculated does not match"));
        let stale = check(&keys, &signed(&keys, now - Duration::from_secs(600)), now).unwrap_err();
        assert!(stale.message.starts_with("Signature expired"), "{stale:?}");
        let mut changed = request.clone();
        changed.3.push(b' ');
        assert_eq!(
            check(&keys, &changed, now).unwrap_err().error_type,
            "InvalidSignatureException"
        );
        let token = check(&keys, &signed(&self::keys(Some("token-2")), now), now).unwrap_err();
        assert_eq!(token.error_type, "UnrecognizedClientException", "another session token");
        let mut unsigned = request;
        unsigned.2.remove("authorization");
        assert_eq!(
            check(&keys, &unsigned, now).unwrap_err().error_type,
            "MissingAuthenticationTokenException"
        );
    }

    #[test]
    fn amz_dates_are_read_in_utc() {
        let t = parse_amz_date("20231114T221320Z").unwrap();
        assert_eq!(t, SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000));
        assert_eq!(parse_amz_date("2023-11-14T22:13:20Z"), None);
    }
}
