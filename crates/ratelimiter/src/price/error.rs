//! Why a price is refused or missing.

/// A price that cannot be used: an invalid field, or no price at all for a model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PriceError {
    /// A field of a price is out of range; `field` names it (`input`, `cache_read`…).
    #[error("price.{field}: {reason}")]
    Invalid {
        /// The field, as written in configuration.
        field: &'static str,
        /// What is wrong with its value.
        reason: String,
    },
    /// Neither the deployment, the model nor the list of list prices prices this
    /// model: a budget cannot count its calls, and $0 would skip the budget.
    #[error(
        "no price for model {provider}/{model}: give the model or its deployment a price \
         (price: {{input: 0, output: 0}} says it is free)"
    )]
    Unknown {
        /// The model's provider, e.g. `anthropic`.
        provider: String,
        /// The model as the configuration names it.
        model: String,
    },
}
