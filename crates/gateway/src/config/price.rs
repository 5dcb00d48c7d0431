//! Which price each deployment's calls pay (docs/gateway.md, "Budgets and
//! spend"), and the rules on budgets and prices a parse cannot check.

use ratelimiter::price::{resolve_price, PriceError, ResolvedPrice};

use super::error::invalid;
use super::{resolve, validate_budgets, GatewayConfig, GatewayConfigError, ModelConfig, UpstreamConfig, UpstreamKind};

/// The provider whose list prices a deployment's model is looked up in: its
/// profile's (`openai`, `azure`, `anthropic`, `gemini`, `bedrock`), else its
/// upstream's kind. Only OpenAI's, Anthropic's and Gemini's own APIs have list
/// prices (docs/prices.md); Azure, Bedrock, Vertex AI and other
/// OpenAI-compatible servers bill their own rates, so their models need a `price`.
pub fn price_provider(kind: UpstreamKind, profile: Option<&str>) -> &str {
    match (profile, kind) {
        (Some(profile), _) => profile,
        // The kind's own name: only openai's and anthropic's have list prices.
        (None, kind) => kind.name(),
    }
}

/// The price of calls through `deployment` (a model's single-deployment form, as
/// [`resolve`] gives it, whose `price` is the deployment's own or else the
/// model's) on `upstream`: that price, else the list price of the model it sends
/// upstream; an error naming the model when neither exists.
pub fn deployment_price(deployment: &ModelConfig, upstream: &UpstreamConfig) -> Result<ResolvedPrice, PriceError> {
    let provider = price_provider(upstream.kind, deployment.limits.profile.as_deref());
    resolve_price(deployment.price.as_ref(), None, provider, &deployment.name)
}

impl GatewayConfig {
    /// Whether any budget is configured: then every deployment needs a price.
    pub fn has_budgets(&self) -> bool {
        !self.budgets.is_empty()
            || self.models.iter().any(|m| !m.budgets.is_empty())
            || self.tenants.iter().any(|t| !t.budgets.is_empty())
    }

    /// The budgets of the gateway, each model and each tenant are valid, and,
    /// when any is configured, every deployment has a price (its own, its
    /// model's or a list price): a budget never counts a call as free by default.
    pub(super) fn validate_money(&self) -> Result<(), GatewayConfigError> {
        let as_error = |(entry, message): (String, String)| invalid(entry, message);
        validate_budgets(&self.budgets, &|f: &str| f.to_owned()).map_err(as_error)?;
        for (i, tenant) in self.tenants.iter().enumerate() {
            validate_budgets(&tenant.budgets, &|f: &str| format!("tenants[{i}].{f}")).map_err(as_error)?;
        }
        for (i, model) in self.models.iter().enumerate() {
            validate_budgets(&model.budgets, &|f: &str| format!("models[{i}].{f}")).map_err(as_error)?;
        }
        if !self.has_budgets() {
            return Ok(());
        }
        for (i, model) in self.models.iter().enumerate() {
            self.check_priced(i, model)?;
        }
        Ok(())
    }

    /// Every deployment of `model` (index `i`) has a price.
    fn check_priced(&self, i: usize, model: &ModelConfig) -> Result<(), GatewayConfigError> {
        for (j, resolved) in resolve(model).iter().enumerate() {
            let Some(upstream) = self.upstreams.iter().find(|u| u.name == resolved.model.upstream) else {
                continue; // refused with its own message by validate_models
            };
            if let Err(error) = deployment_price(&resolved.model, upstream) {
                let entry = if model.deployments.is_empty() {
                    format!("models[{i}].price")
                } else {
                    format!("models[{i}].deployments[{j}].price")
                };
                return Err(invalid(
                    entry,
                    format!("model {:?}: budgets are configured, and {error}", model.name),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimiter::price::{ModelPrice, PriceSource};

    const UPSTREAMS: &str = r#"
listen_addr: "127.0.0.1:0"
allow_anonymous: true
upstreams:
  - {name: oai, kind: openai, base_url: "http://127.0.0.1:9"}
  - {name: claude-eu, kind: anthropic, base_url: "http://127.0.0.1:9"}
  - {name: vllm, kind: openai-compatible, base_url: "http://127.0.0.1:9"}
"#;

    fn parse(models: &str) -> GatewayConfig {
        serde_yaml::from_str(&format!("{UPSTREAMS}{models}")).unwrap()
    }

    /// Each deployment's resolved price, in pool order.
    fn prices(config: &GatewayConfig) -> Vec<Result<ResolvedPrice, PriceError>> {
        let model = &config.models[0];
        (resolve(model).iter())
            .map(|d| {
                let upstream = config.upstreams.iter().find(|u| u.name == d.model.upstream).unwrap();
                deployment_price(&d.model, upstream)
            })
            .collect()
    }

    #[test]
    fn a_deployments_price_wins_then_the_models_then_the_list() {
        let config = parse(
            r#"
models:
  - name: claude-sonnet-4-5
    price: {input: 2, output: 8}
    deployments:
      - {upstream: claude-eu, price: {input: 0, output: 0}}
      - {upstream: claude-eu, model: claude-sonnet-4-5-20250929}
  - name: gpt-4o
    upstream: oai
"#,
        );
        config.validate().unwrap();
        let got = prices(&config);
        assert_eq!(got[0].as_ref().unwrap().price, ModelPrice::FREE, "the PTU's own price");
        let model = got[1].as_ref().unwrap();
        assert_eq!(model.price.input_micro_usd_per_mtok(), 2_000_000, "the model's price");
        let listed = parse("models:\n  - {name: gpt-4o, upstream: oai}\n");
        let listed = prices(&listed).remove(0).unwrap();
        assert!(matches!(listed.source, PriceSource::List(row) if row.model == "gpt-4o"));
        assert_eq!(listed.price.input_micro_usd_per_mtok(), 2_500_000);
    }

    #[test]
    fn an_unpriced_model_is_refused_only_when_budgets_are_configured() {
        let unpriced = "models:\n  - {name: llama, upstream: vllm}\n";
        parse(unpriced).validate().unwrap();
        for budgets in [
            "budgets: [{usd: 20, period: day}]\n",
            "models:\n  - {name: llama, upstream: vllm, budgets: [{usd: 1, window_seconds: 60}]}\n",
        ] {
            let text = if budgets.starts_with("models") {
                budgets.to_owned()
            } else {
                format!("{unpriced}{budgets}")
            };
            let error = parse(&text).validate().unwrap_err();
            assert_eq!(error.entry, "models[0].price", "{error}");
            assert!(error.message.contains("openai-compatible/llama"), "{error}");
            assert!(error.message.contains("price: {input: 0, output: 0}"), "{error}");
        }
        let free = "models:\n  - {name: llama, upstream: vllm, price: {input: 0, output: 0}}\nbudgets: [{usd: 20, period: day}]\n";
        parse(free).validate().unwrap();
        let pool = "models:\n  - name: gpt-4o\n    deployments: [{upstream: oai}, {upstream: vllm}]\nbudgets: [{usd: 1, period: month}]\n";
        assert_eq!(
            parse(pool).validate().unwrap_err().entry,
            "models[0].deployments[1].price"
        );
        // Azure bills its own rates: a profile of azure has no list price.
        let azure = "models:\n  - {name: gpt-4o, upstream: oai, profile: azure, rpm: 60, tpm: 6000}\nbudgets: [{usd: 1, period: month}]\n";
        assert!(parse(azure).validate().unwrap_err().message.contains("azure/gpt-4o"));
    }

    #[test]
    fn bad_budgets_and_prices_are_refused_naming_the_entry() {
        let model = "models:\n  - {name: gpt-4o, upstream: oai}\n";
        let error = parse(&format!("{model}budgets: [{{usd: -5, period: month}}]\n"))
            .validate()
            .unwrap_err();
        assert_eq!(error.entry, "budgets[0].usd", "{error}");
        let text = "models:\n  - {name: gpt-4o, upstream: oai, budgets: [{usd: 5, period: fortnight}]}\n";
        let error = parse(text).validate().unwrap_err();
        assert_eq!(error.entry, "models[0].budgets[0].period", "{error}");
        let bad_price =
            format!("{UPSTREAMS}models:\n  - {{name: gpt-4o, upstream: oai, price: {{input: -1, output: 1}}}}\n");
        let error = serde_yaml::from_str::<GatewayConfig>(&bad_price)
            .unwrap_err()
            .to_string();
        assert!(error.contains("price.input"), "{error}");
    }
}
