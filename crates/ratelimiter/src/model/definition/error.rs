//! Why a definition or a state is refused.

use crate::model::key::LimitKey;

use super::kind::LimitKind;

/// Why a definition or state is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DefinitionError {
    /// A field is out of its range; the message names the field.
    #[error("{0}")]
    Invalid(String),
    /// The kind of an existing key cannot change: live reservations were made
    /// under the old kind's rules.
    #[error("limit {key} is {existing}; its kind cannot change to {requested}")]
    KindChange {
        /// The key whose kind would change.
        key: LimitKey,
        /// The kind it has.
        existing: LimitKind,
        /// The kind that was asked for.
        requested: LimitKind,
    },
}
