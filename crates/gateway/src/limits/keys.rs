//! The limits the configuration implies, as ordinary registry definitions, and
//! what one call reserves and completes on them (docs/gateway.md, "Limits").

use ratelimiter::directory::{KeyRecord, TenantRecord};
use ratelimiter::profile::{ProfileCall, ProviderUsage};
use ratelimiter::{Actual, LimitDefinition, LimitKey, LimitKind, Overage, Requirement};

use super::budget_key::{as_budget, directory_budget_keys, BudgetKey};
use super::budgets::{budget_actuals, budget_definitions, budget_requirements};
use super::classes::Classes;
use super::key_sets::{tenant_budget_prefix, ModelKeys, TenantKeys};
use crate::config::{GatewayConfig, DAY_WINDOW_SECONDS, MINUTE_WINDOW_SECONDS};
use crate::wire::usage::Usage;

/// Seconds beyond the upstream timeout before a concurrency hold of a crashed
/// server ends by itself: a call in flight always ends (and releases) first.
pub const CONCURRENCY_TIMEOUT_MARGIN_SECONDS: u64 = 60;

/// A call as a profile sizes it: the gateway's exact count of the prompt (the
/// rules that estimate from characters never reserve less than it) and the output
/// bound times the choices.
fn profile_call(input: u64, output: u64) -> ProfileCall<'static> {
    ProfileCall {
        prompt: "",
        prompt_tokens: Some(input),
        cache_read_tokens: 0,
        max_output_tokens: output,
        best_of: 1,
    }
}

/// The dimensions (a key's last part) that count requests: never reconciled
/// above the one reserved, so they need no overage policy.
const REQUEST_DIMENSIONS: [&str; 2] = ["rpm", "rpd"];

/// `definition` as the gateway applies it: a budget, of tokens or money, owes
/// what it cannot hold ([`as_budget`]); any other token limit records usage above
/// a full window as debt (`overage: debt`, docs/decisions.md), so a provider's
/// count above the reservation stays visible to the admin API instead of being
/// dropped.
pub fn with_debt(definition: LimitDefinition) -> LimitDefinition {
    match as_budget(definition) {
        Ok(budget) => budget,
        Err(other) => {
            let dimension = other.key().as_str().rsplit(':').next().unwrap_or("");
            if other.kind() != LimitKind::Concurrency && !REQUEST_DIMENSIONS.contains(&dimension) {
                other.with_overage(Overage::Debt)
            } else {
                other
            }
        }
    }
}

/// The prompt tokens a call of `model` reserves: its count, or, under a profile,
/// what the provider charges at admission (for OpenAI and Azure at least the
/// character estimate, `ProfileRules::counted_prompt_charge`).
pub fn prompt_charge(model: &ModelKeys, input_tokens: u64, prompt_characters: u64) -> u64 {
    model.profile.as_ref().map_or(input_tokens, |rules| {
        rules.counted_prompt_charge(input_tokens, prompt_characters)
    })
}

/// Every definition the configuration implies, for the registry: the model and
/// tenant limits, and the classes' ceilings over the model limits (`limits/classes.rs`).
pub fn definitions(config: &GatewayConfig) -> Vec<LimitDefinition> {
    let mut definitions = definitions_without_ceilings(config);
    let classes = Classes::new(&config.classes);
    let ceilings = classes.ceiling_definitions(&definitions);
    definitions.extend(ceilings.expect("ceilings were checked with the configuration"));
    definitions
}

/// The model and tenant limits the configuration implies, without the classes' ceilings.
pub fn definitions_without_ceilings(config: &GatewayConfig) -> Vec<LimitDefinition> {
    definitions_as_given(config).into_iter().map(with_debt).collect()
}

/// [`definitions`] before the gateway's overage policy.
fn definitions_as_given(config: &GatewayConfig) -> Vec<LimitDefinition> {
    let hold_seconds = concurrency_hold_seconds(config.upstream_timeout_ms);
    let rolling = |key: &LimitKey, capacity: u64, window: u64| {
        LimitDefinition::rolling(key.clone(), capacity, window).expect("validated capacities")
    };
    let concurrency = |key: &LimitKey, capacity: u64| {
        LimitDefinition::concurrency(key.clone(), capacity, hold_seconds).expect("validated capacities")
    };
    let mut out = Vec::new();
    let deployments =
        (config.models.iter()).flat_map(|model| crate::config::resolve(model).into_iter().map(|d| d.model));
    for model in &deployments.collect::<Vec<_>>() {
        if let Some(profile) = model.llm_profile(&model.upstream) {
            // The profile's definitions, its concurrency holds outliving the upstream timeout.
            let profile = profile.expect("profiles were validated with the configuration");
            out.extend(profile.definitions.into_iter().map(|d| match d.kind() {
                LimitKind::Concurrency => concurrency(d.key(), d.capacity()),
                LimitKind::Rolling | LimitKind::Bucket => d,
            }));
            continue;
        }
        let keys = ModelKeys::new(&model.upstream, model);
        let pairs = [
            (&keys.rpm, model.limits.published.rpm),
            (&keys.tpm, model.limits.published.tpm),
            (&keys.input_tpm, model.limits.published.input_tpm),
        ];
        for (key, capacity) in pairs
            .into_iter()
            .chain([(&keys.output_tpm, model.limits.published.output_tpm)])
        {
            if let (Some(key), Some(capacity)) = (key, capacity) {
                out.push(rolling(key, capacity, MINUTE_WINDOW_SECONDS));
            }
        }
        if let (Some(key), Some(capacity)) = (&keys.concurrency, model.limits.published.concurrency) {
            out.push(concurrency(key, capacity));
        }
    }
    for tenant in &config.tenants {
        out.extend(tenant_definitions_as_given(
            &tenant.name,
            (tenant.rpm, tenant.concurrency, tenant.daily_tokens),
            hold_seconds,
        ));
    }
    out.extend(budget_definitions(config));
    out
}

/// The definitions of the tenant `name`'s `(rpm, concurrency, daily_tokens)`.
fn tenant_definitions_as_given(
    name: &str,
    limits: (Option<u64>, Option<u64>, Option<u64>),
    hold_seconds: u64,
) -> Vec<LimitDefinition> {
    let keys = TenantKeys::of(name, limits);
    let (rpm, concurrency, daily_tokens) = limits;
    let valid = "validated capacities";
    let mut out = Vec::new();
    if let (Some(key), Some(capacity)) = (keys.daily_tokens, daily_tokens) {
        out.push(LimitDefinition::rolling(key, capacity, DAY_WINDOW_SECONDS).expect(valid));
    }
    if let (Some(key), Some(capacity)) = (keys.rpm, rpm) {
        out.push(LimitDefinition::rolling(key, capacity, MINUTE_WINDOW_SECONDS).expect(valid));
    }
    if let (Some(key), Some(capacity)) = (keys.concurrency, concurrency) {
        out.push(LimitDefinition::concurrency(key, capacity, hold_seconds).expect(valid));
    }
    out
}

/// How long a concurrency slot of a gateway with `upstream_timeout_ms` is
/// held at most: a call in flight always ends (and releases) first.
pub fn concurrency_hold_seconds(upstream_timeout_ms: u64) -> u64 {
    upstream_timeout_ms.div_ceil(1000) + CONCURRENCY_TIMEOUT_MARGIN_SECONDS
}

/// The definitions of a directory tenant's own limits, the same as a
/// configured tenant's: what the server defines when the tenant is created or changed.
pub fn directory_tenant_definitions(tenant: &TenantRecord, hold_seconds: u64) -> Vec<LimitDefinition> {
    let f = &tenant.fields;
    let limits = (f.rpm, f.concurrency, f.daily_tokens);
    let budgets = directory_budget_keys(&tenant_budget_prefix(&tenant.name), f.budgets.as_deref());
    (tenant_definitions_as_given(&tenant.name, limits, hold_seconds).into_iter())
        .map(with_debt)
        .chain(budgets.iter().filter_map(BudgetKey::definition))
        .collect()
}

/// The definitions of a directory key's own limits, with the gateway's
/// overage policy: what the server defines when the key is created.
pub fn directory_key_definitions(key: &KeyRecord, hold_seconds: u64) -> Vec<LimitDefinition> {
    let budgets = directory_budget_keys(&key.budget_prefix(), key.limits.budgets.as_deref());
    (key.limit_definitions(hold_seconds).into_iter().map(with_debt))
        .chain(budgets.iter().filter_map(BudgetKey::definition))
        .collect()
}

/// What one call reserves, all or nothing: one request, its token bound on every
/// token limit (input and output apart where the model limits them apart), one
/// slot, and the same on the tenant's keys.
pub fn requirements(model: &ModelKeys, tenant: Option<&TenantKeys>, input: u64, output: u64) -> Vec<Requirement> {
    let total = input.saturating_add(output).max(1);
    // A profile's requirements on the model's keys; else the gateway's own, below.
    let mut out = (model.profile.as_ref()).map_or_else(
        || Vec::with_capacity(8),
        |rules| rules.requirements(&profile_call(input, output)),
    );
    let mut push = |key: &Option<LimitKey>, amount: u64| {
        if let Some(key) = key {
            out.push(Requirement {
                key: key.clone(),
                amount: amount.max(1),
            });
        }
    };
    if model.profile.is_none() {
        push(&model.rpm, 1);
        push(&model.tpm, total);
        push(&model.input_tpm, input);
        push(&model.output_tpm, output);
        push(&model.concurrency, 1);
    }
    if let Some(tenant) = tenant {
        push(&tenant.daily_tokens, total);
        push(&tenant.rpm, 1);
        push(&tenant.concurrency, 1);
        if let Some(key) = &tenant.key {
            push(&key.daily_tokens, total);
            push(&key.rpm, 1);
            push(&key.concurrency, 1);
        }
    }
    out.extend(budget_requirements(model, tenant, input, output));
    out
}

/// What a call that reserved `reserved` (input, output) and used `usage` completes
/// with: every token limit reconciled to the provider's count, or, for a model with
/// a profile, to what that provider charges (OpenAI keeps its admission estimate).
/// rpm is not reconciled (one request is one request). A tenant's budget is
/// reconciled to what is billed ([`Usage::billed`]): cache reads count there,
/// though not on the model's input limit.
pub fn actuals(model: &ModelKeys, tenant: Option<&TenantKeys>, reserved: (u64, u64), usage: &Usage) -> Vec<Actual> {
    let mut out = Vec::with_capacity(4);
    if let Some(rules) = &model.profile {
        let used = ProviderUsage {
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
        };
        out.extend(rules.actuals(&profile_call(reserved.0, reserved.1), &used));
    }
    let mut push = |key: &Option<LimitKey>, actual_amount: u64| {
        if let Some(key) = key {
            out.push(Actual {
                key: key.clone(),
                actual_amount,
            });
        }
    };
    push(&model.tpm, usage.total());
    push(&model.input_tpm, usage.input_tokens);
    push(&model.output_tpm, usage.output_tokens);
    if let Some(tenant) = tenant {
        // A budget counts what the provider bills, cache reads included.
        push(&tenant.daily_tokens, usage.billed());
        if let Some(key) = &tenant.key {
            push(&key.daily_tokens, usage.billed());
        }
    }
    // Budgets in money: the billed cost at the deployment's price.
    out.extend(budget_actuals(model, tenant, reserved, usage));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DeploymentLimits, ModelConfig, TenantConfig};
    use crate::limits::key_sets::KeyLimitKeys;
    use ratelimiter::profile::Published;

    fn model() -> ModelConfig {
        ModelConfig {
            name: "claude".into(),
            upstream: "anthropic".into(),
            limits: DeploymentLimits {
                published: Published {
                    rpm: Some(50),
                    input_tpm: Some(30_000),
                    output_tpm: Some(8_000),
                    concurrency: Some(5),
                    ..Published::default()
                },
                ..DeploymentLimits::default()
            },
            max_output_tokens_default: Some(100),
            max_wait_ms: 0,
            encoding: None,
            image_tokens: None,
            file_tokens: None,
            stored_context_tokens: None,
            routing: Default::default(),
            deployments: Vec::new(),
            breaker: None,
            price: None,
            budgets: Vec::new(),
        }
    }

    #[test]
    fn requirements_and_actuals_split_input_and_output() {
        let keys = ModelKeys::new("anthropic", &model());
        let tenant = TenantKeys::new(&TenantConfig {
            name: "acme".into(),
            api_key_env: "K".into(),
            daily_tokens: Some(1000),
            rpm: None,
            concurrency: Some(2),
            connections_max: None,
            queued_max: None,
            class: None,
            budgets: Vec::new(),
        });
        let reqs = requirements(&keys, Some(&tenant), 120, 0);
        let got: Vec<(&str, u64)> = reqs.iter().map(|r| (r.key.as_str(), r.amount)).collect();
        assert_eq!(
            got,
            vec![
                ("global:llm:anthropic:claude:rpm", 1),
                ("global:llm:anthropic:claude:input_tpm", 120),
                ("global:llm:anthropic:claude:output_tpm", 1),
                ("global:llm:anthropic:claude:concurrency", 1),
                ("tenant:acme:llm:daily_tokens", 120),
                ("tenant:acme:llm:concurrency", 1),
            ]
        );
        let usage = Usage {
            input_tokens: 30,
            output_tokens: 7,
            cache_read_tokens: 100,
            ..Usage::default()
        };
        let got: Vec<(String, u64)> = actuals(&keys, Some(&tenant), (120, 0), &usage)
            .into_iter()
            .map(|a| (a.key.to_string(), a.actual_amount))
            .collect();
        assert_eq!(
            got,
            vec![
                ("global:llm:anthropic:claude:input_tpm".to_owned(), 30),
                ("global:llm:anthropic:claude:output_tpm".to_owned(), 7),
                ("tenant:acme:llm:daily_tokens".to_owned(), 137),
            ]
        );
    }

    #[test]
    fn budgets_owe_and_token_limits_record_debt() {
        let overage = |key: &str, definition: fn(LimitKey) -> LimitDefinition| {
            with_debt(definition(LimitKey::new(key).unwrap())).overage()
        };
        let rolling = |key| LimitDefinition::rolling(key, 100, 60).unwrap();
        assert_eq!(overage("tenant:acme:llm:daily_tokens", rolling), Overage::Owe);
        assert_eq!(
            overage("key:01KB2M9Y3R4VQ8H6ZJ1N5T7C0D:llm:daily_tokens", rolling),
            Overage::Owe
        );
        assert_eq!(overage("tenant:acme:usd:day", rolling), Overage::Owe);
        assert_eq!(overage("gateway:usd:window3600", rolling), Overage::Owe);
        assert_eq!(overage("global:llm:openai:gpt-4o:tpm", rolling), Overage::Debt);
        assert_eq!(overage("tenant:acme:llm:rpm", rolling), Overage::None);
        let concurrency = |key| LimitDefinition::concurrency(key, 4, 60).unwrap();
        assert_eq!(overage("tenant:acme:llm:concurrency", concurrency), Overage::None);
    }

    #[test]
    fn a_directory_keys_own_limits_join_its_tenants_in_one_reservation() {
        let keys = ModelKeys::new("anthropic", &model());
        let own = KeyLimitKeys {
            rpm: Some(LimitKey::new("key:01KB2M9Y3R4VQ8H6ZJ1N5T7C0D:llm:rpm").unwrap()),
            daily_tokens: Some(LimitKey::new("key:01KB2M9Y3R4VQ8H6ZJ1N5T7C0D:llm:daily_tokens").unwrap()),
            concurrency: None,
            usd: Vec::new(),
        };
        let tenant = TenantKeys::of("team", (Some(600), None, None)).with_key(own);
        let got: Vec<(String, u64)> = requirements(&keys, Some(&tenant), 120, 0)
            .iter()
            .skip(4)
            .map(|r| (r.key.to_string(), r.amount))
            .collect();
        let expected = [
            ("tenant:team:llm:rpm", 1),
            ("key:01KB2M9Y3R4VQ8H6ZJ1N5T7C0D:llm:daily_tokens", 120),
            ("key:01KB2M9Y3R4VQ8H6ZJ1N5T7C0D:llm:rpm", 1),
        ];
        assert_eq!(got, expected.map(|(k, a)| (k.to_owned(), a)));
        let usage = Usage {
            input_tokens: 30,
            output_tokens: 7,
            cache_read_tokens: 100,
            ..Usage::default()
        };
        let last = actuals(&keys, Some(&tenant), (120, 0), &usage).pop().unwrap();
        assert_eq!(
            (last.key.as_str(), last.actual_amount),
            ("key:01KB2M9Y3R4VQ8H6ZJ1N5T7C0D:llm:daily_tokens", 137),
            "the key's budget is charged what is billed"
        );
        let budgets: Vec<&str> = tenant.budgets().map(LimitKey::as_str).collect();
        assert_eq!(budgets, ["key:01KB2M9Y3R4VQ8H6ZJ1N5T7C0D:llm:daily_tokens"]);
    }

    #[test]
    fn a_profiled_model_reserves_and_reconciles_by_its_providers_rules() {
        // Anthropic's profile: rpm, itpm and otpm, keyed by the upstream's name.
        let base = model();
        let anthropic = ModelConfig {
            limits: DeploymentLimits {
                profile: Some("anthropic".into()),
                ..base.limits.clone()
            },
            upstream: "claude-eu".into(),
            ..base
        };
        let keys = ModelKeys::new("claude-eu", &anthropic);
        let got: Vec<(String, u64)> = requirements(&keys, None, 120, 64)
            .iter()
            .map(|r| (r.key.to_string(), r.amount))
            .collect();
        let expected = [
            ("global:llm:claude-eu:claude:rpm", 1),
            ("global:llm:claude-eu:claude:itpm", 120),
            ("global:llm:claude-eu:claude:otpm", 64),
            ("global:llm:claude-eu:claude:concurrency", 1),
        ];
        assert_eq!(got, expected.map(|(k, a)| (k.to_owned(), a)));
        let usage = Usage {
            input_tokens: 100,
            output_tokens: 7,
            cache_read_tokens: 0,
            ..Usage::default()
        };
        let amounts: Vec<u64> = actuals(&keys, None, (120, 64), &usage)
            .iter()
            .map(|a| a.actual_amount)
            .collect();
        assert_eq!(amounts, [100, 7], "input and output reconciled apart");
        let config = GatewayConfig {
            listen_addr: "127.0.0.1:0".into(),
            body_bytes_max: 1,
            upstream_timeout_ms: 600_000,
            upstreams: Vec::new(),
            models: vec![anthropic],
            tenants: Vec::new(),
            ..crate::config::tests::anonymous()
        };
        let mut defined = definitions(&config);
        let held = defined.pop().unwrap();
        // Anthropic's token buckets are buckets on the gateway's backend too, token ones with debt.
        let kinds: Vec<(LimitKind, Overage)> = defined.iter().map(|d| (d.kind(), d.overage())).collect();
        assert_eq!(
            kinds,
            [
                (LimitKind::Bucket, Overage::None),
                (LimitKind::Bucket, Overage::Debt),
                (LimitKind::Bucket, Overage::Debt)
            ]
        );
        assert_eq!(held.key().as_str(), "global:llm:claude-eu:claude:concurrency");
        assert_eq!(held.timeout_seconds(), 660, "a hold outlives the upstream timeout");
        // OpenAI's profile: a one-second request share; the reservation is kept whole.
        let openai = ModelConfig {
            limits: DeploymentLimits {
                profile: Some("openai".into()),
                published: Published {
                    rpm: Some(600),
                    tpm: Some(1_000_000),
                    ..Published::default()
                },
                ..DeploymentLimits::default()
            },
            upstream: "oai".into(),
            ..model()
        };
        let keys = ModelKeys::new("oai", &openai);
        let reqs = requirements(&keys, None, 120, 64);
        let got: Vec<(&str, u64)> = reqs.iter().map(|r| (r.key.as_str(), r.amount)).collect();
        assert_eq!(
            got,
            [("global:llm:oai:claude:rpm", 1), ("global:llm:oai:claude:tpm", 184)]
        );
        let kept = actuals(&keys, None, (120, 64), &usage);
        assert_eq!(kept[0].actual_amount, 184, "OpenAI keeps its admission count");
        let config = GatewayConfig {
            listen_addr: "127.0.0.1:0".into(),
            body_bytes_max: 1,
            upstream_timeout_ms: 600_000,
            upstreams: Vec::new(),
            models: vec![openai],
            tenants: Vec::new(),
            ..crate::config::tests::anonymous()
        };
        let shapes: Vec<(String, u64, u64)> = definitions(&config)
            .iter()
            .map(|d| (d.key().to_string(), d.capacity(), d.window_seconds()))
            .collect();
        assert_eq!(shapes[0], ("global:llm:oai:claude:rpm".to_owned(), 10, 1));
    }
}
