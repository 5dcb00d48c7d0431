//! Prices of model calls in money (docs/prices.md): what a budget in dollars counts.
//!
//! A price is given in USD per million tokens, as providers publish it, and kept as
//! integer micro-dollars per million tokens ([`ModelPrice`]); costs are integer
//! micro-dollars (1 unit = $0.000001), the unit of a budget limit's capacity. The
//! worst case of a call ([`worst_case_micro_usd`]) is what a budget reserves before
//! the call is sent, the billed cost of its reported usage ([`billed_micro_usd`]) what
//! Complete reconciles to; both round up, so rounding never lets a budget overspend.
//! A price comes from the deployment, else the model, else the compiled list of
//! providers' list prices ([`LIST_PRICES`]); a model with none is an error
//! ([`resolve_price`]), never a silent $0.

pub mod budget;
mod cost;
mod error;
mod list;
mod model_price;
mod resolve;

pub use cost::{billed_micro_usd, worst_case_micro_usd, CallBound, Usage, MICRO_USD_PER_USD};
pub use error::PriceError;
pub use list::{list_price, ListPrice, LIST_PRICES};
pub use model_price::{ModelPrice, PriceFields, PRICE_USD_PER_MTOK_MAX};
pub use resolve::{resolve_price, PriceSource, ResolvedPrice};
