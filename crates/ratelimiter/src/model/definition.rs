//! Limit definitions and their admin state (docs/http-api.md, "LimitDefinition";
//! docs/decisions.md, "Limit definitions").

use serde::{Deserialize, Serialize};

use crate::base::period::Period;
use crate::model::bucket::BucketShape;
use crate::model::key::LimitKey;

/// The longest rolling window: 31 days, long enough for monthly budgets.
pub const WINDOW_SECONDS_MAX: u64 = 2_678_400;
/// The longest concurrency hold timeout: one day. A crashed worker's hold is
/// released after at most this long.
pub const TIMEOUT_SECONDS_MAX: u64 = 86_400;
/// The longest window margin, in ms: a minute. The margin covers the time from
/// a grant to the provider receiving the call, milliseconds when measured
/// (BENCHMARKS.md, "Window margin"); more than a minute is a unit mistake
/// (seconds written as ms) that would quietly cost capacity.
pub const WINDOW_MARGIN_MS_MAX: u64 = 60_000;
/// The window margin of definitions that give none, in ms, when the backend is
/// not told otherwise (`MemoryConfig::window_margin_ms`, the TigerBeetle
/// backend's `BackendOptions::window_margin_ms`, `ratelimiterd`'s
/// `defaults.window_margin_ms`). The provider starts a request's window when
/// the call reaches it, after our grant: the trace replay measured that time on
/// loopback, in process and through `ratelimiterd`, at a median of 0–1 ms and a
/// 99th percentile of at most 31 ms in eight runs of nine on a loaded 2-core
/// machine (the ninth: a burst of 500 grants, up to 174 ms); 50 ms covers that
/// and costs 1/200 of a 10 s window (BENCHMARKS.md, "Window margin").
/// A provider across a network is reached later: add the path's latency.
pub const WINDOW_MARGIN_MS_DEFAULT: u64 = 50;
/// A longer window's default margin is at least 1/250 of the window (0.4 %):
/// the time from a grant to the provider grows with the calls granted at once,
/// and a long window frees a large burst of them when it rolls over (the replay
/// met one burst of 500 grants that reached the provider up to 174 ms late, on
/// a 60 s window, where 50 ms let 461 calls through early: BENCHMARKS.md,
/// "Window margin"). The cost is the same 0.4 % of capacity for any window;
/// windows up to 12.5 s keep the 50 ms floor.
pub const WINDOW_MARGIN_WINDOW_DIVISOR: u64 = 250;
/// Longest `unit` text: it is a label for humans, not a document.
pub const UNIT_BYTES_MAX: usize = 64;
/// Longest `description` text, so the registry file stays small.
pub const DESCRIPTION_BYTES_MAX: usize = 1024;

/// How a limit replenishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitKind {
    /// Each reservation holds its amount for `window_seconds`, then expires
    /// (requests or tokens per minute, daily budgets).
    Rolling,
    /// Each reservation holds its amount until Complete, or `timeout_seconds`
    /// as a safety net when the caller crashed (calls in flight).
    Concurrency,
    /// A token bucket of `capacity` units refilled at `capacity` per
    /// `window_seconds`: a reservation takes its units at once and they come
    /// back by refill, as Anthropic enforces its limits (docs/bucket-limits.md).
    Bucket,
}

impl std::fmt::Display for LimitKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LimitKind::Rolling => "rolling",
            LimitKind::Concurrency => "concurrency",
            LimitKind::Bucket => "bucket",
        })
    }
}

/// What Complete does when the actual usage exceeds what was reserved and the
/// difference no longer fits in the window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Overage {
    /// Drop the difference (it is counted in a metric).
    #[default]
    None,
    /// Record the difference as debt on the limit, reported by the admin API.
    Debt,
}

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

/// A validated limit definition. The fields are the JSON wire contract.
///
/// Only validated values exist: deserialization and [`LimitDefinition::new`] check every
/// rule of docs/http-api.md, "LimitDefinition".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "DefinitionFields", into = "DefinitionFields")]
pub struct LimitDefinition {
    fields: DefinitionFields,
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
    /// configured). At most [`WINDOW_MARGIN_MS_MAX`] and the window. Concurrency:
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

/// Checks a window margin against its bounds: at most [`WINDOW_MARGIN_MS_MAX`]
/// and, when `window_seconds` is not 0, at most the window (a margin longer
/// than the window it pads is a mistake). Backends check their default with
/// `window_seconds` 0.
pub fn check_window_margin_ms(margin_ms: u64, window_seconds: u64) -> Result<(), String> {
    if margin_ms > WINDOW_MARGIN_MS_MAX {
        return Err(format!(
            "window_margin_ms must be at most {WINDOW_MARGIN_MS_MAX}, got {margin_ms}"
        ));
    }
    if window_seconds != 0 && margin_ms > window_seconds * 1000 {
        return Err(format!(
            "window_margin_ms must be at most the window ({} ms), got {margin_ms}",
            window_seconds * 1000
        ));
    }
    Ok(())
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
    /// Usage recorded above reservations under `overage: debt`.
    pub debt: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: &str) -> LimitKey {
        LimitKey::new(k).unwrap()
    }

    #[test]
    fn definitions_serialize_with_the_spec_field_names() {
        let json = r#"{"key":"global:llm:openai:gpt-4o:rpm","kind":"rolling","capacity":3000,"window_seconds":60,"timeout_seconds":0,"unit":"requests","description":"OpenAI gpt-4o requests per minute"}"#;
        let def: LimitDefinition = serde_json::from_str(json).unwrap();
        assert_eq!(def.capacity(), 3000);
        assert_eq!(def.overage(), Overage::None);
        let back: serde_json::Value = serde_json::to_value(&def).unwrap();
        assert_eq!(back["overage"], "none");
        assert_eq!(back["window_seconds"], 60);
        assert_eq!(back["kind"], "rolling");
        let debt: LimitDefinition = serde_json::from_str(
            r#"{"key":"c","kind":"concurrency","capacity":2,"timeout_seconds":300,"overage":"debt"}"#,
        )
        .unwrap();
        assert_eq!(debt.overage(), Overage::Debt);
        assert_eq!(debt.hold_ms(), 300_000);
    }

    #[test]
    fn invalid_definitions_are_rejected() {
        for bad in [
            r#"{"key":"k","kind":"rolling","capacity":0,"window_seconds":60}"#,
            r#"{"key":"k","kind":"rolling","capacity":1,"window_seconds":0}"#,
            r#"{"key":"k","kind":"rolling","capacity":1,"window_seconds":2678401}"#,
            r#"{"key":"k","kind":"rolling","capacity":1,"window_seconds":60,"timeout_seconds":5}"#,
            r#"{"key":"k","kind":"concurrency","capacity":1,"timeout_seconds":0}"#,
            r#"{"key":"k","kind":"concurrency","capacity":1,"timeout_seconds":86401}"#,
            r#"{"key":"k","kind":"concurrency","capacity":1,"timeout_seconds":5,"window_seconds":5}"#,
            r#"{"key":"k","kind":"bucket","capacity":1,"window_seconds":60}"#,
            r#"{"key":"k","kind":"rolling","capacity":-1,"window_seconds":60}"#,
            r#"{"key":"k","kind":"rolling","capacity":1,"window_seconds":60,"capacty":2}"#,
            r#"{"key":"bad key","kind":"rolling","capacity":1,"window_seconds":60}"#,
            r#"{"key":"k","kind":"rolling","capacity":1,"window_seconds":60,"overage":"forgive"}"#,
        ] {
            assert!(serde_json::from_str::<LimitDefinition>(bad).is_err(), "{bad}");
        }
        let long_unit = format!(
            r#"{{"key":"k","kind":"rolling","capacity":1,"window_seconds":60,"unit":"{}"}}"#,
            "u".repeat(UNIT_BYTES_MAX + 1)
        );
        assert!(serde_json::from_str::<LimitDefinition>(&long_unit).is_err());
    }

    #[test]
    fn window_margins_are_optional_bounded_and_kept_as_given() {
        let given = r#"{"key":"k","kind":"rolling","capacity":1,"window_seconds":10,"window_margin_ms":250}"#;
        let def: LimitDefinition = serde_json::from_str(given).unwrap();
        assert_eq!(def.window_margin_ms(), Some(250));
        assert_eq!(def.hold_with_margin_ms(WINDOW_MARGIN_MS_DEFAULT), 10_250);
        let minute = LimitDefinition::rolling(LimitKey::new("k").unwrap(), 1, 60).unwrap();
        assert_eq!(
            minute.hold_with_margin_ms(WINDOW_MARGIN_MS_DEFAULT),
            60_240,
            "0.4 % of a long window"
        );
        let short = LimitDefinition::rolling(LimitKey::new("k").unwrap(), 1, 10).unwrap();
        assert_eq!(
            short.hold_with_margin_ms(WINDOW_MARGIN_MS_DEFAULT),
            10_050,
            "the floor of a short one"
        );
        assert_eq!(serde_json::to_value(&def).unwrap()["window_margin_ms"], 250);

        let absent: LimitDefinition =
            serde_json::from_str(r#"{"key":"k","kind":"rolling","capacity":1,"window_seconds":10}"#).unwrap();
        assert_eq!(absent.window_margin_ms(), None);
        assert_eq!(absent.hold_with_margin_ms(40), 10_040);
        assert!(serde_json::to_value(&absent).unwrap().get("window_margin_ms").is_none());
        let zero = absent.with_window_margin_ms(Some(0)).unwrap();
        assert_eq!(zero.hold_with_margin_ms(40), 10_000);

        let conc = LimitDefinition::concurrency(key("c"), 1, 30).unwrap();
        assert_eq!(conc.hold_with_margin_ms(40), 30_000);
        assert!(conc.with_window_margin_ms(Some(10)).is_err());
        let max = format!(
            r#"{{"key":"k","kind":"rolling","capacity":1,"window_seconds":600,"window_margin_ms":{WINDOW_MARGIN_MS_MAX}}}"#
        );
        assert!(serde_json::from_str::<LimitDefinition>(&max).is_ok());
        for bad in [
            format!(
                r#"{{"key":"k","kind":"rolling","capacity":1,"window_seconds":600,"window_margin_ms":{}}}"#,
                WINDOW_MARGIN_MS_MAX + 1
            ),
            r#"{"key":"k","kind":"rolling","capacity":1,"window_seconds":1,"window_margin_ms":1001}"#.to_owned(),
            r#"{"key":"k","kind":"rolling","capacity":1,"window_seconds":1,"window_margin_ms":-1}"#.to_owned(),
        ] {
            assert!(serde_json::from_str::<LimitDefinition>(&bad).is_err(), "{bad}");
        }
        assert!(check_window_margin_ms(WINDOW_MARGIN_MS_DEFAULT, 0).is_ok());
        assert!(check_window_margin_ms(WINDOW_MARGIN_MS_MAX + 1, 0).is_err());
    }

    #[test]
    fn states_keep_the_window_margin_as_given() {
        let def = LimitDefinition::rolling(key("k"), 100, 60).unwrap();
        for margin in [None, Some(0), Some(75)] {
            let state = LimitState::active(def.with_window_margin_ms(margin).unwrap());
            let json = serde_json::to_string(&state).unwrap();
            assert_eq!(json.contains("window_margin_ms"), margin.is_some(), "{json}");
            assert_eq!(serde_json::from_str::<LimitState>(&json).unwrap(), state);
        }
    }

    #[test]
    fn periods_are_rolling_limits_without_a_window() {
        let json = r#"{"key":"tenant:acme:usd","kind":"rolling","capacity":20000000,"period":"day"}"#;
        let def: LimitDefinition = serde_json::from_str(json).unwrap();
        assert_eq!(def.period(), Some(Period::Day));
        assert_eq!(
            def,
            LimitDefinition::per_period(key("tenant:acme:usd"), 20_000_000, Period::Day).unwrap()
        );
        assert_eq!(def.hold_ms(), 86_400_000);
        assert_eq!(
            def.hold_with_margin_ms(WINDOW_MARGIN_MS_DEFAULT),
            86_400_000,
            "no margin"
        );
        // 2026-11-28T12:00Z: held to midnight, not for 24 hours.
        assert_eq!(def.hold_end_unix_ms(1_795_867_200_000, 50), 1_795_910_400_000);
        let rolling = LimitDefinition::rolling(key("k"), 1, 60).unwrap();
        assert_eq!(rolling.hold_end_unix_ms(1_000, 50), 1_000 + 60_240);
        assert_eq!(serde_json::to_value(&def).unwrap()["period"], "day");
        assert!(serde_json::to_value(&rolling).unwrap().get("period").is_none());
        for period in ["week", "month"] {
            let json = format!(r#"{{"key":"k","kind":"rolling","capacity":1,"period":"{period}"}}"#);
            assert!(serde_json::from_str::<LimitDefinition>(&json).is_ok(), "{period}");
        }
        for bad in [
            r#"{"key":"k","kind":"rolling","capacity":1,"period":"year"}"#,
            r#"{"key":"k","kind":"rolling","capacity":1,"period":"day","window_seconds":86400}"#,
            r#"{"key":"k","kind":"rolling","capacity":1,"period":"day","window_margin_ms":0}"#,
            r#"{"key":"k","kind":"rolling","capacity":0,"period":"day"}"#,
            r#"{"key":"k","kind":"bucket","capacity":100,"period":"day"}"#,
            r#"{"key":"k","kind":"concurrency","capacity":1,"timeout_seconds":5,"period":"day"}"#,
        ] {
            assert!(serde_json::from_str::<LimitDefinition>(bad).is_err(), "{bad}");
        }
        let long_unit = format!(
            r#"{{"key":"k","kind":"rolling","capacity":1,"period":"day","unit":"{}"}}"#,
            "u".repeat(UNIT_BYTES_MAX + 1)
        );
        assert!(
            serde_json::from_str::<LimitDefinition>(&long_unit).is_err(),
            "labels are checked too"
        );
    }

    #[test]
    fn states_carry_the_period_and_old_records_still_decode() {
        let def = LimitDefinition::per_period(key("k"), 500, Period::Month).unwrap();
        let state = LimitState::decreasing(def, 100).unwrap();
        let json = serde_json::to_string(&state).unwrap();
        assert!(json.contains(r#""period":"month""#), "{json}");
        assert_eq!(serde_json::from_str::<LimitState>(&json).unwrap(), state);
        // A record written before periods existed: no field, the rolling window.
        let old = r#"{"key":"k","kind":"rolling","capacity":5,"window_seconds":60,"timeout_seconds":0,"unit":"","description":"","overage":"none","status":"active","pending_decrease_to":0}"#;
        let decoded: LimitState = serde_json::from_str(old).unwrap();
        assert_eq!(decoded.definition().period(), None);
        assert_eq!(serde_json::to_string(&decoded).unwrap(), old, "re-encoded the same");
    }

    #[test]
    fn increases_apply_at_once_and_decreases_wait() {
        let def = LimitDefinition::rolling(key("k"), 100, 60).unwrap();
        let first = LimitState::after_definition(None, def.clone()).unwrap();
        assert_eq!(first.status(), LimitStatus::Active);

        let up = LimitState::after_definition(Some(&first), def.with_capacity(150).unwrap()).unwrap();
        assert_eq!((up.status(), up.definition().capacity()), (LimitStatus::Active, 150));

        let down = LimitState::after_definition(Some(&up), def.with_capacity(40).unwrap()).unwrap();
        assert_eq!(down.status(), LimitStatus::Decreasing);
        assert_eq!(down.definition().capacity(), 150);
        assert_eq!(down.pending_decrease_to(), 40);

        let applied = down.with_decrease_applied();
        assert_eq!(
            (applied.status(), applied.definition().capacity()),
            (LimitStatus::Active, 40)
        );

        let cancelled = LimitState::after_definition(Some(&down), def.with_capacity(150).unwrap()).unwrap();
        assert_eq!(cancelled.status(), LimitStatus::Active);
    }

    #[test]
    fn kind_cannot_change() {
        let rolling = LimitState::active(LimitDefinition::rolling(key("k"), 1, 60).unwrap());
        let conc = LimitDefinition::concurrency(key("k"), 1, 60).unwrap();
        assert!(matches!(
            LimitState::after_definition(Some(&rolling), conc),
            Err(DefinitionError::KindChange { .. })
        ));
    }

    #[test]
    fn states_round_trip_and_validate() {
        let def = LimitDefinition::rolling(key("k"), 100, 60).unwrap();
        let state = LimitState::decreasing(def, 10).unwrap();
        let json = serde_json::to_value(&state).unwrap();
        assert_eq!(json["status"], "decreasing");
        assert_eq!(json["pending_decrease_to"], 10);
        assert_eq!(serde_json::from_value::<LimitState>(json).unwrap(), state);

        let bad = r#"{"key":"k","kind":"rolling","capacity":5,"window_seconds":60,"status":"decreasing","pending_decrease_to":9}"#;
        assert!(serde_json::from_str::<LimitState>(bad).is_err());
        let bad = r#"{"key":"k","kind":"rolling","capacity":5,"window_seconds":60,"status":"active","pending_decrease_to":2}"#;
        assert!(serde_json::from_str::<LimitState>(bad).is_err());
    }

    #[test]
    fn reports_are_flat() {
        let state = LimitState::active(LimitDefinition::concurrency(key("c"), 3, 30).unwrap());
        let report = LimitReport {
            state,
            in_use: 2,
            debt: 0,
        };
        let json = serde_json::to_value(&report).unwrap();
        for field in [
            "key",
            "kind",
            "capacity",
            "status",
            "pending_decrease_to",
            "in_use",
            "debt",
            "overage",
        ] {
            assert!(json.get(field).is_some(), "{field}");
        }
    }
}
