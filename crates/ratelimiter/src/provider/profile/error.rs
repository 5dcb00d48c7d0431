//! Why a profile cannot be built.

use crate::model::definition::DefinitionError;
use crate::model::key::KeyError;

/// Why a profile cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProfileError {
    /// No profile has this name.
    #[error("unknown provider {0:?}: one of openai, azure, anthropic, gemini, bedrock")]
    UnknownProvider(String),
    /// A published figure the provider needs is missing or invalid; the message names it.
    #[error("{0}")]
    Invalid(String),
    /// The provider or model is not a valid key part.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// A definition is out of range.
    #[error(transparent)]
    Definition(#[from] DefinitionError),
}
