//! The `upstreams:` entries (docs/gateway.md, "Upstreams"): each provider's
//! kind, where it is reached, and the wire format each of its models speaks.

use serde::Deserialize;

/// The kind of an upstream: its provider, which decides its authentication, its
/// paths and (with the model, [`UpstreamConfig::format_of`]) its wire format.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum UpstreamKind {
    /// api.openai.com.
    Openai,
    /// api.anthropic.com.
    Anthropic,
    /// Any server of the OpenAI wire format (vLLM, Ollama, ...).
    OpenaiCompatible,
    /// Azure OpenAI's per-deployment paths
    /// (`/openai/deployments/{deployment}/chat/completions?api-version=...`)
    /// with the `api-key` header: OpenAI's wire format, the deployment's name in
    /// the path (docs/gateway.md, "Azure OpenAI").
    Azure,
    /// Amazon Bedrock's runtime, every request signed with AWS Signature
    /// Version 4 (docs/gateway.md, "Amazon Bedrock"): Claude in Anthropic's
    /// Messages format, other models through Bedrock's OpenAI-compatible chat
    /// completions.
    Bedrock,
    /// Google Vertex AI, with an OAuth token of a service account: Claude in
    /// Anthropic's Messages format, other models (Gemini) through Vertex's
    /// OpenAI-compatible endpoint.
    Vertex,
}

impl UpstreamKind {
    /// True for the wire formats of OpenAI's API (a kind as
    /// [`UpstreamConfig::format_of`] returns it: `bedrock` and `vertex` are not
    /// wire formats, their models speak one of the others).
    pub fn is_openai(self) -> bool {
        matches!(
            self,
            UpstreamKind::Openai | UpstreamKind::OpenaiCompatible | UpstreamKind::Azure
        )
    }

    /// The kind as the configuration spells it.
    pub fn name(self) -> &'static str {
        match self {
            UpstreamKind::Openai => "openai",
            UpstreamKind::Anthropic => "anthropic",
            UpstreamKind::OpenaiCompatible => "openai-compatible",
            UpstreamKind::Azure => "azure",
            UpstreamKind::Bedrock => "bedrock",
            UpstreamKind::Vertex => "vertex",
        }
    }

    /// Whether the kind needs a `region` (and may leave `base_url` out: it
    /// follows from the region).
    pub fn is_regional(self) -> bool {
        matches!(self, UpstreamKind::Bedrock | UpstreamKind::Vertex)
    }
}

/// One `upstreams:` entry.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(from = "UpstreamEntry")]
pub struct UpstreamConfig {
    /// The provider part of the limit keys (`global:llm:<name>:<model>:rpm`).
    pub name: String,
    /// The provider.
    pub kind: UpstreamKind,
    /// Everything before the API's paths, e.g. `http://127.0.0.1:9000`; for
    /// `bedrock` and `vertex`, the region's endpoint when the file gives none
    /// ([`default_base_url`]), filled in at load so every use reads a full URL.
    pub base_url: String,
    /// The environment variable holding the upstream's key; never the key itself,
    /// so configuration files can be shared. `None`: no key is sent (local
    /// servers), or the kind's own credentials (`bedrock`: AWS's; `vertex`: a
    /// service account's).
    pub api_key_env: Option<String>,
    /// Client request headers passed to this upstream besides `anthropic-version`
    /// (such as `anthropic-beta`, `openai-organization`, `openai-project`): none
    /// unless listed, so a client cannot pick the organization, project or beta
    /// features the gateway's key is used with.
    pub forward_headers: Vec<String>,
    /// The `api-version` query parameter of every call (`kind: azure` only,
    /// where it is required: Azure answers 404 without it), e.g. `2024-10-21`
    /// (<https://learn.microsoft.com/en-us/azure/ai-foundry/openai/api-version-lifecycle>).
    pub api_version: Option<String>,
    /// The cloud region served from (`bedrock` and `vertex`, where it is
    /// required): it names the endpoint, is signed into every Bedrock request,
    /// and names the location in Vertex's paths.
    pub region: Option<String>,
    /// The Google Cloud project billed (`vertex` only, required).
    pub project: Option<String>,
    /// The service account key file (`vertex` only); default the file named by
    /// `GOOGLE_APPLICATION_CREDENTIALS`.
    pub credentials_file: Option<String>,
}

/// An `upstreams:` entry as written: [`UpstreamConfig`] before its defaults
/// that depend on other fields (`base_url` from `region`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UpstreamEntry {
    name: String,
    kind: UpstreamKind,
    #[serde(default)]
    base_url: Option<String>,
    #[serde(default)]
    api_key_env: Option<String>,
    #[serde(default)]
    forward_headers: Vec<String>,
    #[serde(default)]
    api_version: Option<String>,
    #[serde(default)]
    region: Option<String>,
    #[serde(default)]
    project: Option<String>,
    #[serde(default)]
    credentials_file: Option<String>,
}

impl From<UpstreamEntry> for UpstreamConfig {
    fn from(entry: UpstreamEntry) -> Self {
        // Left empty when it has no default: validation then names the field.
        let base_url = (entry.base_url)
            .or_else(|| default_base_url(entry.kind, entry.region.as_deref()?))
            .unwrap_or_default();
        Self {
            name: entry.name,
            kind: entry.kind,
            base_url,
            api_key_env: entry.api_key_env,
            forward_headers: entry.forward_headers,
            api_version: entry.api_version,
            region: entry.region,
            project: entry.project,
            credentials_file: entry.credentials_file,
        }
    }
}

/// The endpoint of a regional kind in `region`: Bedrock's runtime
/// (<https://docs.aws.amazon.com/general/latest/gr/bedrock.html>), Vertex AI's
/// regional service endpoint, or its global one for region `global`
/// (<https://cloud.google.com/vertex-ai/generative-ai/docs/learn/locations#global-endpoint>).
/// `None` for the other kinds, which have no default.
pub fn default_base_url(kind: UpstreamKind, region: &str) -> Option<String> {
    match kind {
        UpstreamKind::Bedrock => Some(format!("https://bedrock-runtime.{region}.amazonaws.com")),
        UpstreamKind::Vertex if region == "global" => Some("https://aiplatform.googleapis.com".to_owned()),
        UpstreamKind::Vertex => Some(format!("https://{region}-aiplatform.googleapis.com")),
        _ => None,
    }
}

/// What marks a Bedrock model id as Claude: Anthropic's models are
/// `anthropic.<model>`, alone or behind a cross-region inference profile's
/// geography (`us.anthropic.claude-sonnet-4-5-20250929-v1:0`)
/// (<https://docs.aws.amazon.com/bedrock/latest/userguide/models-supported.html>).
const BEDROCK_ANTHROPIC_MARK: &str = "anthropic.";

impl UpstreamConfig {
    /// The wire format `model` (the name sent upstream) speaks on this upstream,
    /// as the kind that speaks it natively: `Anthropic` for Anthropic's Messages
    /// format, `OpenaiCompatible` for OpenAI's chat format, else the upstream's
    /// own kind. The one place where a `bedrock` or `vertex` deployment's format
    /// is decided: Claude on Bedrock (a model id holding `anthropic.`,
    /// <https://docs.aws.amazon.com/bedrock/latest/userguide/model-parameters-anthropic-claude-messages.html>)
    /// and on Vertex (a publisher-less id such as `claude-sonnet-4-5@20250929`,
    /// <https://cloud.google.com/vertex-ai/generative-ai/docs/partner-models/claude>)
    /// speak Messages; other Bedrock models speak Bedrock's OpenAI-compatible
    /// chat completions
    /// (<https://docs.aws.amazon.com/bedrock/latest/userguide/inference-chat-completions.html>)
    /// and Vertex models named `publisher/model` (`google/gemini-2.5-flash`)
    /// Vertex's OpenAI-compatible endpoint
    /// (<https://cloud.google.com/vertex-ai/generative-ai/docs/start/openai>).
    pub fn format_of(&self, model: &str) -> UpstreamKind {
        let claude = match self.kind {
            UpstreamKind::Bedrock => model.contains(BEDROCK_ANTHROPIC_MARK),
            UpstreamKind::Vertex => !model.contains('/'),
            kind => return kind,
        };
        if claude {
            UpstreamKind::Anthropic
        } else {
            UpstreamKind::OpenaiCompatible
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(yaml: &str) -> UpstreamConfig {
        serde_yaml::from_str(yaml).unwrap()
    }

    #[test]
    fn a_regional_upstream_without_base_url_reads_its_regions_endpoint() {
        let bedrock = upstream("{name: b, kind: bedrock, region: us-east-1}");
        assert_eq!(bedrock.base_url, "https://bedrock-runtime.us-east-1.amazonaws.com");
        let vertex = upstream("{name: v, kind: vertex, region: us-east5, project: p}");
        assert_eq!(vertex.base_url, "https://us-east5-aiplatform.googleapis.com");
        let global = upstream("{name: v, kind: vertex, region: global, project: p}");
        assert_eq!(global.base_url, "https://aiplatform.googleapis.com");
        let given = upstream("{name: b, kind: bedrock, region: us-east-1, base_url: \"http://127.0.0.1:9\"}");
        assert_eq!(given.base_url, "http://127.0.0.1:9");
        assert_eq!(
            upstream("{name: o, kind: openai}").base_url,
            "",
            "no default: validation names it"
        );
        let unknown = serde_yaml::from_str::<UpstreamConfig>("{name: b, kind: bedrock, regoin: x}").unwrap_err();
        assert!(unknown.to_string().contains("regoin"), "{unknown}");
    }

    #[test]
    fn the_wire_format_follows_the_kind_and_the_model() {
        let bedrock = upstream("{name: b, kind: bedrock, region: us-east-1}");
        let claude = "us.anthropic.claude-sonnet-4-5-20250929-v1:0";
        assert_eq!(bedrock.format_of(claude), UpstreamKind::Anthropic);
        assert_eq!(
            bedrock.format_of("anthropic.claude-3-haiku-20240307-v1:0"),
            UpstreamKind::Anthropic
        );
        assert_eq!(
            bedrock.format_of("openai.gpt-oss-120b-1:0"),
            UpstreamKind::OpenaiCompatible
        );
        let vertex = upstream("{name: v, kind: vertex, region: global, project: p}");
        assert_eq!(vertex.format_of("claude-sonnet-4-5@20250929"), UpstreamKind::Anthropic);
        assert_eq!(
            vertex.format_of("google/gemini-2.5-flash"),
            UpstreamKind::OpenaiCompatible
        );
        let azure = upstream("{name: a, kind: azure, base_url: \"https://x\", api_version: v}");
        assert_eq!(
            azure.format_of("anthropic.claude"),
            UpstreamKind::Azure,
            "other kinds: their own"
        );
        assert!(!UpstreamKind::Bedrock.is_openai() && !UpstreamKind::Vertex.is_openai());
    }
}
