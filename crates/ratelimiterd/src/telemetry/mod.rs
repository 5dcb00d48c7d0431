//! OpenTelemetry export (docs/observability.md): the `telemetry:` section of the
//! configuration, read together with the standard `OTEL_*` environment
//! variables (the environment wins), and the exporter it starts ([`export`]).
//! Nothing configured: nothing is exported and nothing is logged.

pub mod api_trace;
pub mod counted;
pub mod dropped;
pub mod export;
pub mod on_runtime;
pub mod otlp_http;
pub mod span_proto;

use std::collections::BTreeMap;

use opentelemetry_sdk::trace::Sampler;
use serde::Deserialize;

/// The service name when neither `OTEL_SERVICE_NAME` nor `telemetry.service_name` sets one.
pub const SERVICE_NAME_DEFAULT: &str = "ratelimiterd";
/// OTLP over HTTP with protobuf bodies, the default.
pub const PROTOCOL_HTTP_PROTOBUF: &str = "http/protobuf";
/// OTLP over gRPC.
pub const PROTOCOL_GRPC: &str = "grpc";

/// How a signal is exported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// [`PROTOCOL_HTTP_PROTOBUF`]: the signal's path is appended to a base endpoint.
    HttpProtobuf,
    /// [`PROTOCOL_GRPC`]: a base endpoint is used as given (`http://HOST:4317`).
    Grpc,
}
/// The path of traces under a base endpoint (the OTLP/HTTP specification's).
pub const TRACES_PATH: &str = "/v1/traces";
/// The path of metrics under a base endpoint (the OTLP/HTTP specification's).
pub const METRICS_PATH: &str = "/v1/metrics";
/// The sampler when none is configured: a caller's decision is followed, a
/// call without a sampled parent is sampled.
pub const SAMPLER_DEFAULT: &str = "parentbased_always_on";

/// The `telemetry:` section; each entry is overridden by its `OTEL_*` variable.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// Base OTLP/HTTP endpoint; `/v1/traces` and `/v1/metrics` are appended
    /// (`OTEL_EXPORTER_OTLP_ENDPOINT`).
    pub endpoint: Option<String>,
    /// Endpoint of traces, used as given (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`).
    pub traces_endpoint: Option<String>,
    /// Endpoint of metrics, used as given (`OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`).
    pub metrics_endpoint: Option<String>,
    /// Headers sent with each export (`OTEL_EXPORTER_OTLP_HEADERS`, which wins per header).
    pub headers: BTreeMap<String, String>,
    /// `http/protobuf`, the default, or `grpc` (`OTEL_EXPORTER_OTLP_PROTOCOL`).
    pub protocol: Option<String>,
    /// The `service.name` resource attribute (`OTEL_SERVICE_NAME`).
    pub service_name: Option<String>,
    /// More resource attributes (`OTEL_RESOURCE_ATTRIBUTES`, which wins per attribute).
    pub resource_attributes: BTreeMap<String, String>,
    /// The sampler's name (`OTEL_TRACES_SAMPLER`).
    pub sampler: Option<String>,
    /// The ratio of a `traceidratio` sampler (`OTEL_TRACES_SAMPLER_ARG`).
    pub sampler_arg: Option<String>,
    /// No export at all (`OTEL_SDK_DISABLED`).
    pub disabled: bool,
    /// The caller's tenant as an attribute of the metrics (off by default: a
    /// series per tenant, bounded by `gateway::observe::genai_metrics::METRIC_TENANTS_MAX`).
    pub metrics_tenant: bool,
    /// Record the messages of each call on its spans
    /// (`OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`; off by default).
    pub capture_message_content: bool,
}

/// The variable the GenAI instrumentations read for their opt-in to message content.
pub const CAPTURE_CONTENT_VAR: &str = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT";

/// What the exporter is started with, once the section and the environment are read.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// Where spans are sent; `None`: no span is exported.
    pub traces_endpoint: Option<String>,
    /// Where metrics are sent; `None`: no metric is exported.
    pub metrics_endpoint: Option<String>,
    /// How spans are sent.
    pub traces_protocol: OtlpProtocol,
    /// How metrics are sent.
    pub metrics_protocol: OtlpProtocol,
    /// The section's headers (the exporter adds the environment's over them).
    pub headers: BTreeMap<String, String>,
    /// The service's name.
    pub service_name: String,
    /// The section's resource attributes (the environment's are added over them).
    pub resource_attributes: BTreeMap<String, String>,
    /// Which calls are sampled.
    pub sampler: Sampler,
    /// Whether the metrics carry the caller's tenant.
    pub metrics_tenant: bool,
    /// Whether the spans carry each call's messages.
    pub capture_message_content: bool,
}

impl TelemetryConfig {
    /// The export this section asks for, each entry overridden by the
    /// environment `env` reads: `Ok(None)` when nothing sets an endpoint or
    /// export is disabled; an error names the entry or variable at fault.
    pub fn resolve(&self, env: &dyn Fn(&str) -> Option<String>) -> Result<Option<Resolved>, String> {
        let env = |name: &str| env(name).filter(|value| !value.trim().is_empty());
        let disabled = match env("OTEL_SDK_DISABLED") {
            Some(value) => parse_bool(&value).map_err(|m| format!("OTEL_SDK_DISABLED: {m}"))?,
            None => self.disabled,
        };
        if disabled {
            return Ok(None);
        }
        let traces_protocol = self.protocol(&env, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")?;
        let metrics_protocol = self.protocol(&env, "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL")?;
        // Over gRPC a base endpoint is the server's, used as given.
        let endpoint = |signal_var: &str, signal: &Option<String>, (path, protocol): (&str, OtlpProtocol)| {
            let path = if protocol == OtlpProtocol::Grpc { "" } else { path };
            (env(signal_var))
                .or_else(|| env("OTEL_EXPORTER_OTLP_ENDPOINT").map(|base| with_path(&base, path)))
                .or_else(|| signal.clone())
                .or_else(|| self.endpoint.as_deref().map(|base| with_path(base, path)))
        };
        let traces_endpoint = endpoint(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            &self.traces_endpoint,
            (TRACES_PATH, traces_protocol),
        );
        let metrics_endpoint = endpoint(
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            &self.metrics_endpoint,
            (METRICS_PATH, metrics_protocol),
        );
        if traces_endpoint.is_none() && metrics_endpoint.is_none() {
            return Ok(None);
        }
        for url in traces_endpoint.iter().chain(&metrics_endpoint) {
            check_endpoint(url)?;
        }
        let capture_message_content = match env(CAPTURE_CONTENT_VAR) {
            Some(value) => parse_bool(&value).map_err(|m| format!("{CAPTURE_CONTENT_VAR}: {m}"))?,
            None => self.capture_message_content,
        };
        let sampler_name = (env("OTEL_TRACES_SAMPLER")).or_else(|| self.sampler.clone());
        let sampler_arg = (env("OTEL_TRACES_SAMPLER_ARG")).or_else(|| self.sampler_arg.clone());
        let sampler = sampler(
            sampler_name.as_deref().unwrap_or(SAMPLER_DEFAULT),
            sampler_arg.as_deref(),
        )?;
        Ok(Some(Resolved {
            traces_endpoint,
            metrics_endpoint,
            traces_protocol,
            metrics_protocol,
            headers: self.headers.clone(),
            service_name: (env("OTEL_SERVICE_NAME"))
                .or_else(|| self.service_name.clone())
                .unwrap_or_else(|| SERVICE_NAME_DEFAULT.to_owned()),
            resource_attributes: self.resource_attributes.clone(),
            sampler,
            metrics_tenant: self.metrics_tenant,
            capture_message_content,
        }))
    }
}

impl TelemetryConfig {
    /// The protocol of one signal: its variable `signal_var`, else
    /// `OTEL_EXPORTER_OTLP_PROTOCOL`, else the section's, else `http/protobuf`.
    fn protocol(&self, env: &dyn Fn(&str) -> Option<String>, signal_var: &str) -> Result<OtlpProtocol, String> {
        let protocol = (env(signal_var))
            .or_else(|| env("OTEL_EXPORTER_OTLP_PROTOCOL"))
            .or_else(|| self.protocol.clone())
            .unwrap_or_else(|| PROTOCOL_HTTP_PROTOBUF.to_owned());
        match protocol.trim() {
            PROTOCOL_HTTP_PROTOBUF => Ok(OtlpProtocol::HttpProtobuf),
            PROTOCOL_GRPC => Ok(OtlpProtocol::Grpc),
            other => Err(format!(
                "telemetry.protocol (OTEL_EXPORTER_OTLP_PROTOCOL, {signal_var}): `{other}` is not supported; \
                 this server exports OTLP over `{PROTOCOL_HTTP_PROTOBUF}` or `{PROTOCOL_GRPC}`"
            )),
        }
    }
}

/// `base` with `path` appended, one slash between them.
fn with_path(base: &str, path: &str) -> String {
    format!("{}{path}", base.trim_end_matches('/'))
}

/// An endpoint is an `http` or `https` URL.
fn check_endpoint(endpoint: &str) -> Result<(), String> {
    let scheme_ok = endpoint.starts_with("http://") || endpoint.starts_with("https://");
    if !scheme_ok || endpoint.parse::<axum::http::Uri>().is_err() {
        return Err(format!(
            "telemetry endpoint (OTEL_EXPORTER_OTLP_ENDPOINT): `{endpoint}` is not an http:// or https:// URL"
        ));
    }
    Ok(())
}

/// `true` or `false`, in any case.
fn parse_bool(value: &str) -> Result<bool, String> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(format!("`{value}` is neither true nor false")),
    }
}

/// The sampler named as `OTEL_TRACES_SAMPLER` names them, with `arg` the ratio
/// of the `traceidratio` ones (1.0 when absent).
fn sampler(name: &str, arg: Option<&str>) -> Result<Sampler, String> {
    let ratio = || -> Result<f64, String> {
        let Some(arg) = arg else {
            return Ok(1.0);
        };
        match arg.trim().parse::<f64>() {
            Ok(ratio) if (0.0..=1.0).contains(&ratio) => Ok(ratio),
            _ => Err(format!(
                "telemetry.sampler_arg (OTEL_TRACES_SAMPLER_ARG): `{arg}` is not a ratio in 0..=1"
            )),
        }
    };
    let parent_based = |root: Sampler| Sampler::ParentBased(Box::new(root));
    Ok(match name.trim() {
        "always_on" => Sampler::AlwaysOn,
        "always_off" => Sampler::AlwaysOff,
        "traceidratio" => Sampler::TraceIdRatioBased(ratio()?),
        "parentbased_always_on" => parent_based(Sampler::AlwaysOn),
        "parentbased_always_off" => parent_based(Sampler::AlwaysOff),
        "parentbased_traceidratio" => parent_based(Sampler::TraceIdRatioBased(ratio()?)),
        other => {
            return Err(format!(
                "telemetry.sampler (OTEL_TRACES_SAMPLER): `{other}` is not one of always_on, always_off, \
                 traceidratio, parentbased_always_on, parentbased_always_off, parentbased_traceidratio"
            ))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| (*v).to_owned())
    }

    #[test]
    fn nothing_configured_exports_nothing() {
        let resolved = TelemetryConfig::default().resolve(&env_of(&[])).unwrap();
        assert!(resolved.is_none());
    }

    #[test]
    fn the_environment_wins_over_the_section() {
        let section = TelemetryConfig {
            endpoint: Some("http://collector:4318/".to_owned()),
            service_name: Some("from-file".to_owned()),
            ..TelemetryConfig::default()
        };
        let from_file = section.resolve(&env_of(&[])).unwrap().unwrap();
        assert_eq!(
            from_file.traces_endpoint.as_deref(),
            Some("http://collector:4318/v1/traces")
        );
        assert_eq!(
            from_file.metrics_endpoint.as_deref(),
            Some("http://collector:4318/v1/metrics")
        );
        assert_eq!(from_file.service_name, "from-file");
        let env = env_of(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://other:4318"),
            ("OTEL_SERVICE_NAME", "from-env"),
        ]);
        let from_env = section.resolve(&env).unwrap().unwrap();
        assert_eq!(from_env.traces_endpoint.as_deref(), Some("http://other:4318/v1/traces"));
        assert_eq!(from_env.service_name, "from-env");
        let signal = env_of(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:1/custom")]);
        let traces_only = section.resolve(&signal).unwrap().unwrap();
        assert_eq!(traces_only.traces_endpoint.as_deref(), Some("http://t:1/custom"));
        assert_eq!(
            traces_only.metrics_endpoint.as_deref(),
            Some("http://collector:4318/v1/metrics")
        );
        const METRICS: &[(&str, &str)] = &[("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://m:1/x")];
        let metrics = TelemetryConfig::default().resolve(&env_of(METRICS)).unwrap().unwrap();
        assert_eq!(metrics.traces_endpoint, None);
        assert_eq!(metrics.metrics_endpoint.as_deref(), Some("http://m:1/x"));
        let off = env_of(&[("OTEL_SDK_DISABLED", "TRUE")]);
        assert!(section.resolve(&off).unwrap().is_none());
        let default = TelemetryConfig::default().resolve(&env_of(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")]));
        assert_eq!(default.unwrap().unwrap().service_name, SERVICE_NAME_DEFAULT);
    }

    #[test]
    fn bad_entries_are_named() {
        let section = TelemetryConfig {
            endpoint: Some("http://collector:4318".to_owned()),
            ..TelemetryConfig::default()
        };
        let error = |pairs: &'static [(&'static str, &'static str)]| section.resolve(&env_of(pairs)).unwrap_err();
        assert!(error(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")]).contains("OTEL_EXPORTER_OTLP_PROTOCOL"));
        let grpc = section
            .resolve(&env_of(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]))
            .unwrap()
            .unwrap();
        assert_eq!(grpc.traces_protocol, OtlpProtocol::Grpc);
        assert_eq!(
            grpc.traces_endpoint.as_deref(),
            Some("http://collector:4318"),
            "no path over gRPC"
        );
        const MIXED: &[(&str, &str)] = &[("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "grpc")];
        let mixed = section.resolve(&env_of(MIXED)).unwrap().unwrap();
        assert_eq!(
            (mixed.traces_protocol, mixed.metrics_protocol),
            (OtlpProtocol::HttpProtobuf, OtlpProtocol::Grpc)
        );
        assert!(error(&[("OTEL_TRACES_SAMPLER", "sometimes")]).contains("OTEL_TRACES_SAMPLER"));
        const RATIO: &[(&str, &str)] = &[
            ("OTEL_TRACES_SAMPLER", "traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "2"),
        ];
        assert!(error(RATIO).contains("OTEL_TRACES_SAMPLER_ARG"));
        assert!(error(&[("OTEL_SDK_DISABLED", "maybe")]).contains("OTEL_SDK_DISABLED"));
        assert!(error(&[(CAPTURE_CONTENT_VAR, "yes")]).contains(CAPTURE_CONTENT_VAR));
        assert!(!section.resolve(&env_of(&[])).unwrap().unwrap().capture_message_content);
        let on = section.resolve(&env_of(&[(CAPTURE_CONTENT_VAR, "true")]));
        assert!(on.unwrap().unwrap().capture_message_content);
        assert!(error(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")]).contains("not an http"));
    }
}
