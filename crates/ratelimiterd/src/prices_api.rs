//! `POST /v1/admin/gateway/prices/reload` and `GET /v1/admin/gateway/prices`
//! (docs/gateway.md, "Prices"): the reload of the configuration file's prices
//! ([`crate::price_reload`]), and the prices in force with their digest, which
//! tells whether a fleet's servers agree.

use axum::extract::State;
use axum::Json;

use crate::error::ApiError;
use crate::price_reload::{PricesInForce, Reloaded};
use crate::state::AppState;

/// The reload of a server without a gateway read from a file.
fn unavailable() -> ApiError {
    ApiError::InvalidRequest(
        "this server runs no gateway started from a configuration file: there are no prices to reload".to_owned(),
    )
}

/// `POST /v1/admin/gateway/prices/reload`: 200 with what changed; 400 with the
/// message naming the field of a file refused (nothing changed).
pub async fn reload_prices(State(state): State<AppState>) -> Result<Json<Reloaded>, ApiError> {
    let reload = state.price_reload().ok_or_else(unavailable)?;
    reload.reload().await.map(Json).map_err(ApiError::InvalidRequest)
}

/// `GET /v1/admin/gateway/prices`: each deployment's price in force and their digest.
pub async fn prices(State(state): State<AppState>) -> Result<Json<PricesInForce>, ApiError> {
    let gateway = state.gateway().ok_or_else(unavailable)?;
    Ok(Json(PricesInForce {
        prices_digest: gateway.prices_digest(),
        prices: gateway.prices(),
    }))
}
