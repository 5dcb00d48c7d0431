//! STS's route in the simulator (`POST /`): `AssumeRoleWithWebIdentity`
//! (<https://docs.aws.amazon.com/STS/latest/APIReference/API_AssumeRoleWithWebIdentity.html>)
//! answered in STS's XML, the credentials issued by [`crate::sim::sts`].

use std::sync::Arc;
use std::time::SystemTime;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::sim::server::ProviderServer;

/// `POST /` with `Action=AssumeRoleWithWebIdentity`, `RoleArn`, `RoleSessionName`
/// and a non-empty `WebIdentityToken`: new credentials, in STS's XML.
pub async fn assume_role_with_web_identity(State(provider): State<Arc<ProviderServer>>, body: Bytes) -> Response {
    let Some(sts) = provider.control.sts() else {
        return error(
            StatusCode::NOT_FOUND,
            "UnknownOperation",
            "no STS here (--sts-lifetime-ms)",
        );
    };
    let form = String::from_utf8_lossy(&body);
    let field = |name: &str| {
        form.split('&')
            .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
    };
    if field("Action") != Some("AssumeRoleWithWebIdentity") {
        return error(StatusCode::BAD_REQUEST, "InvalidAction", "Could not find operation");
    }
    for name in ["RoleArn", "RoleSessionName", "WebIdentityToken"] {
        if field(name).is_none_or(str::is_empty) {
            return error(
                StatusCode::BAD_REQUEST,
                "MissingParameter",
                &format!("{name} is required"),
            );
        }
    }
    let (keys, expires) = sts.issue(SystemTime::now());
    let expiration = aws_smithy_types::DateTime::from(expires)
        .fmt(aws_smithy_types::date_time::Format::DateTime)
        .expect("a date after 1970");
    let xml = format!(
        "<AssumeRoleWithWebIdentityResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\">\
         <AssumeRoleWithWebIdentityResult><Credentials><SessionToken>{}</SessionToken>\
         <SecretAccessKey>{}</SecretAccessKey><Expiration>{expiration}</Expiration>\
         <AccessKeyId>{}</AccessKeyId></Credentials></AssumeRoleWithWebIdentityResult>\
         </AssumeRoleWithWebIdentityResponse>",
        keys.session_token.as_deref().unwrap_or_default(),
        keys.secret_access_key,
        keys.access_key_id
    );
    xml_response(StatusCode::OK, xml)
}

fn xml_response(status: StatusCode, xml: String) -> Response {
    let mut response = (status, xml).into_response();
    response
        .headers_mut()
        .insert("content-type", HeaderValue::from_static("text/xml"));
    response
}

fn error(status: StatusCode, code: &str, message: &str) -> Response {
    let xml = format!(
        "<ErrorResponse><Error><Type>Sender</Type><Code>{code}</Code><Message>{message}</Message></Error></ErrorResponse>"
    );
    xml_response(status, xml)
}
