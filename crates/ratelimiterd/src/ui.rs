//! The operator's console (docs/console.md): a page at `/ui` on the limiter's
//! listener, its HTML, CSS and JavaScript compiled into the binary, and the one
//! JSON endpoint it reads every second, `GET /ui/api/state`.
//!
//! Who may read it: with `server.admin_token` set, the endpoint needs that
//! token, as the admin API does (the page asks for it and keeps it for the tab
//! only). Without one, the console is served only when the server listens on
//! loopback; on any other address it is off and the log says why at startup.
//! The page's files carry no data, so they load without a header (a browser
//! cannot send one when it navigates); everything they show comes from the
//! endpoint.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Uri};
use axum::middleware::{from_fn_with_state, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use tokio::time::MissedTickBehavior;

use crate::config::Config;
use crate::error::ApiError;
use crate::shutdown::Shutdown;
use crate::state::AppState;
use crate::ui_history::{GatewaySample, History, SAMPLE_INTERVAL_MS};
use crate::ui_query::LimitsQuery;
use crate::ui_view::state_document;

/// The page and its files, compiled in: the console needs nothing at runtime.
const INDEX_HTML: &str = include_str!("../ui/index.html");
const CONSOLE_CSS: &str = include_str!("../ui/console.css");
const CONSOLE_JS: &str = include_str!("../ui/console.js");
const FAVICON_SVG: &str = include_str!("../ui/favicon.svg");

/// What the page may load and where it may connect: its own files and this
/// server only, no inline script, no frames.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";
/// How often the gateway's counters are sampled for the page's rates.
const GATEWAY_SAMPLE_INTERVAL: Duration = Duration::from_millis(1_000);

/// Who may open the console, decided once from the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// The admin token is configured: the endpoint requires it.
    AdminToken,
    /// No admin token, and the server listens on loopback only: open to local users.
    Loopback,
    /// No admin token on a non-loopback listener: not served.
    Off,
}

impl Access {
    /// The access `config` allows; logs a warning when the console is off.
    pub fn of(config: &Config) -> Self {
        if config.server.admin_token.is_some() {
            return Access::AdminToken;
        }
        let loopback = crate::config::parse_listen_addr(&config.server.listen_addr).is_ok_and(|a| a.ip().is_loopback());
        if loopback {
            Access::Loopback
        } else {
            tracing::warn!(
                listen_addr = %config.server.listen_addr,
                "the console at /ui is off: the server listens beyond loopback and server.admin_token is not set"
            );
            Access::Off
        }
    }
}

/// The console's state: who may read it and the history it shows.
pub struct Console {
    access: Access,
    history: History,
}

impl Console {
    /// The console of a configuration.
    pub fn new(config: &Config) -> Self {
        Self {
            access: Access::of(config),
            history: History::default(),
        }
    }

    /// Who may open it.
    pub fn access(&self) -> Access {
        self.access
    }

    /// Its history rings.
    pub fn history(&self) -> &History {
        &self.history
    }
}

/// The console's routes; every one answers 404 when the console is off.
pub fn router(state: &AppState) -> Router<AppState> {
    let api = Router::new()
        .route("/ui/api/state", get(api_state))
        .route_layer(from_fn_with_state(state.clone(), crate::overload::guard))
        .route_layer(from_fn_with_state(state.clone(), require_access));
    Router::new()
        .route("/ui", get(|| file(INDEX_HTML, "text/html; charset=utf-8")))
        .route("/ui/", get(|| file(INDEX_HTML, "text/html; charset=utf-8")))
        .route("/ui/console.css", get(|| file(CONSOLE_CSS, "text/css; charset=utf-8")))
        .route(
            "/ui/console.js",
            get(|| file(CONSOLE_JS, "text/javascript; charset=utf-8")),
        )
        .route("/ui/favicon.svg", get(|| file(FAVICON_SVG, "image/svg+xml")))
        .merge(api)
        .route_layer(from_fn_with_state(state.clone(), served))
}

async fn file(body: &'static str, content_type: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// 404 for every console route when the console is off; the security headers
/// on every answer when it is on.
async fn served(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if state.console().access() == Access::Off {
        let path = request.uri().path().to_owned();
        return ApiError::RouteNotFound(format!(
            "{path} (the console is off: set server.admin_token, or listen on loopback)"
        ))
        .into_response();
    }
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
}

/// The admin token, when one is configured.
async fn require_access(State(state): State<AppState>, request: Request, next: Next) -> Response {
    match state.auth().check_admin(request.headers()) {
        Ok(()) => next.run(request).await,
        Err(e) => e.into_response(),
    }
}

/// `GET /ui/api/state`: everything the page shows, with one page of limits.
async fn api_state(State(state): State<AppState>, uri: Uri) -> Result<Response, ApiError> {
    let query = LimitsQuery::parse(uri.query()).map_err(ApiError::InvalidRequest)?;
    let document = state_document(&state, state.console().history(), &query, now_unix_ms()).await;
    let mut response = Json(document).into_response();
    (response.headers_mut()).insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Fills the history until `shutdown`: the gateway's counters every second, every
/// limit's utilization every [`SAMPLE_INTERVAL_MS`]. Does nothing when the
/// console is off.
pub async fn sample(state: AppState, shutdown: Shutdown) {
    if state.console().access() == Access::Off {
        return;
    }
    let mut ticks = tokio::time::interval(GATEWAY_SAMPLE_INTERVAL);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let per_limits_sample = SAMPLE_INTERVAL_MS / GATEWAY_SAMPLE_INTERVAL.as_millis() as u64;
    let stop = shutdown.wait();
    tokio::pin!(stop);
    for second in 0u64.. {
        tokio::select! {
            () = &mut stop => return,
            _ = ticks.tick() => {}
        }
        let history = state.console().history();
        if let Some(gateway) = state.gateway_metrics() {
            let queue_waits = (state.gateway().map(|g| g.status()).unwrap_or_default().into_iter())
                .filter_map(|m| Some((m.name.clone(), gateway.queue_wait(&m.name)?)))
                .collect();
            history.record_gateway(GatewaySample {
                at_unix_ms: now_unix_ms(),
                calls: gateway.call_totals(),
                queue_waits,
                classes: gateway.classes.totals(),
            });
        }
        if second % per_limits_sample == 0 {
            match state.backend().limit_reports().await {
                Ok(reports) => history.record_limits(&reports, now_unix_ms()),
                Err(error) => {
                    // An empty sample keeps the time axis: the gap shows where the backend was away.
                    history.record_limits(&[], now_unix_ms());
                    tracing::debug!(%error, "console: the limits could not be sampled");
                }
            }
        }
    }
}
