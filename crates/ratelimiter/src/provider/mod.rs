//! What a model call and a provider's published limits need reserved (lib.rs,
//! "Layout"): the LLM helper's requirements and actuals, and the provider
//! profiles that turn a provider's page into limit definitions.

pub mod llm;
pub mod profile;
