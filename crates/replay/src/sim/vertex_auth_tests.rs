use ring::rand::SystemRandom;
use ring::signature::RSA_PKCS1_SHA256;

use super::*;

/// The test-only keys (tests/fixtures/README.md).
const TEST_KEY: &str = include_str!("../../../../tests/fixtures/vertex-test-only-key.pem");
const OTHER_KEY: &str = include_str!("../../../../tests/fixtures/vertex-test-only-other-key.pem");
const EMAIL: &str = "gw@acme-ml.iam.gserviceaccount.com";
const HOST: &str = "127.0.0.1:9";
const NOW_S: u64 = 1_800_000_000;

fn key_file(key: &str) -> Vec<u8> {
    serde_json::json!({"type": "service_account", "client_email": EMAIL, "private_key": key,
        "private_key_id": "k1", "token_uri": format!("http://{HOST}/token")})
    .to_string()
    .into_bytes()
}

/// A form with an assertion of `claims` signed by `key`.
fn form(key: &str, claims: serde_json::Value) -> String {
    let der = PrivatePkcs8KeyDer::from_pem_slice(key.as_bytes()).unwrap();
    let pair = RsaKeyPair::from_pkcs8(der.secret_pkcs8_der()).unwrap();
    let header = URL_SAFE_NO_PAD.encode(r#"{"alg":"RS256","typ":"JWT","kid":"k1"}"#);
    let signed = format!("{header}.{}", URL_SAFE_NO_PAD.encode(claims.to_string()));
    let mut signature = vec![0; pair.public().modulus_len()];
    pair.sign(
        &RSA_PKCS1_SHA256,
        &SystemRandom::new(),
        signed.as_bytes(),
        &mut signature,
    )
    .unwrap();
    let assertion = format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature));
    format!("grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion={assertion}")
}

fn claims() -> serde_json::Value {
    serde_json::json!({"iss": EMAIL, "sub": EMAIL, "aud": format!("http://{HOST}/token"),
        "scope": CLOUD_PLATFORM_SCOPE, "iat": NOW_S, "exp": NOW_S + 3_600})
}

async fn json(response: Response) -> (StatusCode, serde_json::Value) {
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
    (status, serde_json::from_slice(&body).unwrap())
}

fn bearer(token: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert("authorization", format!("Bearer {token}").parse().unwrap());
    headers
}

#[tokio::test]
async fn a_signed_assertion_gets_a_token_that_is_refused_once_expired() {
    let auth = VertexAuth::from_key_file(&key_file(TEST_KEY), 5).unwrap();
    let (status, answer) = json(auth.token(HOST, &form(TEST_KEY, claims()), NOW_S * 1_000)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(
        (answer["expires_in"].as_u64(), answer["token_type"].as_str()),
        (Some(5), Some("Bearer"))
    );
    let token = answer["access_token"].as_str().unwrap();
    assert!(auth.authorize(&bearer(token), NOW_S * 1_000 + 4_999).is_ok());
    let refused = auth.authorize(&bearer(token), NOW_S * 1_000 + 5_000).unwrap_err();
    let (status, body) = json(*refused).await;
    assert_eq!(
        (status, body["error"]["status"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("UNAUTHENTICATED"))
    );
    assert!(auth.authorize(&bearer("ya29.made-up"), NOW_S * 1_000).is_err());
    assert!(auth.authorize(&HeaderMap::new(), NOW_S * 1_000).is_err());
    assert_eq!((auth.issued(), auth.refused_tokens()), (1, 3));
}

#[tokio::test]
async fn a_bad_assertion_is_refused_as_invalid_grant() {
    let auth = VertexAuth::from_key_file(&key_file(TEST_KEY), 3_600).unwrap();
    let with = |field: &str, value: serde_json::Value| {
        let mut claims = claims();
        claims[field] = value;
        form(TEST_KEY, claims)
    };
    let cases = [
        (form(OTHER_KEY, claims()), "Invalid JWT Signature."),
        (with("aud", "https://example.com/token".into()), "aud"),
        (with("iss", "someone@else.iam.gserviceaccount.com".into()), "iss"),
        (
            with("scope", "https://www.googleapis.com/auth/devstorage.read_only".into()),
            "scope",
        ),
        (with("exp", (NOW_S - 1).into()), "short-lived"),
        (with("exp", (NOW_S + 7_200).into()), "short-lived"),
        (with("iat", (NOW_S + 600).into()), "short-lived"),
        (
            form(TEST_KEY, claims()).replace("jwt-bearer", "saml2-bearer"),
            "grant_type",
        ),
        (
            "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion=a.b".to_owned(),
            "not a JWT",
        ),
    ];
    for (form, expected) in cases {
        let (status, answer) = json(auth.token(HOST, &form, NOW_S * 1_000)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{expected}: {answer}");
        assert_eq!(answer["error"], "invalid_grant");
        let description = answer["error_description"].as_str().unwrap();
        assert!(description.contains(expected), "{expected}: {description}");
    }
    assert_eq!(auth.issued(), 0);
    // Google's own audience, as google-auth sends it whatever the token_uri.
    let mut google = claims();
    google["aud"] = GOOGLE_TOKEN_AUDIENCE.into();
    let (status, _) = json(auth.token(HOST, &form(TEST_KEY, google), NOW_S * 1_000)).await;
    assert_eq!(status, StatusCode::OK);
    // Without a service account, nothing is issued.
    let (status, _) = json(VertexAuth::default().token(HOST, &form(TEST_KEY, claims()), NOW_S * 1_000)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[test]
fn a_bad_key_file_is_refused_naming_the_field() {
    let error = VertexAuth::from_key_file(br#"{"client_email": "a@b"}"#, 60).unwrap_err();
    assert!(error.contains("private_key is missing"), "{error}");
    let error = VertexAuth::from_key_file(&key_file("not a key"), 60).unwrap_err();
    assert!(error.contains("private_key is not"), "{error}");
    assert!(VertexAuth::from_key_file(&key_file(TEST_KEY), 0).is_err());
}
