//! The console's routes (docs/console.md): the page's files, served without a
//! header, and `GET /ui/api/state`, `GET /ui/api/directory`,
//! `GET /ui/api/budgets` and `GET /ui/api/spend`, which need
//! the admin token when one is configured; every route answers 404 when the
//! console is off. The tenants and keys panel changes keys through the admin
//! API itself (`/v1/admin/gateway/keys`), under the same rule.

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Uri};
use axum::middleware::{from_fn_with_state, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};

use crate::console::access::Access;
use crate::console::budgets::{budgets_document, spend_document};
use crate::console::directory::{directory_document, KeysQuery};
use crate::console::history::now_unix_ms;
use crate::console::query::LimitsQuery;
use crate::console::view::state_document;
use crate::error::ApiError;
use crate::state::AppState;

/// The page and its files, compiled in: the console needs nothing at runtime.
const INDEX_HTML: &str = include_str!("../../ui/index.html");
const CONSOLE_CSS: &str = include_str!("../../ui/console.css");
const SHARED_JS: &str = include_str!("../../ui/shared.js");
const CONSOLE_JS: &str = include_str!("../../ui/console.js");
const KEYS_JS: &str = include_str!("../../ui/keys.js");
const BUDGETS_JS: &str = include_str!("../../ui/budgets.js");
const FAVICON_SVG: &str = include_str!("../../ui/favicon.svg");

/// How long the chart waits before asking again while the ledger is away: its next refresh.
const SPEND_RETRY_MS: u64 = 1_000;

/// What the page may load and where it may connect: its own files and this
/// server only, no inline script, no frames.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

/// The console's routes; every one answers 404 when the console is off.
pub fn router(state: &AppState) -> Router<AppState> {
    let api = Router::new()
        .route("/ui/api/state", get(api_state))
        .route("/ui/api/directory", get(api_directory))
        .route("/ui/api/budgets", get(api_budgets))
        .route("/ui/api/spend", get(api_spend))
        .route_layer(from_fn_with_state(state.clone(), crate::overload::guard))
        .route_layer(from_fn_with_state(state.clone(), require_access));
    Router::new()
        .route("/ui", get(|| file(INDEX_HTML, "text/html; charset=utf-8")))
        .route("/ui/", get(|| file(INDEX_HTML, "text/html; charset=utf-8")))
        .route("/ui/console.css", get(|| file(CONSOLE_CSS, "text/css; charset=utf-8")))
        .route(
            "/ui/shared.js",
            get(|| file(SHARED_JS, "text/javascript; charset=utf-8")),
        )
        .route(
            "/ui/console.js",
            get(|| file(CONSOLE_JS, "text/javascript; charset=utf-8")),
        )
        .route("/ui/keys.js", get(|| file(KEYS_JS, "text/javascript; charset=utf-8")))
        .route(
            "/ui/budgets.js",
            get(|| file(BUDGETS_JS, "text/javascript; charset=utf-8")),
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

/// `GET /ui/api/directory`: the tenants and keys panel, with one page of keys.
async fn api_directory(State(state): State<AppState>, uri: Uri) -> Result<Response, ApiError> {
    let query = KeysQuery::parse(uri.query()).map_err(ApiError::InvalidRequest)?;
    let directory = state
        .directory()
        .ok_or_else(|| ApiError::RouteNotFound("/ui/api/directory (the tenants and keys are not open yet)".to_owned()))?
        .clone();
    let document = directory_document(&state, &directory, &query).await;
    let mut response = Json(document).into_response();
    (response.headers_mut()).insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
}

/// `GET /ui/api/budgets`: every budget in money with what it holds, spent and left.
async fn api_budgets(State(state): State<AppState>) -> Response {
    let document = budgets_document(&state, now_unix_ms()).await;
    let mut response = Json(document).into_response();
    (response.headers_mut()).insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// `GET /ui/api/spend`: the spend of the last days by tenant and by model, for the chart.
async fn api_spend(State(state): State<AppState>) -> Result<Response, ApiError> {
    let book = state.spend().ok_or_else(|| {
        ApiError::RouteNotFound("/ui/api/spend (the spend ledger is kept with a gateway section)".to_owned())
    })?;
    let document = spend_document(&**book, now_unix_ms()).await.map_err(|e| {
        tracing::warn!(error = %e, "console: the spend ledger could not be read");
        ApiError::Unavailable {
            retry_after_ms: SPEND_RETRY_MS,
        }
    })?;
    let mut response = Json(document).into_response();
    (response.headers_mut()).insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
}
