//! The section's own rules, those a parse cannot check.

use std::collections::HashSet;

use ratelimiter::LimitKey;

use super::error::invalid;
use super::{
    check_forwardable, resolve, validate_classes, validate_formats, validate_shape, GatewayConfig, GatewayConfigError,
    ModelConfig, UnknownFields, UpstreamConfig, UpstreamKind, BODY_BYTES_MAX_LIMIT, CLIENT_TIMEOUT_MS_LIMIT,
    ENTRIES_MAX, FORWARD_HEADERS_MAX, MAX_WAIT_MS_LIMIT, TENANT_CAP_LIMIT, UPSTREAM_TIMEOUT_MS_LIMIT,
};

impl GatewayConfig {
    /// Checks every rule of the section's own shape that a parse cannot: ranges,
    /// references, unique names, valid key names. The rules on the limits the
    /// section implies follow in [`GatewayConfig::validate`] (`limits/validate.rs`).
    pub fn validate_schema(&self) -> Result<(), GatewayConfigError> {
        if self.body_bytes_max == 0 || self.body_bytes_max > BODY_BYTES_MAX_LIMIT {
            return Err(invalid("body_bytes_max", format!("must be 1..={BODY_BYTES_MAX_LIMIT}")));
        }
        if self.upstream_timeout_ms == 0 || self.upstream_timeout_ms > UPSTREAM_TIMEOUT_MS_LIMIT {
            return Err(invalid(
                "upstream_timeout_ms",
                format!("must be 1..={UPSTREAM_TIMEOUT_MS_LIMIT}"),
            ));
        }
        for (what, len) in [
            ("upstreams", self.upstreams.len()),
            ("models", self.models.len()),
            ("tenants", self.tenants.len()),
        ] {
            if len > ENTRIES_MAX {
                return Err(invalid(what, format!("at most {ENTRIES_MAX} entries")));
            }
        }
        self.validate_clients()?;
        self.validate_upstreams()?;
        self.validate_models()?;
        self.validate_tenants()?;
        self.validate_money()?;
        (self.alerts.webhook()).map_err(|(field, message)| invalid(format!("alerts.{field}"), message))?;
        self.validate_classes()
    }

    fn validate_classes(&self) -> Result<(), GatewayConfigError> {
        let tenant_classes: Vec<Option<&str>> = self.tenants.iter().map(|t| t.class.as_deref()).collect();
        validate_classes(&self.classes, &tenant_classes).map_err(|(entry, message)| invalid(entry, message))
    }

    /// The client timeouts and caps, and that tenants and `allow_anonymous` are
    /// not both given. No tenant without `allow_anonymous` is valid: the
    /// gateway then serves only keys made through the admin API.
    fn validate_clients(&self) -> Result<(), GatewayConfigError> {
        if !self.tenants.is_empty() && self.allow_anonymous {
            return Err(invalid(
                "allow_anonymous",
                "is true but tenants are given: their keys would not be asked; remove one of the two",
            ));
        }
        ratelimiter::origin::check_allowed_hosts(&self.allowed_hosts).map_err(|m| invalid("allowed_hosts", m))?;
        for (field, value) in [
            ("client_header_timeout_ms", self.client_header_timeout_ms),
            ("client_body_timeout_ms", self.client_body_timeout_ms),
            ("client_write_timeout_ms", self.client_write_timeout_ms),
        ] {
            if value == 0 || value > CLIENT_TIMEOUT_MS_LIMIT {
                return Err(invalid(field, format!("must be 1..={CLIENT_TIMEOUT_MS_LIMIT}")));
            }
        }
        let mut caps = vec![
            ("tenant_connections_max".to_owned(), Some(self.tenant_connections_max)),
            ("tenant_queued_max".to_owned(), Some(self.tenant_queued_max)),
        ];
        for (i, tenant) in self.tenants.iter().enumerate() {
            caps.push((format!("tenants[{i}].connections_max"), tenant.connections_max));
            caps.push((format!("tenants[{i}].queued_max"), tenant.queued_max));
        }
        for (field, value) in caps {
            if value.is_some_and(|v| v == 0 || v > TENANT_CAP_LIMIT) {
                return Err(invalid(field, format!("must be 1..={TENANT_CAP_LIMIT}")));
            }
        }
        Ok(())
    }

    fn validate_upstreams(&self) -> Result<(), GatewayConfigError> {
        let mut names = HashSet::new();
        for (i, upstream) in self.upstreams.iter().enumerate() {
            check_name(&format!("upstreams[{i}].name"), &upstream.name)?;
            if !names.insert(upstream.name.as_str()) {
                return Err(invalid(format!("upstreams[{i}].name"), "appears twice"));
            }
            check_regional(upstream).map_err(|(field, m)| invalid(format!("upstreams[{i}].{field}"), m))?;
            let rest = upstream
                .base_url
                .strip_prefix("https://")
                .or_else(|| upstream.base_url.strip_prefix("http://"));
            if rest.is_none_or(|host| host.is_empty()) || upstream.base_url.parse::<axum::http::Uri>().is_err() {
                return Err(invalid(
                    format!("upstreams[{i}].base_url"),
                    "must be an http:// or https:// URL",
                ));
            }
            check_api_version(upstream).map_err(|m| invalid(format!("upstreams[{i}].api_version"), m))?;
            if upstream.forward_headers.len() > FORWARD_HEADERS_MAX {
                return Err(invalid(
                    format!("upstreams[{i}].forward_headers"),
                    format!("at most {FORWARD_HEADERS_MAX} entries"),
                ));
            }
            for (j, name) in upstream.forward_headers.iter().enumerate() {
                check_forwardable(name).map_err(|m| invalid(format!("upstreams[{i}].forward_headers[{j}]"), m))?;
            }
        }
        Ok(())
    }

    fn validate_models(&self) -> Result<(), GatewayConfigError> {
        let mut names = HashSet::new();
        let mut deployment_keys = HashSet::new();
        for (i, model) in self.models.iter().enumerate() {
            let entry = |field: &str| format!("models[{i}].{field}");
            check_name(&entry("name"), &model.name)?;
            if !names.insert(model.name.as_str()) {
                return Err(invalid(entry("name"), "appears twice"));
            }
            check_known(&model.limits.unknown, &entry)?;
            for (j, deployment) in model.deployments.iter().enumerate() {
                check_known(&deployment.limits.unknown, &|f: &str| {
                    entry(&format!("deployments[{j}].{f}"))
                })?;
            }
            for (field, value) in [
                ("image_tokens", model.image_tokens),
                ("file_tokens", model.file_tokens),
                ("stored_context_tokens", model.stored_context_tokens),
                ("max_output_tokens_default", model.max_output_tokens_default),
            ] {
                if value == Some(0) {
                    return Err(invalid(entry(field), "must be at least 1 (leave it out for no limit)"));
                }
            }
            if model.max_wait_ms > MAX_WAIT_MS_LIMIT {
                return Err(invalid(
                    entry("max_wait_ms"),
                    format!("must be 0..={MAX_WAIT_MS_LIMIT}"),
                ));
            }
            validate_shape(model, &entry)?;
            for (j, deployment) in resolve(model).iter().enumerate() {
                let prefix = if model.deployments.is_empty() {
                    format!("models[{i}]")
                } else {
                    format!("models[{i}].deployments[{j}]")
                };
                let entry = |field: &str| format!("{prefix}.{field}");
                if !deployment_keys.insert((deployment.model.upstream.clone(), deployment.model.name.clone())) {
                    return Err(invalid(
                        entry("model"),
                        format!(
                            "model {:?}: the deployment {}/{} is already served by another entry (its limit keys would be shared)",
                            model.name, deployment.model.upstream, deployment.model.name
                        ),
                    ));
                }
                self.validate_deployment(&deployment.model, &entry).map_err(|e| {
                    if model.deployments.is_empty() {
                        e
                    } else {
                        invalid(e.entry, format!("model {:?}: {}", model.name, e.message))
                    }
                })?;
            }
            validate_formats(model, &self.upstreams, &entry)?;
        }
        Ok(())
    }

    /// The rules of one deployment, in its single-deployment form (a model without
    /// `deployments` is its own one deployment).
    fn validate_deployment(
        &self,
        model: &ModelConfig,
        entry: &dyn Fn(&str) -> String,
    ) -> Result<(), GatewayConfigError> {
        let Some(upstream) = self.upstreams.iter().find(|u| u.name == model.upstream) else {
            return Err(invalid(
                entry("upstream"),
                format!("no upstream named {:?}", model.upstream),
            ));
        };
        for (field, value) in [
            ("rpm", model.limits.published.rpm),
            ("tpm", model.limits.published.tpm),
            ("input_tpm", model.limits.published.input_tpm),
            ("output_tpm", model.limits.published.output_tpm),
            ("concurrency", model.limits.published.concurrency),
        ] {
            if value == Some(0) {
                return Err(invalid(entry(field), "must be at least 1 (leave it out for no limit)"));
            }
        }
        if model.limits.published.tpm.is_some()
            && (model.limits.published.input_tpm.is_some() || model.limits.published.output_tpm.is_some())
        {
            return Err(invalid(entry("tpm"), "give tpm, or input_tpm and output_tpm, not both"));
        }
        if upstream.format_of(&model.name).is_openai()
            && (model.limits.published.input_tpm.is_some() || model.limits.published.output_tpm.is_some())
        {
            return Err(invalid(entry("input_tpm"), "OpenAI models have one tpm"));
        }
        check_model_id(upstream, &model.name).map_err(|m| invalid(entry("model"), m))?;
        LimitKey::llm_rpm(&upstream.name, &model.key_name()).map_err(|e| invalid(entry("name"), e.to_string()))?;
        Self::validate_profile(model, &upstream.name, entry)?;
        Ok(())
    }

    /// A profile must name a known provider and have the numbers it needs; the
    /// profile's own fields are errors without one.
    fn validate_profile(
        model: &ModelConfig,
        upstream: &str,
        entry: &dyn Fn(&str) -> String,
    ) -> Result<(), GatewayConfigError> {
        match model.llm_profile(upstream) {
            Some(Err(e)) => Err(invalid(entry("profile"), e.to_string())),
            Some(Ok(_)) => Ok(()),
            None => {
                for (field, value) in [
                    ("rpd", model.limits.published.rpd),
                    ("largest_request_tokens", model.limits.published.largest_request_tokens),
                    ("quantum_seconds", model.limits.published.quantum_seconds),
                ] {
                    if value.is_some() {
                        return Err(invalid(entry(field), "is a profile's number: give a profile too"));
                    }
                }
                Ok(())
            }
        }
    }

    fn validate_tenants(&self) -> Result<(), GatewayConfigError> {
        let mut names = HashSet::new();
        for (i, tenant) in self.tenants.iter().enumerate() {
            let entry = |field: &str| format!("tenants[{i}].{field}");
            check_name(&entry("name"), &tenant.name)?;
            if !names.insert(tenant.name.as_str()) {
                return Err(invalid(entry("name"), "appears twice"));
            }
            for (field, value) in [
                ("daily_tokens", tenant.daily_tokens),
                ("rpm", tenant.rpm),
                ("concurrency", tenant.concurrency),
            ] {
                if value == Some(0) {
                    return Err(invalid(entry(field), "must be at least 1 (leave it out for no limit)"));
                }
            }
            LimitKey::tenant_daily_tokens(&tenant.name).map_err(|e| invalid(entry("name"), e.to_string()))?;
        }
        Ok(())
    }
}

/// An entry with a key no field took is refused, its key named: the same rule
/// as `deny_unknown_fields` elsewhere, for the entries that flatten their limits.
fn check_known(unknown: &UnknownFields, entry: &dyn Fn(&str) -> String) -> Result<(), GatewayConfigError> {
    match unknown.first() {
        Some(field) => Err(invalid(entry(field), "unknown field")),
        None => Ok(()),
    }
}

/// A deployment's model id (the name sent upstream) names its limit keys
/// ([`super::key_model_name`]): a valid key component, where only a Bedrock
/// id may hold `:` (`...-v1:0`, written `@` in the keys) and so must hold no
/// `@`, or two ids would share their keys.
fn check_model_id(upstream: &UpstreamConfig, name: &str) -> Result<(), String> {
    if upstream.kind == UpstreamKind::Bedrock && name.contains('@') {
        return Err(format!(
            "{name:?}: a Bedrock model id holds no '@' (its ':' are written '@' in the limit keys)"
        ));
    }
    if name.is_empty() || (name.contains(':') && upstream.kind != UpstreamKind::Bedrock) {
        return Err("must be non-empty and must not contain ':'".to_owned());
    }
    LimitKey::new(name).map(|_| ()).map_err(|e| e.to_string())
}

fn check_name(entry: &str, name: &str) -> Result<(), GatewayConfigError> {
    if name.is_empty() || name.contains(':') {
        return Err(invalid(entry, "must be non-empty and must not contain ':'"));
    }
    LimitKey::new(name)
        .map(|_| ())
        .map_err(|e| invalid(entry, e.to_string()))
}

/// The longest `api-version` accepted: Azure's are dates with an optional
/// `-preview` (`2025-04-01-preview`, 18 bytes).
const API_VERSION_BYTES_MAX: usize = 32;

/// An Azure upstream names its `api-version` (dates and `-preview`: digits,
/// letters, `-` and `.`, so it needs no escaping in a query); no other kind has one.
fn check_api_version(upstream: &UpstreamConfig) -> Result<(), String> {
    match (upstream.kind, upstream.api_version.as_deref()) {
        (UpstreamKind::Azure, None) => Err("required for kind azure (e.g. \"2024-10-21\")".to_owned()),
        (UpstreamKind::Azure, Some(version)) => {
            let safe = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '.';
            if version.is_empty() || version.len() > API_VERSION_BYTES_MAX || !version.chars().all(safe) {
                return Err(format!(
                    "{version:?} is not an api-version: at most {API_VERSION_BYTES_MAX} letters, digits, '-' and '.'"
                ));
            }
            Ok(())
        }
        (_, Some(_)) => Err("only an upstream of kind azure takes an api_version".to_owned()),
        (_, None) => Ok(()),
    }
}

/// The longest `region` accepted: AWS's and Google Cloud's are a few words
/// joined by `-` (`ap-southeast-2`, `europe-west4`, 14 bytes).
const REGION_BYTES_MAX: usize = 32;
/// The longest `project` accepted: a Google Cloud project id is at most 30
/// bytes, a domain-scoped one (`example.com:my-project`) more
/// (<https://cloud.google.com/resource-manager/docs/creating-managing-projects>).
const PROJECT_BYTES_MAX: usize = 100;

/// A `bedrock` or `vertex` upstream names its `region` (and a `vertex` one its
/// `project`), each safe in a host name and a path; `credentials_file` is
/// Vertex's only. Fails with the field at fault and why.
fn check_regional(upstream: &UpstreamConfig) -> Result<(), (&'static str, String)> {
    let kind = upstream.kind;
    let region_safe = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
    match (kind.is_regional(), upstream.region.as_deref()) {
        (true, None) => {
            return Err((
                "region",
                format!("required for kind {} (e.g. {})", kind.name(), region_example(kind)),
            ))
        }
        (true, Some(region))
            if region.is_empty() || region.len() > REGION_BYTES_MAX || !region.chars().all(region_safe) =>
        {
            return Err((
                "region",
                format!("{region:?} is not a region: at most {REGION_BYTES_MAX} lowercase letters, digits and '-'"),
            ));
        }
        (false, Some(_)) => {
            return Err((
                "region",
                "only an upstream of kind bedrock or vertex takes a region".to_owned(),
            ))
        }
        _ => {}
    }
    let project_safe = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '.' | ':');
    match (kind == UpstreamKind::Vertex, upstream.project.as_deref()) {
        (true, None) => {
            return Err((
                "project",
                "required for kind vertex (the Google Cloud project id)".to_owned(),
            ))
        }
        (true, Some(project))
            if project.is_empty() || project.len() > PROJECT_BYTES_MAX || !project.chars().all(project_safe) =>
        {
            return Err(("project", format!("{project:?} is not a project id: at most {PROJECT_BYTES_MAX} lowercase letters, digits, '-', '.' and ':'")));
        }
        (false, Some(_)) => return Err(("project", "only an upstream of kind vertex takes a project".to_owned())),
        _ => {}
    }
    match (kind == UpstreamKind::Vertex, upstream.credentials_file.as_deref()) {
        (true, Some("")) => Err((
            "credentials_file",
            "must not be empty (leave it out for GOOGLE_APPLICATION_CREDENTIALS)".to_owned(),
        )),
        (false, Some(_)) => Err((
            "credentials_file",
            "only an upstream of kind vertex takes a credentials_file".to_owned(),
        )),
        _ => Ok(()),
    }
}

fn region_example(kind: UpstreamKind) -> &'static str {
    if kind == UpstreamKind::Vertex {
        "us-east5, or global"
    } else {
        "us-east-1"
    }
}
