//! Which price a call of a model pays: the deployment's, else the model's, else the
//! list price; no price at all is an error, never $0.

use super::error::PriceError;
use super::list::{list_price, ListPrice};
use super::model_price::ModelPrice;

/// Where a resolved price comes from, for logs and reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PriceSource {
    /// The deployment's own price (a PTU at 0 beside pay-as-you-go spillover).
    Deployment,
    /// The model's price in configuration.
    Model,
    /// The compiled list price, with its source and date.
    List(&'static ListPrice),
}

/// A price and where it comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResolvedPrice {
    /// The price calls pay.
    pub price: ModelPrice,
    /// Where it comes from.
    pub source: PriceSource,
}

/// The price of calls of `model` at `provider` through a deployment: the
/// deployment's price when it gives one, else the model's, else its list price
/// ([`super::LIST_PRICES`]). Errs naming the model when none applies: a budget
/// cannot count a call it cannot price, and counting it as free would skip the budget.
pub fn resolve_price(
    deployment: Option<&ModelPrice>,
    model_price: Option<&ModelPrice>,
    provider: &str,
    model: &str,
) -> Result<ResolvedPrice, PriceError> {
    if let Some(&price) = deployment {
        return Ok(ResolvedPrice {
            price,
            source: PriceSource::Deployment,
        });
    }
    if let Some(&price) = model_price {
        return Ok(ResolvedPrice {
            price,
            source: PriceSource::Model,
        });
    }
    match list_price(provider, model) {
        Some(row) => Ok(ResolvedPrice {
            price: row.price,
            source: PriceSource::List(row),
        }),
        None => Err(PriceError::Unknown {
            provider: provider.to_owned(),
            model: model.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAYG: ModelPrice =
        ModelPrice::from_micro_usd_per_mtok(2_500_000, 10_000_000, 1_250_000, 2_500_000, 2_500_000);

    #[test]
    fn the_deployment_wins_then_the_model_then_the_list() {
        let sonnet = "claude-sonnet-4-5";
        let ptu = resolve_price(Some(&ModelPrice::FREE), Some(&PAYG), "anthropic", sonnet).unwrap();
        assert_eq!((ptu.price, ptu.source), (ModelPrice::FREE, PriceSource::Deployment));
        let model = resolve_price(None, Some(&PAYG), "anthropic", sonnet).unwrap();
        assert_eq!((model.price, model.source), (PAYG, PriceSource::Model));
        let listed = resolve_price(None, None, "anthropic", sonnet).unwrap();
        assert!(matches!(listed.source, PriceSource::List(row) if row.model == sonnet));
        assert_eq!(listed.price.input_micro_usd_per_mtok(), 3_000_000);
    }

    #[test]
    fn an_unknown_model_is_an_error_naming_it() {
        let error = resolve_price(None, None, "openai", "gpt-4o-2024-05-13").unwrap_err();
        assert_eq!(
            error,
            PriceError::Unknown {
                provider: "openai".to_owned(),
                model: "gpt-4o-2024-05-13".to_owned()
            }
        );
        assert!(error.to_string().contains("openai/gpt-4o-2024-05-13"), "{error}");
        let free = resolve_price(None, Some(&ModelPrice::FREE), "local", "llama").unwrap();
        assert_eq!(free.price, ModelPrice::FREE, "a self-hosted model says it is free");
    }
}
