//! The budget alerts' webhook (`gateway.alerts.webhook_url`): each alert
//! ([`crate::observe::budget_alerts::BudgetAlert`]) POSTed as one JSON event by
//! a task of its own, retried with backoff, so that no call ever waits for it. The
//! queue is bounded: an alert that finds it full is dropped and counted, as is
//! one whose attempts all failed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::mpsc;

use super::budget_alerts::BudgetAlert;
use crate::config::{WebhookSettings, BACKOFF_MAX_MS};

/// The longest one delivery attempt may take before it counts as failed.
pub const ATTEMPT_TIMEOUT_MS: u64 = 10_000;
/// What the webhook has done so far.
#[derive(Debug, Default)]
pub struct WebhookCounts {
    /// Alerts the receiver accepted (a 2xx).
    pub delivered: AtomicU64,
    /// Alerts whose every attempt failed.
    pub failed: AtomicU64,
    /// Alerts dropped because the queue was full.
    pub dropped: AtomicU64,
}

impl WebhookCounts {
    /// Appends the Prometheus text of the counts to `out`.
    pub fn render(&self, out: &mut String) {
        use std::fmt::Write;
        let counts = [
            (
                "delivered",
                "Budget alerts the webhook's receiver accepted.",
                &self.delivered,
            ),
            (
                "failed",
                "Budget alerts whose every webhook attempt failed.",
                &self.failed,
            ),
            (
                "dropped",
                "Budget alerts dropped: the webhook's queue was full.",
                &self.dropped,
            ),
        ];
        for (name, help, count) in counts {
            let name = format!("ratelimiterd_gateway_budget_alerts_{name}_total");
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                count.load(Ordering::Relaxed)
            );
        }
    }
}

/// The sending end: cheap to clone, never waits.
#[derive(Debug, Clone)]
pub struct AlertWebhook {
    queue: mpsc::Sender<BudgetAlert>,
    counts: Arc<WebhookCounts>,
}

impl AlertWebhook {
    /// Starts the delivery task on the current Tokio runtime.
    pub fn start(settings: WebhookSettings) -> Self {
        assert!(
            settings.attempts_max >= 1 && settings.queue_max >= 1,
            "validated with the configuration"
        );
        let (queue, receiver) = mpsc::channel(settings.queue_max);
        let counts = Arc::new(WebhookCounts::default());
        tokio::spawn(deliver_all(settings, receiver, Arc::clone(&counts)));
        Self { queue, counts }
    }

    /// Queues `alert` for delivery; a full queue drops it (counted and logged).
    pub fn send(&self, alert: BudgetAlert) {
        if let Err(e) = self.queue.try_send(alert) {
            self.counts.dropped.fetch_add(1, Ordering::Relaxed);
            let alert = match e {
                mpsc::error::TrySendError::Full(a) | mpsc::error::TrySendError::Closed(a) => a,
            };
            tracing::warn!(budget = %alert.budget, fraction = alert.fraction, "budget alert webhook: queue full, alert dropped");
        }
    }

    /// What it has done so far.
    pub fn counts(&self) -> &Arc<WebhookCounts> {
        &self.counts
    }
}

type HttpsClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

fn client() -> HttpsClient {
    let roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    let connector = HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Client::builder(TokioExecutor::new()).build(connector)
}

/// Delivers the queued alerts one by one until every sender is gone.
async fn deliver_all(settings: WebhookSettings, mut receiver: mpsc::Receiver<BudgetAlert>, counts: Arc<WebhookCounts>) {
    let client = client();
    while let Some(alert) = receiver.recv().await {
        let body = Bytes::from(serde_json::to_vec(&alert).expect("an alert serializes"));
        let mut backoff_ms = settings.backoff_first_ms;
        let mut delivered = false;
        for attempt in 1..=settings.attempts_max {
            match post(&client, &settings.url, body.clone()).await {
                Ok(()) => {
                    delivered = true;
                    break;
                }
                Err(error) => {
                    tracing::warn!(budget = %alert.budget, attempt, %error, "budget alert webhook: attempt failed");
                }
            }
            if attempt < settings.attempts_max {
                tokio::time::sleep(Duration::from_millis(backoff_ms)).await;
                backoff_ms = (backoff_ms * 2).min(BACKOFF_MAX_MS);
            }
        }
        let counter = if delivered { &counts.delivered } else { &counts.failed };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// One attempt: a 2xx is delivered; anything else, or no answer within
/// [`ATTEMPT_TIMEOUT_MS`], failed.
async fn post(client: &HttpsClient, url: &hyper::Uri, body: Bytes) -> Result<(), String> {
    let request = Request::builder()
        .method(Method::POST)
        .uri(url.clone())
        .header("content-type", "application/json")
        .header(
            "user-agent",
            concat!("ratelimiterd-gateway/", env!("CARGO_PKG_VERSION")),
        )
        .body(Full::new(body))
        .map_err(|e| e.to_string())?;
    let timeout = Duration::from_millis(ATTEMPT_TIMEOUT_MS);
    let response = tokio::time::timeout(timeout, client.request(request))
        .await
        .map_err(|_| format!("no answer within {ATTEMPT_TIMEOUT_MS} ms"))?
        .map_err(|e| e.to_string())?;
    if response.status().is_success() {
        Ok(())
    } else {
        Err(format!("status {}", response.status()))
    }
}
