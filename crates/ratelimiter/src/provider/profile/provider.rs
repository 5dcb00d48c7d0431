//! The providers with a profile, by the names configuration gives them.

use std::str::FromStr;

use super::error::ProfileError;

/// A provider with a profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Provider {
    /// OpenAI's API.
    Openai,
    /// Azure OpenAI.
    Azure,
    /// Anthropic's API.
    Anthropic,
    /// Google's Gemini API.
    Gemini,
    /// Amazon Bedrock.
    Bedrock,
}

impl Provider {
    /// Every provider with a profile.
    pub const ALL: [Provider; 5] = [
        Provider::Openai,
        Provider::Azure,
        Provider::Anthropic,
        Provider::Gemini,
        Provider::Bedrock,
    ];

    /// The name used in keys and configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::Openai => "openai",
            Provider::Azure => "azure",
            Provider::Anthropic => "anthropic",
            Provider::Gemini => "gemini",
            Provider::Bedrock => "bedrock",
        }
    }
}

impl FromStr for Provider {
    type Err = ProfileError;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        (Provider::ALL.into_iter())
            .find(|p| p.as_str() == name)
            .ok_or_else(|| ProfileError::UnknownProvider(name.to_owned()))
    }
}
