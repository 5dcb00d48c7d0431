//! The prices in force, changed at runtime (docs/gateway.md, "Prices"): a
//! configuration's `price:` fields applied to the running gateway's
//! deployments. A call reads its deployment's price once, at admission, and is
//! reconciled at that price: a change applies to calls admitted after it.

use serde::Serialize;
use sha2::{Digest, Sha256};

use ratelimiter::price::ModelPrice;

use super::Gateway;
use crate::config::{deployment_price, resolve, GatewayConfig, GatewayConfigError};

/// The hexadecimal digits of the prices' digest shown: 64 bits tell a fleet's
/// servers apart without a chance collision in practice.
const DIGEST_HEX_DIGITS: usize = 16;

/// One deployment's price in force.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PriceInForce {
    /// The model name clients send.
    pub model: String,
    /// The deployment's upstream.
    pub deployment: String,
    /// The model name sent to it.
    pub upstream_model: String,
    /// Its price in USD per million tokens; `None`: unpriced (no budget configured).
    pub price: Option<ModelPrice>,
}

/// One deployment's price a reload changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PriceChange {
    /// The model name clients send.
    pub model: String,
    /// The deployment's upstream.
    pub deployment: String,
    /// The price before.
    pub before: Option<ModelPrice>,
    /// The price calls admitted from now on pay.
    pub after: Option<ModelPrice>,
}

impl GatewayConfig {
    /// This configuration with the `price:` fields of `other`: a model of the
    /// same name takes its price, and each of its deployments that `other`
    /// lists at the same place takes that deployment's. Nothing else changes.
    pub fn with_prices_of(&self, other: &GatewayConfig) -> GatewayConfig {
        let mut config = self.clone();
        for model in &mut config.models {
            let Some(theirs) = other.models.iter().find(|m| m.name == model.name) else {
                continue;
            };
            model.price = theirs.price;
            for (j, deployment) in model.deployments.iter_mut().enumerate() {
                deployment.price = theirs.deployments.get(j).and_then(|d| d.price);
            }
        }
        config
    }

    /// What differs between this configuration and `other` beyond prices, by
    /// entry (`models[gpt-4o]`, or `fields beyond models` for any other field):
    /// what only a restart applies.
    pub fn differences_beyond_prices(&self, other: &GatewayConfig) -> Vec<String> {
        let (ours, theirs) = (self.with_prices_of(other), other);
        let mut differences: Vec<String> = (ours.models.iter())
            .filter(|m| theirs.models.iter().all(|t| t != *m))
            .chain(
                theirs
                    .models
                    .iter()
                    .filter(|t| ours.models.iter().all(|m| m.name != t.name)),
            )
            .map(|m| format!("models[{}]", m.name))
            .collect();
        differences.dedup();
        let rest = |c: &GatewayConfig| GatewayConfig {
            models: Vec::new(),
            ..c.clone()
        };
        if rest(&ours) != rest(theirs) {
            differences.push("fields beyond models".to_owned());
        }
        differences
    }
}

impl Gateway {
    /// Every deployment's price in force, by model name then pool order.
    pub fn prices(&self) -> Vec<PriceInForce> {
        let mut names: Vec<&String> = self.models.keys().collect();
        names.sort();
        (names.into_iter())
            .flat_map(|name| self.models[name].pool.deployments.iter())
            .map(|d| PriceInForce {
                model: d.state.model.clone(),
                deployment: d.state.upstream.clone(),
                upstream_model: d.state.upstream_model.clone(),
                price: d.keys().price,
            })
            .collect()
    }

    /// A digest of [`Gateway::prices`]: servers showing the same digest apply
    /// the same prices.
    pub fn prices_digest(&self) -> String {
        let text = serde_json::to_vec(&self.prices()).expect("prices serialize");
        let digest = Sha256::digest(&text);
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        hex[..DIGEST_HEX_DIGITS].to_owned()
    }

    /// Applies the prices of `config` (the running configuration with new
    /// `price:` fields, [`GatewayConfig::with_prices_of`]) to calls admitted
    /// from now on. Validated first, as at start: an invalid configuration is
    /// refused naming its field, and changes nothing. A price is not taken
    /// away at runtime either: a call checked against it for the budgets of
    /// the directory's tenants could go uncounted; a restart removes it.
    /// Returns what changed.
    pub fn set_prices(&self, config: &GatewayConfig) -> Result<Vec<PriceChange>, GatewayConfigError> {
        config.validate()?;
        let mut next = Vec::new();
        for (i, model) in config.models.iter().enumerate() {
            let Some(entry) = self.models.get(&model.name) else {
                continue;
            };
            for (j, (resolved, deployment)) in resolve(model).iter().zip(&entry.pool.deployments).enumerate() {
                let same = resolved.model.upstream == deployment.config.upstream
                    && resolved.model.name == deployment.config.name;
                let upstream = config.upstreams.iter().find(|u| u.name == resolved.model.upstream);
                let (true, Some(upstream)) = (same, upstream) else {
                    continue; // a changed pool: only a restart applies it
                };
                let after = deployment_price(&resolved.model, upstream).ok().map(|p| p.price);
                if after.is_none() && deployment.keys().price.is_some() {
                    return Err(GatewayConfigError {
                        entry: price_entry(model, i, j),
                        message: format!(
                            "model {:?}: a price is not removed while the server runs; restart to remove it",
                            model.name
                        ),
                    });
                }
                next.push((model, deployment, after));
            }
        }
        let mut changes = Vec::new();
        for (model, deployment, after) in next {
            let before = deployment.set_price(after);
            if before != after {
                changes.push(PriceChange {
                    model: model.name.clone(),
                    deployment: deployment.state.upstream.clone(),
                    before,
                    after,
                });
            }
        }
        Ok(changes)
    }
}

/// The entry of the price of deployment `j` of `model` (index `i`).
fn price_entry(model: &crate::config::ModelConfig, i: usize, j: usize) -> String {
    if model.deployments.is_empty() {
        format!("models[{i}].price")
    } else {
        format!("models[{i}].deployments[{j}].price")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gateway of one pool and one single model, with `tail` appended to the pool.
    fn config(pool_price: &str, ptu_price: &str, rpm: u64, tail: &str) -> GatewayConfig {
        let text = format!(
            r#"
listen_addr: "127.0.0.1:0"
allow_anonymous: true
upstreams:
  - {{name: oai, kind: openai, base_url: "http://127.0.0.1:9"}}
  - {{name: ptu, kind: openai, base_url: "http://127.0.0.1:9"}}
models:
  - name: gpt-4o
    price: {pool_price}
    deployments:
      - {{upstream: ptu, price: {ptu_price}}}
      - {{upstream: oai, rpm: {rpm}}}
  - {{name: gpt-4o-mini, upstream: oai}}
{tail}"#
        );
        serde_yaml::from_str(&text).unwrap()
    }

    #[test]
    fn only_the_prices_of_the_same_models_and_places_are_taken() {
        let running = config("{input: 1, output: 2}", "{input: 0, output: 0}", 60, "");
        let file = config("{input: 3, output: 4}", "{input: 5, output: 6}", 5, "");
        let next = running.with_prices_of(&file);
        assert_eq!(next.models[0].price, file.models[0].price);
        assert_eq!(next.models[0].deployments[0].price, file.models[0].deployments[0].price);
        assert_eq!(
            next.models[0].deployments[1].limits.published.rpm,
            Some(60),
            "a limit is not a price"
        );
        assert_eq!(next.models[1], running.models[1]);
    }

    #[test]
    fn what_differs_beyond_prices_is_named_by_entry() {
        let running = config("{input: 1, output: 2}", "{input: 0, output: 0}", 60, "");
        let repriced = config("{input: 3, output: 4}", "{input: 5, output: 6}", 60, "");
        assert_eq!(running.differences_beyond_prices(&repriced), Vec::<String>::new());
        let limit = config("{input: 3, output: 4}", "{input: 0, output: 0}", 5, "");
        assert_eq!(running.differences_beyond_prices(&limit), ["models[gpt-4o]"]);
        let added = config(
            "{input: 1, output: 2}",
            "{input: 0, output: 0}",
            60,
            "  - {name: o3, upstream: oai}\n",
        );
        assert_eq!(running.differences_beyond_prices(&added), ["models[o3]"]);
        let mut budget = running.clone();
        budget.budgets = config(
            "{input: 1, output: 2}",
            "{input: 0, output: 0}",
            60,
            "budgets: [{usd: 5, period: day}]\n",
        )
        .budgets;
        assert_eq!(running.differences_beyond_prices(&budget), ["fields beyond models"]);
    }
}
