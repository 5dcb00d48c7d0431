//! `https://` upstreams: the gateway verifies the provider's certificate against
//! its roots, and forwards over TLS as over plain HTTP.

mod support;

use std::sync::Arc;
use std::time::Duration;

use gateway::proxy::upstream::UpstreamClient;
use gateway::Gateway;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::json;
use support::*;

/// Serves the test provider over TLS with a fresh self-signed certificate for
/// `localhost`; answers the port and the certificate.
async fn start_tls_provider() -> (u16, CertificateDer<'static>) {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let cert = certified.cert.der().clone();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(certified.key_pair.serialize_der()));
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone()], key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let router = provider_router(Arc::new(Provider::default()));
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let (acceptor, router) = (acceptor.clone(), router.clone());
            tokio::spawn(async move {
                // A handshake the client refuses ends here; that is the second case below.
                let Ok(tls) = acceptor.accept(tcp).await else { return };
                let service = TowerToHyperService::new(router);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    (port, cert)
}

#[tokio::test]
async fn an_https_upstream_is_verified_and_used() {
    let (port, cert) = start_tls_provider().await;
    let mut config = config("127.0.0.1:9".parse().unwrap(), 0);
    config.upstreams[0].base_url = format!("https://localhost:{port}");
    let backend = memory_backend();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert).unwrap();
    let trusting = UpstreamClient::with_roots(Duration::from_secs(10), roots);
    let (gateway, _) = serve_gateway(
        Gateway::with_client(&config, backend.clone(), trusting).unwrap(),
        backend.clone(),
    )
    .await;
    let body = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 50});
    let client = client();
    let (status, _, text) = post(&client, gateway, "/v1/chat/completions", body.clone()).await;
    assert_eq!(status, 200, "{text}");
    eventually_in_use(
        &backend,
        "global:llm:openai:gpt-4o-mini:tpm",
        OPENAI_USAGE.0 + OPENAI_USAGE.1,
    )
    .await;

    // A gateway on the public roots does not trust the self-signed certificate.
    let other = memory_backend();
    let (untrusting, _) = serve_gateway(Gateway::new(&config, other.clone()).unwrap(), other.clone()).await;
    let (status, _, text) = post(&client, untrusting, "/v1/chat/completions", body).await;
    assert_eq!(status, 502, "{text}");
    eventually_in_use(&other, "global:llm:openai:gpt-4o-mini:concurrency", 0).await;
}
