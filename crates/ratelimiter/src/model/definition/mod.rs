//! Limit definitions and their admin state (docs/http-api.md, "LimitDefinition";
//! docs/decisions.md, "Limit definitions").

mod bounds;
mod error;
mod kind;
mod limit;
mod state;
#[cfg(test)]
mod tests;

pub use bounds::{
    check_window_margin_ms, DESCRIPTION_BYTES_MAX, TIMEOUT_SECONDS_MAX, UNIT_BYTES_MAX, WINDOW_MARGIN_MS_DEFAULT,
    WINDOW_MARGIN_MS_MAX, WINDOW_MARGIN_WINDOW_DIVISOR, WINDOW_SECONDS_MAX,
};
pub use error::DefinitionError;
pub use kind::{LimitKind, Overage};
pub use limit::{DefinitionFields, LimitDefinition};
pub use state::{available_of, LimitReport, LimitState, LimitStatus};
