//! A model's `deployments:` (docs/gateway.md, "Pools"): how a model resolves
//! into its deployments, and the rules of a pool's shape.

use super::{
    DeploymentConfig, GatewayConfigError, ModelConfig, Routing, UpstreamConfig, DEPLOYMENTS_MAX, PRIORITY_MAX,
    WEIGHT_MAX,
};

/// A deployment resolved: its single-deployment form (name = the model sent
/// upstream, with its own limits) and its place in the pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The deployment as a single-deployment model entry.
    pub model: ModelConfig,
    /// Its priority.
    pub priority: u32,
    /// Its weight.
    pub weight: u32,
}

/// The deployments of `model`: its `deployments`, or itself as the one deployment.
pub fn resolve(model: &ModelConfig) -> Vec<Resolved> {
    if model.deployments.is_empty() {
        let mut single = model.clone();
        single.breaker = None;
        return vec![Resolved {
            model: single,
            priority: 0,
            weight: 1,
        }];
    }
    model
        .deployments
        .iter()
        .map(|d| Resolved {
            model: ModelConfig {
                name: d.model.clone().unwrap_or_else(|| model.name.clone()),
                upstream: d.upstream.clone(),
                limits: d.limits.clone(),
                deployments: Vec::new(),
                breaker: None,
                // The deployment's price wins over the model's.
                price: d.price.or(model.price),
                ..model.clone()
            },
            priority: d.priority,
            weight: d.weight.unwrap_or(1),
        })
        .collect()
}

fn invalid(entry: String, model: &str, message: impl std::fmt::Display) -> GatewayConfigError {
    GatewayConfigError {
        entry,
        message: format!("model {model:?}: {message}"),
    }
}

/// The rules of a model's form: `upstream` and its limits, or `deployments`, not
/// both; the pool's own fields only with `deployments`.
pub fn validate_shape(model: &ModelConfig, entry: &dyn Fn(&str) -> String) -> Result<(), GatewayConfigError> {
    let name = &model.name;
    if model.deployments.is_empty() {
        if model.upstream.is_empty() {
            return Err(invalid(entry("upstream"), name, "give upstream, or deployments"));
        }
        if model.routing != Routing::default() {
            return Err(invalid(
                entry("routing"),
                name,
                "routing is for a model with deployments",
            ));
        }
        if model.breaker.is_some() {
            return Err(invalid(
                entry("breaker"),
                name,
                "breaker is for a model with deployments",
            ));
        }
        return Ok(());
    }
    let upstream = [("upstream", !model.upstream.is_empty())];
    let single_fields = upstream.into_iter().chain(model.limits.fields_set());
    if let Some((field, _)) = single_fields.into_iter().find(|(_, set)| *set) {
        return Err(invalid(
            entry(field),
            name,
            format!("give upstream and its limits, or deployments, not both ({field} belongs in each deployment)"),
        ));
    }
    if model.deployments.len() > DEPLOYMENTS_MAX {
        return Err(invalid(
            entry("deployments"),
            name,
            format!("at most {DEPLOYMENTS_MAX} deployments"),
        ));
    }
    if let Some(breaker) = &model.breaker {
        breaker
            .check()
            .map_err(|(field, message)| invalid(entry(&format!("breaker.{field}")), name, message))?;
    }
    for (j, deployment) in model.deployments.iter().enumerate() {
        let field = |f: &str| entry(&format!("deployments[{j}].{f}"));
        if deployment.priority > PRIORITY_MAX {
            return Err(invalid(field("priority"), name, format!("must be 0..={PRIORITY_MAX}")));
        }
        if let Some(weight) = deployment.weight {
            if model.routing != Routing::Weighted {
                return Err(invalid(field("weight"), name, "weight is for routing: weighted"));
            }
            if !(1..=WEIGHT_MAX).contains(&weight) {
                return Err(invalid(field("weight"), name, format!("must be 1..={WEIGHT_MAX}")));
            }
        }
    }
    Ok(())
}

/// A pool's deployments speak one wire format ([`UpstreamConfig::format_of`]):
/// OpenAI's (openai, openai-compatible, azure and the OpenAI-format Bedrock and
/// Vertex models mix) or Anthropic's (anthropic, and Claude on Bedrock and Vertex).
pub fn validate_formats(
    model: &ModelConfig,
    upstreams: &[UpstreamConfig],
    entry: &dyn Fn(&str) -> String,
) -> Result<(), GatewayConfigError> {
    let kind_of = |d: &DeploymentConfig| {
        let sent = d.model.as_deref().unwrap_or(&model.name);
        (upstreams.iter().find(|u| u.name == d.upstream)).map(|u| u.format_of(sent).is_openai())
    };
    let mut kinds = model.deployments.iter().map(kind_of);
    let Some(first) = kinds.next() else { return Ok(()) };
    for (j, kind) in kinds.enumerate() {
        if kind != first {
            return Err(invalid(
                entry(&format!("deployments[{}].upstream", j + 1)),
                &model.name,
                "a pool's deployments speak one wire format (OpenAI's, or Anthropic's)",
            ));
        }
    }
    Ok(())
}
