//! The connector every HTTP client of the gateway to the providers dials
//! through: TCP without Nagle's delay, and rustls on ring for `https://`
//! (plain `http://` too, for local servers and the simulator). Shared by the
//! upstream client (`proxy/upstream.rs`), the Vertex AI token exchange
//! (`proxy/vertex_token.rs`) and AWS STS's (`proxy/credentials/sts.rs`).

use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;

/// Mozilla's roots (webpki-roots), compiled in: the binary needs no system
/// certificate store.
pub fn webpki_roots() -> rustls::RootCertStore {
    rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    }
}

/// A connector that verifies `https://` servers against `roots` only.
pub fn https_connector(roots: rustls::RootCertStore) -> HttpsConnector<HttpConnector> {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    // The TLS connector does the scheme check itself.
    http.enforce_http(false);
    let tls =
        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
    HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http)
}
