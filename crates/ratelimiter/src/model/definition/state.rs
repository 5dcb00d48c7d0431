//! A definition with its admin status (what the registry persists), its flat
//! JSON record, and the report of its live usage.

use serde::{Deserialize, Serialize};

use crate::base::period::Period;
use crate::model::key::LimitKey;

use super::error::DefinitionError;
use super::kind::{LimitKind, Overage};
use super::limit::{DefinitionFields, LimitDefinition};

/// Whether a limit takes new reservations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitStatus {
    /// Serving reservations at its capacity.
    Active,
    /// Waiting for usage to fall to a lower capacity; new reservations on the key
    /// are denied with `limit_decreasing:<key>` until then.
    Decreasing,
}

/// A definition with its admin status: what the registry persists.
///
/// While decreasing, `definition.capacity()` is the capacity still in force and
/// `pending_decrease_to` the target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "StateRecord", into = "StateRecord")]
pub struct LimitState {
    definition: LimitDefinition,
    status: LimitStatus,
    pending_decrease_to: u64,
}

impl LimitState {
    /// An active state at the definition's capacity.
    pub fn active(definition: LimitDefinition) -> Self {
        Self {
            definition,
            status: LimitStatus::Active,
            pending_decrease_to: 0,
        }
    }

    /// A decreasing state: `definition.capacity()` still holds and will fall to
    /// `target`, which must be at least 1 and below the current capacity.
    pub fn decreasing(definition: LimitDefinition, target: u64) -> Result<Self, DefinitionError> {
        if target == 0 || target >= definition.capacity() {
            return Err(DefinitionError::Invalid(format!(
                "limit {}: pending_decrease_to must be 1..{}, got {target}",
                definition.key(),
                definition.capacity()
            )));
        }
        Ok(Self {
            definition,
            status: LimitStatus::Decreasing,
            pending_decrease_to: target,
        })
    }

    /// The state that defining `definition` leads to from `previous` (docs/decisions.md,
    /// "Limit definitions"): a new key or a capacity at least the current one is active
    /// at once; a lower capacity is a decrease that waits for usage to allow it.
    pub fn after_definition(
        previous: Option<&LimitState>,
        definition: LimitDefinition,
    ) -> Result<Self, DefinitionError> {
        let Some(previous) = previous else {
            return Ok(Self::active(definition));
        };
        assert_eq!(previous.definition.key(), definition.key(), "states of different keys");
        if previous.definition.kind() != definition.kind() {
            return Err(DefinitionError::KindChange {
                key: definition.key().clone(),
                existing: previous.definition.kind(),
                requested: definition.kind(),
            });
        }
        let current = previous.definition.capacity();
        if definition.capacity() >= current {
            return Ok(Self::active(definition));
        }
        let target = definition.capacity();
        Self::decreasing(definition.with_capacity(current)?, target)
    }

    /// The state once a pending decrease has been carried out.
    pub fn with_decrease_applied(&self) -> Self {
        assert_eq!(self.status, LimitStatus::Decreasing, "no decrease pending");
        let definition = self
            .definition
            .with_capacity(self.pending_decrease_to)
            .expect("target was validated");
        Self::active(definition)
    }

    /// The definition in force (capacity is the current one).
    pub fn definition(&self) -> &LimitDefinition {
        &self.definition
    }
    /// Active or decreasing.
    pub fn status(&self) -> LimitStatus {
        self.status
    }
    /// The target capacity of a decrease; 0 when active.
    pub fn pending_decrease_to(&self) -> u64 {
        self.pending_decrease_to
    }
}

/// The flat JSON form of a [`LimitState`]: the definition's fields plus status.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StateRecord {
    key: LimitKey,
    kind: LimitKind,
    capacity: u64,
    #[serde(default)]
    window_seconds: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    window_margin_ms: Option<u64>,
    #[serde(default)]
    timeout_seconds: u64,
    #[serde(default)]
    unit: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    overage: Overage,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    period: Option<Period>,
    #[serde(default = "active_status")]
    status: LimitStatus,
    #[serde(default)]
    pending_decrease_to: u64,
}

fn active_status() -> LimitStatus {
    LimitStatus::Active
}

impl TryFrom<StateRecord> for LimitState {
    type Error = DefinitionError;

    fn try_from(r: StateRecord) -> Result<Self, Self::Error> {
        let definition = LimitDefinition::new(DefinitionFields {
            key: r.key,
            kind: r.kind,
            capacity: r.capacity,
            window_seconds: r.window_seconds,
            window_margin_ms: r.window_margin_ms,
            timeout_seconds: r.timeout_seconds,
            unit: r.unit,
            description: r.description,
            overage: r.overage,
            period: r.period,
        })?;
        match r.status {
            LimitStatus::Active if r.pending_decrease_to != 0 => Err(DefinitionError::Invalid(format!(
                "limit {}: an active limit has pending_decrease_to 0",
                definition.key()
            ))),
            LimitStatus::Active => Ok(Self::active(definition)),
            LimitStatus::Decreasing => Self::decreasing(definition, r.pending_decrease_to),
        }
    }
}

impl From<LimitState> for StateRecord {
    fn from(s: LimitState) -> Self {
        let f = s.definition.fields;
        Self {
            key: f.key,
            kind: f.kind,
            capacity: f.capacity,
            window_seconds: f.window_seconds,
            window_margin_ms: f.window_margin_ms,
            timeout_seconds: f.timeout_seconds,
            unit: f.unit,
            description: f.description,
            overage: f.overage,
            period: f.period,
            status: s.status,
            pending_decrease_to: s.pending_decrease_to,
        }
    }
}

/// A limit's state with its live usage: what the admin API answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitReport {
    /// Definition and status.
    #[serde(flatten)]
    pub state: LimitState,
    /// Units held now: live rolling reservations or concurrency holds.
    pub in_use: u64,
    /// Usage recorded above reservations under `overage: debt` or `owe`.
    pub debt: u64,
    /// True while an `overage: owe` limit refuses every reservation: usage it
    /// could not hold happened in a window or period that has not ended.
    /// Absent from the JSON when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub owing: bool,
}

/// What a limit of `capacity` holding `in_use` can give a new reservation:
/// the rest of its capacity, nothing while it owes. The one place this is
/// counted, for a report and for the memory backend's quick read alike.
pub fn available_of(capacity: u64, in_use: u64, owing: bool) -> u64 {
    if owing {
        return 0;
    }
    capacity.saturating_sub(in_use)
}

impl LimitReport {
    /// What a new reservation can take now: the capacity less what is held, and
    /// nothing while the limit owes. What a budget's "left" shows, so that it
    /// agrees with what admission does.
    pub fn available(&self) -> u64 {
        available_of(self.state.definition().capacity(), self.in_use, self.owing)
    }

    /// What the limit holds, with its debt while it owes: what a budget's
    /// window or period has taken. Debt that no longer refuses belongs to a
    /// window or period that ended (the debt is a total since the limit began).
    pub fn held_and_owed(&self) -> u64 {
        if self.owing {
            return self.in_use.saturating_add(self.debt);
        }
        self.in_use
    }
}
