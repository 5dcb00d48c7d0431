//! A validated limit definition, its raw fields and their validation, and the
//! bucket shape a definition has under a backend's margin.

use serde::{Deserialize, Serialize};

use crate::base::period::Period;
use crate::model::bucket::{BucketShape, BUCKET_SLOTS_PER_WINDOW};
use crate::model::key::LimitKey;

use super::bounds::{
    check_window_margin_ms, DESCRIPTION_BYTES_MAX, TIMEOUT_SECONDS_MAX, UNIT_BYTES_MAX, WINDOW_MARGIN_MS_DEFAULT,
    WINDOW_MARGIN_WINDOW_DIVISOR, WINDOW_SECONDS_MAX,
};
use super::error::DefinitionError;
use super::kind::{LimitKind, Overage};

/// A validated limit definition. The fields are the JSON wire contract.
///
/// Only validated values exist: deserialization and [`LimitDefinition::new`] check every
/// rule of docs/http-api.md, "LimitDefinition".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "DefinitionFields", into = "DefinitionFields")]
pub struct LimitDefinition {
    pub(super) fields: DefinitionFields,
}

/// The raw fields of a definition, before validation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DefinitionFields {
    /// The key this definition limits.
    pub key: LimitKey,
    /// Rolling window, concurrency or token bucket.
    pub kind: LimitKind,
    /// The most units granted at once; at least 1.
    pub capacity: u64,
    /// Rolling: 1..=2,678,400. Bucket: the same range, the time to refill from
    /// empty to full. Concurrency: 0.
    #[serde(default)]
    pub window_seconds: u64,
    /// Rolling: how long, in ms, a reservation is held beyond `window_seconds`,
    /// so that it outlasts the provider's window, which starts when the call
    /// reaches the provider, after the grant. `None` (absent in JSON): the
    /// backend's default applies ([`WINDOW_MARGIN_MS_DEFAULT`] unless
    /// configured). At most [`WINDOW_MARGIN_MS_MAX`](super::WINDOW_MARGIN_MS_MAX) and the window. Concurrency:
    /// absent, as a hold ends at Complete and its timeout only frees crashed
    /// callers' holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_margin_ms: Option<u64>,
    /// Concurrency: 1..=86,400. Rolling and bucket: 0.
    #[serde(default)]
    pub timeout_seconds: u64,
    /// A label for humans: "requests", "tokens", "inflight".
    #[serde(default)]
    pub unit: String,
    /// What the limit is for, for operators.
    #[serde(default)]
    pub description: String,
    /// What happens to usage above the reservation.
    #[serde(default)]
    pub overage: Overage,
    /// Rolling only, instead of `window_seconds` (then 0) and `window_margin_ms`
    /// (then absent): every hold ends at the end of the calendar period in UTC it
    /// was granted in ([`Period`]), so the limit resets at each boundary (a budget
    /// of so much a day, week or month). `None` (absent in JSON): the rolling window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period: Option<Period>,
}

impl LimitDefinition {
    /// Validates `fields` into a definition.
    pub fn new(fields: DefinitionFields) -> Result<Self, DefinitionError> {
        validate_fields(&fields)?;
        Ok(Self { fields })
    }

    /// A rolling limit of `capacity` units per `window_seconds`.
    pub fn rolling(key: LimitKey, capacity: u64, window_seconds: u64) -> Result<Self, DefinitionError> {
        Self::plain(key, LimitKind::Rolling, capacity, window_seconds, 0)
    }

    /// A concurrency limit of `capacity` units held at once, each hold released
    /// after `timeout_seconds` at the latest.
    pub fn concurrency(key: LimitKey, capacity: u64, timeout_seconds: u64) -> Result<Self, DefinitionError> {
        Self::plain(key, LimitKind::Concurrency, capacity, 0, timeout_seconds)
    }

    /// A token bucket of `capacity` units refilled at `capacity` per `window_seconds`.
    pub fn bucket(key: LimitKey, capacity: u64, window_seconds: u64) -> Result<Self, DefinitionError> {
        Self::plain(key, LimitKind::Bucket, capacity, window_seconds, 0)
    }

    /// A definition with the default margin, no labels and overage dropped.
    fn plain(
        key: LimitKey,
        kind: LimitKind,
        capacity: u64,
        window_seconds: u64,
        timeout_seconds: u64,
    ) -> Result<Self, DefinitionError> {
        Self::new(DefinitionFields {
            key,
            kind,
            capacity,
            window_seconds,
            window_margin_ms: None,
            timeout_seconds,
            unit: String::new(),
            description: String::new(),
            overage: Overage::None,
            period: None,
        })
    }

    /// A rolling limit of `capacity` units per calendar `period` in UTC: every
    /// hold ends at the end of the period it was granted in.
    pub fn per_period(key: LimitKey, capacity: u64, period: Period) -> Result<Self, DefinitionError> {
        Self::new(DefinitionFields {
            key,
            kind: LimitKind::Rolling,
            capacity,
            window_seconds: 0,
            window_margin_ms: None,
            timeout_seconds: 0,
            unit: String::new(),
            description: String::new(),
            overage: Overage::None,
            period: Some(period),
        })
    }

    /// A copy with another capacity, validated.
    pub fn with_capacity(&self, capacity: u64) -> Result<Self, DefinitionError> {
        Self::new(DefinitionFields {
            capacity,
            ..self.fields.clone()
        })
    }

    /// A copy with another window margin (`None`: the backend's default), validated.
    pub fn with_window_margin_ms(&self, window_margin_ms: Option<u64>) -> Result<Self, DefinitionError> {
        Self::new(DefinitionFields {
            window_margin_ms,
            ..self.fields.clone()
        })
    }

    /// A copy with another overage policy.
    pub fn with_overage(&self, overage: Overage) -> Self {
        Self {
            fields: DefinitionFields {
                overage,
                ..self.fields.clone()
            },
        }
    }

    /// The limited key.
    pub fn key(&self) -> &LimitKey {
        &self.fields.key
    }
    /// Rolling, concurrency or bucket.
    pub fn kind(&self) -> LimitKind {
        self.fields.kind
    }
    /// The most units granted at once.
    pub fn capacity(&self) -> u64 {
        self.fields.capacity
    }
    /// The rolling window, or a bucket's refill time from empty to full (0 for concurrency).
    pub fn window_seconds(&self) -> u64 {
        self.fields.window_seconds
    }
    /// What the units are (`requests`, `tokens`), as the definition says; may be empty.
    pub fn unit(&self) -> &str {
        &self.fields.unit
    }
    /// The hold timeout (0 for rolling).
    pub fn timeout_seconds(&self) -> u64 {
        self.fields.timeout_seconds
    }
    /// The window margin as given: `None` when the backend's default applies.
    pub fn window_margin_ms(&self) -> Option<u64> {
        self.fields.window_margin_ms
    }
    /// The calendar period whose end ends every hold, when the limit has one.
    pub fn period(&self) -> Option<Period> {
        self.fields.period
    }
    /// When a hold of this limit granted at `granted_unix_ms` ends: at the end of
    /// its period, else after [`LimitDefinition::hold_with_margin_ms`].
    pub fn hold_end_unix_ms(&self, granted_unix_ms: u64, default_margin_ms: u64) -> u64 {
        match self.fields.period {
            Some(period) => period.end_unix_ms(granted_unix_ms),
            None => granted_unix_ms + self.hold_with_margin_ms(default_margin_ms),
        }
    }
    /// The window or the timeout, in ms, without the margin: what retry hints
    /// scale with. A period's longest length for a limit with a period.
    pub fn hold_ms(&self) -> u64 {
        match (self.fields.kind, self.fields.period) {
            (LimitKind::Rolling, Some(period)) => period.longest_ms(),
            (LimitKind::Rolling | LimitKind::Bucket, None) => self.fields.window_seconds * 1000,
            (LimitKind::Bucket, Some(_)) => unreachable!("only rolling limits take a period"),
            (LimitKind::Concurrency, _) => self.fields.timeout_seconds * 1000,
        }
    }
    /// How long one reservation holds at most, in ms: a rolling limit's window
    /// plus its margin, a concurrency limit's timeout. For a bucket, the window
    /// plus its margin is how long a Complete may still give units back. The margin is the
    /// definition's own, else `default_margin_ms` or 1/[`WINDOW_MARGIN_WINDOW_DIVISOR`]
    /// of the window, whichever is longer; a default of 0 turns the default
    /// margin off altogether.
    pub fn hold_with_margin_ms(&self, default_margin_ms: u64) -> u64 {
        match self.fields.kind {
            // The boundary is the limit's own, not a provider's: no margin.
            LimitKind::Rolling if self.fields.period.is_some() => self.hold_ms(),
            LimitKind::Rolling | LimitKind::Bucket => {
                let proportional = self.hold_ms() / WINDOW_MARGIN_WINDOW_DIVISOR;
                let default = match default_margin_ms {
                    0 => 0,
                    floor => floor.max(proportional),
                };
                self.hold_ms() + self.fields.window_margin_ms.unwrap_or(default)
            }
            LimitKind::Concurrency => self.hold_ms(),
        }
    }
    /// The most units one reservation can ever take under a backend whose default
    /// margin is `default_margin_ms`: the capacity, or a bucket's burst
    /// ([`crate::bucket::BucketShape::burst`]; 0 when that backend cannot serve it).
    pub fn grantable_max(&self, default_margin_ms: u64) -> u64 {
        match self.fields.kind {
            LimitKind::Rolling | LimitKind::Concurrency => self.fields.capacity,
            LimitKind::Bucket => BucketShape::new(self, default_margin_ms).map_or(0, |shape| shape.burst()),
        }
    }
    /// The overage policy.
    pub fn overage(&self) -> Overage {
        self.fields.overage
    }
    /// The raw fields.
    pub fn fields(&self) -> &DefinitionFields {
        &self.fields
    }
}

fn validate_fields(f: &DefinitionFields) -> Result<(), DefinitionError> {
    let invalid = |message: String| Err(DefinitionError::Invalid(message));
    if f.capacity == 0 {
        return invalid(format!("limit {}: capacity must be at least 1", f.key));
    }
    if let Some(period) = f.period {
        return validate_period(f, period);
    }
    match f.kind {
        LimitKind::Rolling | LimitKind::Bucket => {
            if !(1..=WINDOW_SECONDS_MAX).contains(&f.window_seconds) {
                return invalid(format!(
                    "limit {}: {} window_seconds must be 1..={WINDOW_SECONDS_MAX}, got {}",
                    f.key, f.kind, f.window_seconds
                ));
            }
            if f.timeout_seconds != 0 {
                return invalid(format!("limit {}: {} limits take timeout_seconds 0", f.key, f.kind));
            }
            if let Some(margin) = f.window_margin_ms {
                check_window_margin_ms(margin, f.window_seconds).map_err(|m| invalid_margin(&f.key, m))?;
            }
            if f.kind == LimitKind::Bucket {
                check_bucket_burst(f)?;
            }
        }
        LimitKind::Concurrency => {
            if !(1..=TIMEOUT_SECONDS_MAX).contains(&f.timeout_seconds) {
                return invalid(format!(
                    "limit {}: concurrency timeout_seconds must be 1..={TIMEOUT_SECONDS_MAX}, got {}",
                    f.key, f.timeout_seconds
                ));
            }
            if f.window_seconds != 0 {
                return invalid(format!("limit {}: concurrency limits take window_seconds 0", f.key));
            }
            if f.window_margin_ms.is_some() {
                return invalid(format!("limit {}: concurrency limits take no window_margin_ms", f.key));
            }
        }
    }
    if f.unit.len() > UNIT_BYTES_MAX {
        return invalid(format!("limit {}: unit is longer than {UNIT_BYTES_MAX} bytes", f.key));
    }
    if f.description.len() > DESCRIPTION_BYTES_MAX {
        return invalid(format!(
            "limit {}: description is longer than {DESCRIPTION_BYTES_MAX} bytes",
            f.key
        ));
    }
    Ok(())
}

/// Checks a limit with a calendar period: rolling, with neither a window, a
/// margin nor a timeout (its holds end at the period's boundary), and labels of
/// bounded length.
fn validate_period(f: &DefinitionFields, period: Period) -> Result<(), DefinitionError> {
    let invalid = |message: String| Err(DefinitionError::Invalid(message));
    if f.kind != LimitKind::Rolling {
        return invalid(format!(
            "limit {}: only rolling limits take a period, not {}",
            f.key, f.kind
        ));
    }
    if f.window_seconds != 0 || f.window_margin_ms.is_some() || f.timeout_seconds != 0 {
        return invalid(format!(
            "limit {}: a limit with period {period} takes no window_seconds, window_margin_ms or timeout_seconds",
            f.key
        ));
    }
    let labels = DefinitionFields {
        period: None,
        window_seconds: 1,
        ..f.clone()
    };
    validate_fields(&labels)
}

/// Checks that a bucket keeps a burst of at least 1 under its own margin, or the
/// standard default margin when it gives none (a backend configured with a longer
/// default checks again when it applies the definition): the shape and its error
/// are [`BucketShape::new`]'s, on the fields as they would be defined.
fn check_bucket_burst(f: &DefinitionFields) -> Result<(), DefinitionError> {
    let definition = LimitDefinition { fields: f.clone() };
    BucketShape::new(&definition, WINDOW_MARGIN_MS_DEFAULT).map(|_| ())
}

fn invalid_margin(key: &LimitKey, message: String) -> DefinitionError {
    DefinitionError::Invalid(format!("limit {key}: {message}"))
}

impl TryFrom<DefinitionFields> for LimitDefinition {
    type Error = DefinitionError;

    fn try_from(fields: DefinitionFields) -> Result<Self, Self::Error> {
        Self::new(fields)
    }
}

impl From<LimitDefinition> for DefinitionFields {
    fn from(definition: LimitDefinition) -> Self {
        definition.fields
    }
}

// The shape is the bucket arithmetic's (`crate::bucket`), which knows nothing of
// definitions; taking it from a definition belongs here, beside the validation that
// refuses a bucket without burst.
impl BucketShape {
    /// The shape of `definition` (a bucket) when the backend's default margin is
    /// `default_margin_ms`. Errs when the margin leaves no burst at all: the
    /// definition is valid, but this backend cannot serve it safely.
    pub fn new(definition: &LimitDefinition, default_margin_ms: u64) -> Result<Self, DefinitionError> {
        assert_eq!(definition.kind(), LimitKind::Bucket, "only buckets have a shape");
        let window_ms = definition.hold_ms();
        let margin_ms = definition.hold_with_margin_ms(default_margin_ms) - window_ms;
        Self::from_parts(definition.capacity(), window_ms, margin_ms).ok_or_else(|| {
            DefinitionError::Invalid(format!(
                "limit {}: a bucket of capacity {} refilled over {} ms keeps no burst after its {} ms margin \
                 and {} ms refill slot; raise the capacity or the window",
                definition.key(),
                definition.capacity(),
                window_ms,
                margin_ms,
                window_ms.div_ceil(BUCKET_SLOTS_PER_WINDOW),
            ))
        })
    }
}
