//! The router: every endpoint of docs/http-api.md, "Endpoints", with auth, load shedding
//! and JSON errors for unknown paths and methods.

use axum::extract::OriginalUri;
use axum::http::Method;
use axum::middleware::from_fn_with_state;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::Router;

use crate::error::ApiError;
use crate::state::AppState;
use crate::{admin, auth, console, echo, health, lease, overload};

/// The whole HTTP API on `state`.
pub fn app(state: AppState) -> Router {
    let client = Router::new()
        .route("/v1/reserve", post(lease::reserve))
        .route("/v1/complete", post(lease::complete))
        .route_layer(from_fn_with_state(state.auth().clone(), auth::require_client));
    let admin = Router::new()
        .route("/v1/admin/limits", put(admin::put_limit).get(admin::list_limits))
        // Keys may contain `/`, so the rest of the path is the key.
        .route("/v1/admin/limits/{*key}", get(admin::get_limit))
        .route("/v1/admin/gateway/deployments", get(admin::gateway_deployments))
        .route("/v1/admin/gateway/classes", get(admin::gateway_classes))
        .route("/v1/admin/servers", get(admin::fleet_servers))
        .merge(directory_routes(&state))
        .merge(spend_routes(&state))
        .route("/v1/admin/gateway/prices", get(crate::prices_api::prices))
        .route(
            "/v1/admin/gateway/prices/reload",
            post(crate::prices_api::reload_prices),
        )
        .route_layer(from_fn_with_state(state.auth().clone(), auth::require_admin));
    let mut api = client.merge(admin);
    if state.echo_route() {
        api = api.route("/v1/echo", post(echo::echo));
    }
    let api = api.route_layer(from_fn_with_state(state.clone(), overload::guard));
    Router::new()
        .merge(api)
        .merge(console::routes::router(&state))
        .route("/healthz", get(health::healthz))
        .route("/metrics", get(health::metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(from_fn_with_state(state.auth().clone(), auth::require_origin))
        .with_state(state)
}

/// The gateway's tenants and keys (docs/http-api.md, "Tenants and keys").
fn directory_routes(state: &AppState) -> Router<AppState> {
    use crate::directory_api as d;
    Router::new()
        .route("/v1/admin/gateway/tenants", post(d::create_tenant).get(d::list_tenants))
        .route(
            "/v1/admin/gateway/tenants/{name}",
            get(d::get_tenant).patch(d::update_tenant).delete(d::delete_tenant),
        )
        .route("/v1/admin/gateway/keys", post(d::create_key).get(d::list_keys))
        .route(
            "/v1/admin/gateway/keys/{id}",
            get(d::get_key).patch(d::update_key).delete(d::revoke_key),
        )
        .route("/v1/admin/gateway/keys/{id}/rotate", post(d::rotate_key))
        .route_layer(from_fn_with_state(state.clone(), d::served))
}

/// The gateway's spend report (docs/http-api.md, "Spend").
fn spend_routes(state: &AppState) -> Router<AppState> {
    use crate::spend_api as s;
    Router::new()
        .route("/v1/admin/gateway/spend", get(s::gateway_spend))
        .route_layer(from_fn_with_state(state.clone(), s::served))
}

async fn not_found(method: Method, OriginalUri(uri): OriginalUri) -> Response {
    ApiError::RouteNotFound(format!("{method} {}", uri.path())).into_response()
}

async fn method_not_allowed(method: Method, OriginalUri(uri): OriginalUri) -> Response {
    ApiError::MethodNotAllowed(format!("{method} is not allowed on {}", uri.path())).into_response()
}
