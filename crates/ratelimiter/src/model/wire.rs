//! Reserve and Complete requests and responses (docs/http-api.md, "POST /v1/reserve" and
//! "POST /v1/complete"). The JSON field names are the wire contract.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use crate::base::id::LeaseId;
use crate::model::key::LimitKey;
use crate::model::owner::LeaseOwner;

/// The most requirements in one reserve: a lease is one TigerBeetle linked chain,
/// and chains are kept far below the 8,189-event batch.
pub const REQUIREMENTS_MAX: usize = 32;
/// The most actuals in one complete: at most one per requirement.
pub const ACTUALS_MAX: usize = REQUIREMENTS_MAX;
/// The longest `job_id`, in bytes: it is only logged.
pub const JOB_ID_BYTES_MAX: usize = 128;
/// The longest `hold_ms` a reserve may ask for: one day. A pause after a provider's
/// 429 lasts until the provider's reset, at most a day for a daily limit; a longer
/// hold would outlive every window the limiter keeps and every retry hint.
pub const HOLD_MS_MAX: u64 = 86_400_000;

/// Why a request is malformed. The message is meant for the caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RequestError(pub String);

/// One limit a request needs, with the units it needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Requirement {
    /// The limit.
    pub key: LimitKey,
    /// Units to reserve; at least 1 (checked by [`ReserveRequest::new`]).
    pub amount: u64,
}

/// The units a finished call really used on one rolling limit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Actual {
    /// The rolling limit to reconcile.
    pub key: LimitKey,
    /// What was used; 0 when the call produced nothing.
    pub actual_amount: u64,
}

/// A validated reserve request: 1..=32 requirements with unique keys and
/// amounts of at least 1, and a job id of at most 128 bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "ReserveFields", into = "ReserveFields")]
pub struct ReserveRequest {
    fields: ReserveFields,
    /// Who the lease belongs to: set by the server from the caller's
    /// credentials, never read from the wire.
    owner: Option<LeaseOwner>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReserveFields {
    lease_id: LeaseId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    job_id: Option<String>,
    requirements: Vec<Requirement>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hold_ms: Option<u64>,
}

impl ReserveRequest {
    /// Validates and builds a reserve request.
    pub fn new(
        lease_id: LeaseId,
        job_id: Option<String>,
        requirements: Vec<Requirement>,
    ) -> Result<Self, RequestError> {
        check_job_id(job_id.as_deref())?;
        if requirements.is_empty() || requirements.len() > REQUIREMENTS_MAX {
            return Err(RequestError(format!(
                "requirements must hold 1..={REQUIREMENTS_MAX} entries, got {}",
                requirements.len()
            )));
        }
        if let Some(r) = requirements.iter().find(|r| r.amount == 0) {
            return Err(RequestError(format!(
                "requirement {}: amount must be at least 1",
                r.key
            )));
        }
        check_unique(requirements.iter().map(|r| &r.key))?;
        Ok(Self {
            fields: ReserveFields {
                lease_id,
                job_id,
                requirements,
                hold_ms: None,
            },
            owner: None,
        })
    }

    /// The request reserving for `owner` (docs/memory-backend.md, "Shares of
    /// the lease table"): the memory backend bounds each owner's live leases.
    /// `None`: no owner, bounded by the whole table only.
    pub fn with_owner(mut self, owner: Option<LeaseOwner>) -> Self {
        self.owner = owner;
        self
    }

    /// The request with another lease id: the caller's id moved into its
    /// owner's namespace ([`LeaseOwner::lease_id`]).
    pub fn with_lease_id(mut self, lease_id: LeaseId) -> Self {
        self.fields.lease_id = lease_id;
        self
    }

    /// Who the lease belongs to, when the server said.
    pub fn owner(&self) -> Option<&LeaseOwner> {
        self.owner.as_ref()
    }

    /// The request holding its reservation for `hold_ms` (1..=[`HOLD_MS_MAX`])
    /// instead of each limit's window or timeout: what a pause after a
    /// provider's 429 asks for, so that the hold ends with the provider's own time
    /// even if the caller dies. `None` restores the definitions' holds.
    pub fn with_hold_ms(mut self, hold_ms: Option<u64>) -> Result<Self, RequestError> {
        check_hold_ms(hold_ms)?;
        self.fields.hold_ms = hold_ms;
        Ok(self)
    }

    /// The attempt's id.
    pub fn lease_id(&self) -> LeaseId {
        self.fields.lease_id
    }
    /// The logical job, for logs.
    pub fn job_id(&self) -> Option<&str> {
        self.fields.job_id.as_deref()
    }
    /// What the attempt needs, all or nothing.
    pub fn requirements(&self) -> &[Requirement] {
        &self.fields.requirements
    }
    /// How long the reservation is held, when the caller chose: instead of
    /// each limit's window (plus margin) or timeout.
    pub fn hold_ms(&self) -> Option<u64> {
        self.fields.hold_ms
    }
}

impl TryFrom<ReserveFields> for ReserveRequest {
    type Error = RequestError;

    fn try_from(f: ReserveFields) -> Result<Self, Self::Error> {
        Self::new(f.lease_id, f.job_id, f.requirements)?.with_hold_ms(f.hold_ms)
    }
}

impl From<ReserveRequest> for ReserveFields {
    fn from(r: ReserveRequest) -> Self {
        r.fields
    }
}

/// A validated complete request: at most 32 actuals with unique keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "CompleteFields", into = "CompleteFields")]
pub struct CompleteRequest {
    fields: CompleteFields,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CompleteFields {
    lease_id: LeaseId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    job_id: Option<String>,
    #[serde(default)]
    actuals: Vec<Actual>,
}

impl CompleteRequest {
    /// Validates and builds a complete request.
    pub fn new(lease_id: LeaseId, job_id: Option<String>, actuals: Vec<Actual>) -> Result<Self, RequestError> {
        check_job_id(job_id.as_deref())?;
        if actuals.len() > ACTUALS_MAX {
            return Err(RequestError(format!(
                "actuals must hold at most {ACTUALS_MAX} entries, got {}",
                actuals.len()
            )));
        }
        check_unique(actuals.iter().map(|a| &a.key))?;
        Ok(Self {
            fields: CompleteFields {
                lease_id,
                job_id,
                actuals,
            },
        })
    }

    /// The request with another lease id: the caller's id moved into its
    /// owner's namespace ([`LeaseOwner::lease_id`]).
    pub fn with_lease_id(mut self, lease_id: LeaseId) -> Self {
        self.fields.lease_id = lease_id;
        self
    }

    /// The lease being completed.
    pub fn lease_id(&self) -> LeaseId {
        self.fields.lease_id
    }
    /// The logical job, for logs.
    pub fn job_id(&self) -> Option<&str> {
        self.fields.job_id.as_deref()
    }
    /// Actual usage per rolling limit.
    pub fn actuals(&self) -> &[Actual] {
        &self.fields.actuals
    }
}

impl TryFrom<CompleteFields> for CompleteRequest {
    type Error = RequestError;

    fn try_from(f: CompleteFields) -> Result<Self, Self::Error> {
        Self::new(f.lease_id, f.job_id, f.actuals)
    }
}

impl From<CompleteRequest> for CompleteFields {
    fn from(r: CompleteRequest) -> Self {
        r.fields
    }
}

fn check_job_id(job_id: Option<&str>) -> Result<(), RequestError> {
    match job_id {
        Some(j) if j.len() > JOB_ID_BYTES_MAX => Err(RequestError(format!(
            "job_id is {} bytes, more than the {JOB_ID_BYTES_MAX} allowed",
            j.len()
        ))),
        _ => Ok(()),
    }
}

fn check_hold_ms(hold_ms: Option<u64>) -> Result<(), RequestError> {
    match hold_ms {
        Some(ms) if ms == 0 || ms > HOLD_MS_MAX => Err(RequestError(format!(
            "hold_ms must be 1..={HOLD_MS_MAX} (one day), got {ms}"
        ))),
        _ => Ok(()),
    }
}

fn check_unique<'a>(keys: impl Iterator<Item = &'a LimitKey>) -> Result<(), RequestError> {
    let mut seen = HashSet::with_capacity(REQUIREMENTS_MAX);
    for key in keys {
        if !seen.insert(key) {
            return Err(RequestError(format!("key {key} appears more than once")));
        }
    }
    Ok(())
}

/// Why a reservation was not granted. "Not now" and "never" are distinct:
/// see [`Denial::is_permanent`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denial {
    /// Not now: `key` has too little free capacity. Retry after the hint with a
    /// new lease id.
    InsufficientCapacity {
        /// The first key that could not take the amount.
        key: LimitKey,
        /// When capacity is expected, in ms (> 0).
        retry_after_ms: u64,
    },
    /// Not now: `key` is waiting for a capacity decrease.
    LimitDecreasing {
        /// The decreasing key.
        key: LimitKey,
        /// The configured decrease retry.
        retry_after_ms: u64,
    },
    /// Never: the amount is larger than `key`'s whole capacity.
    ExceedsCapacity {
        /// The key whose capacity is too small.
        key: LimitKey,
    },
    /// Never with this lease id: it was denied before. Retry with a new one.
    LeaseAlreadyFailed,
}

impl Denial {
    /// The retry hint; 0 where waiting does not help.
    pub fn retry_after_ms(&self) -> u64 {
        match self {
            Denial::InsufficientCapacity { retry_after_ms, .. } | Denial::LimitDecreasing { retry_after_ms, .. } => {
                *retry_after_ms
            }
            Denial::ExceedsCapacity { .. } | Denial::LeaseAlreadyFailed => 0,
        }
    }

    /// True when no retry of the same requirements can ever succeed.
    pub fn is_permanent(&self) -> bool {
        matches!(self, Denial::ExceedsCapacity { .. })
    }

    /// The wire `error` text.
    pub fn error_code(&self) -> String {
        match self {
            Denial::InsufficientCapacity { key, .. } => format!("insufficient_capacity:{key}"),
            Denial::LimitDecreasing { key, .. } => format!("limit_decreasing:{key}"),
            Denial::ExceedsCapacity { key } => format!("exceeds_capacity:{key}"),
            Denial::LeaseAlreadyFailed => "lease_already_failed".to_owned(),
        }
    }
}

/// What a reserve decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReserveOutcome {
    /// Granted; every requirement is held.
    Allowed {
        /// When the lease was reserved (the original time on an idempotent retry).
        reserved_at_unix_ms: u64,
    },
    /// Not granted; nothing is held.
    Denied(Denial),
}

impl ReserveOutcome {
    /// True when granted.
    pub fn is_allowed(&self) -> bool {
        matches!(self, ReserveOutcome::Allowed { .. })
    }
}

/// The reserve answer on the wire (HTTP 200 for both allowed and denied).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReserveResponse {
    /// Whether every requirement is held.
    pub allowed: bool,
    /// Retry hint in ms; 0 when allowed or when waiting does not help.
    pub retry_after_ms: u64,
    /// Reservation time; 0 when denied.
    pub reserved_at_unix_ms: u64,
    /// Why not, when there is something to say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl From<&ReserveOutcome> for ReserveResponse {
    fn from(outcome: &ReserveOutcome) -> Self {
        match outcome {
            ReserveOutcome::Allowed { reserved_at_unix_ms } => Self {
                allowed: true,
                retry_after_ms: 0,
                reserved_at_unix_ms: *reserved_at_unix_ms,
                error: None,
            },
            ReserveOutcome::Denied(denial) => Self {
                allowed: false,
                retry_after_ms: denial.retry_after_ms(),
                reserved_at_unix_ms: 0,
                error: Some(denial.error_code()),
            },
        }
    }
}

impl TryFrom<&ReserveResponse> for ReserveOutcome {
    type Error = RequestError;

    /// Reads a wire answer back into an outcome (the HTTP client's side).
    fn try_from(r: &ReserveResponse) -> Result<Self, Self::Error> {
        if r.allowed {
            return Ok(ReserveOutcome::Allowed {
                reserved_at_unix_ms: r.reserved_at_unix_ms,
            });
        }
        let error = r.error.as_deref().unwrap_or("");
        let key_of = |rest: &str| LimitKey::new(rest).map_err(|e| RequestError(format!("bad key in {error:?}: {e}")));
        let denial = if let Some(rest) = error.strip_prefix("insufficient_capacity:") {
            Denial::InsufficientCapacity {
                key: key_of(rest)?,
                retry_after_ms: r.retry_after_ms,
            }
        } else if let Some(rest) = error.strip_prefix("limit_decreasing:") {
            Denial::LimitDecreasing {
                key: key_of(rest)?,
                retry_after_ms: r.retry_after_ms,
            }
        } else if let Some(rest) = error.strip_prefix("exceeds_capacity:") {
            Denial::ExceedsCapacity { key: key_of(rest)? }
        } else if error == "lease_already_failed" {
            Denial::LeaseAlreadyFailed
        } else {
            return Err(RequestError(format!("unexpected denial {error:?}")));
        };
        Ok(ReserveOutcome::Denied(denial))
    }
}

/// The complete answer on the wire: always `{"ok": true}` for a well-formed request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompleteResponse {
    /// Always true; errors are answered with an error status instead.
    pub ok: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: &str = "01ARZ3NDEKTSV4RRFFQ69G5FAV";

    #[test]
    fn reserve_request_parses_the_spec_example() {
        let json = format!(
            r#"{{"lease_id":"{LEASE}","job_id":"01J0000000000000000000000J","requirements":[
            {{"key":"global:llm:openai:gpt-4o:rpm","amount":1}},
            {{"key":"global:llm:openai:gpt-4o:tpm","amount":1800}},
            {{"key":"global:llm:openai:gpt-4o:concurrency","amount":1}},
            {{"key":"tenant:tenant_a:llm:daily_tokens","amount":1800}}]}}"#
        );
        let req: ReserveRequest = serde_json::from_str(&json).unwrap();
        assert_eq!(req.requirements().len(), 4);
        assert_eq!(req.lease_id().to_string(), LEASE);
        let back = serde_json::to_value(&req).unwrap();
        assert_eq!(back["requirements"][1]["amount"], 1800);
        assert_eq!(back["lease_id"], LEASE);
    }

    #[test]
    fn reserve_request_rules_are_enforced() {
        let req = |body: &str| serde_json::from_str::<ReserveRequest>(&format!(r#"{{"lease_id":"{LEASE}",{body}}}"#));
        assert!(req(r#""requirements":[]"#).is_err());
        assert!(req(r#""requirements":[{"key":"a","amount":0}]"#).is_err());
        assert!(req(r#""requirements":[{"key":"a","amount":-1}]"#).is_err());
        assert!(req(r#""requirements":[{"key":"a","amount":1},{"key":"a","amount":2}]"#).is_err());
        assert!(req(r#""requirements":[{"key":"a","amount":18446744073709551616}]"#).is_err());
        assert!(req(r#""requirements":[{"key":"a","amount":1}],"extra":1"#).is_err());
        assert!(req(&format!(
            r#""job_id":"{}","requirements":[{{"key":"a","amount":1}}]"#,
            "j".repeat(129)
        ))
        .is_err());
        let many: Vec<String> = (0..33).map(|i| format!(r#"{{"key":"k{i}","amount":1}}"#)).collect();
        assert!(req(&format!(r#""requirements":[{}]"#, many.join(","))).is_err());
        let ok: Vec<String> = (0..32).map(|i| format!(r#"{{"key":"k{i}","amount":1}}"#)).collect();
        assert!(req(&format!(r#""requirements":[{}]"#, ok.join(","))).is_ok());
        assert!(serde_json::from_str::<ReserveRequest>(
            r#"{"lease_id":"nope","requirements":[{"key":"a","amount":1}]}"#
        )
        .is_err());
    }

    #[test]
    fn hold_ms_is_optional_and_bounded() {
        let req = |hold: &str| {
            serde_json::from_str::<ReserveRequest>(&format!(
                r#"{{"lease_id":"{LEASE}","requirements":[{{"key":"a","amount":1}}]{hold}}}"#
            ))
        };
        assert_eq!(req("").unwrap().hold_ms(), None);
        let held = req(r#","hold_ms":1500"#).unwrap();
        assert_eq!(held.hold_ms(), Some(1500));
        assert_eq!(serde_json::to_value(&held).unwrap()["hold_ms"], 1500);
        assert!(serde_json::to_value(req("").unwrap()).unwrap().get("hold_ms").is_none());
        assert_eq!(req(r#","hold_ms":86400000"#).unwrap().hold_ms(), Some(HOLD_MS_MAX));
        for bad in ["0", "86400001", "-1", "1.5", "\"1\""] {
            assert!(req(&format!(r#","hold_ms":{bad}"#)).is_err(), "hold_ms {bad}");
        }
        let built = req("").unwrap();
        assert!(built.clone().with_hold_ms(Some(0)).is_err());
        assert!(built.clone().with_hold_ms(Some(HOLD_MS_MAX + 1)).is_err());
        assert_eq!(built.with_hold_ms(Some(1)).unwrap().hold_ms(), Some(1));
    }

    #[test]
    fn complete_request_parses_and_validates() {
        let json = format!(
            r#"{{"lease_id":"{LEASE}","actuals":[{{"key":"global:llm:openai:gpt-4o:tpm","actual_amount":740}},{{"key":"tenant:tenant_a:llm:daily_tokens","actual_amount":0}}]}}"#
        );
        let req: CompleteRequest = serde_json::from_str(&json).unwrap();
        assert_eq!(req.actuals()[0].actual_amount, 740);
        let no_actuals: CompleteRequest = serde_json::from_str(&format!(r#"{{"lease_id":"{LEASE}"}}"#)).unwrap();
        assert!(no_actuals.actuals().is_empty());
        let dup = format!(
            r#"{{"lease_id":"{LEASE}","actuals":[{{"key":"a","actual_amount":1}},{{"key":"a","actual_amount":1}}]}}"#
        );
        assert!(serde_json::from_str::<CompleteRequest>(&dup).is_err());
    }

    #[test]
    fn responses_have_the_wire_shape() {
        let allowed = ReserveResponse::from(&ReserveOutcome::Allowed {
            reserved_at_unix_ms: 1_736_660_000_000,
        });
        assert_eq!(
            serde_json::to_string(&allowed).unwrap(),
            r#"{"allowed":true,"retry_after_ms":0,"reserved_at_unix_ms":1736660000000}"#
        );
        let key = LimitKey::new("global:llm:openai:gpt-4o:tpm").unwrap();
        let cases = [
            (
                Denial::InsufficientCapacity {
                    key: key.clone(),
                    retry_after_ms: 120,
                },
                "insufficient_capacity:global:llm:openai:gpt-4o:tpm",
                120,
            ),
            (
                Denial::LimitDecreasing {
                    key: key.clone(),
                    retry_after_ms: 10_000,
                },
                "limit_decreasing:global:llm:openai:gpt-4o:tpm",
                10_000,
            ),
            (
                Denial::ExceedsCapacity { key: key.clone() },
                "exceeds_capacity:global:llm:openai:gpt-4o:tpm",
                0,
            ),
            (Denial::LeaseAlreadyFailed, "lease_already_failed", 0),
        ];
        for (denial, code, retry) in cases {
            let outcome = ReserveOutcome::Denied(denial);
            let wire = ReserveResponse::from(&outcome);
            assert_eq!(wire.error.as_deref(), Some(code));
            assert_eq!(
                (wire.allowed, wire.retry_after_ms, wire.reserved_at_unix_ms),
                (false, retry, 0)
            );
            assert_eq!(ReserveOutcome::try_from(&wire).unwrap(), outcome);
        }
        assert_eq!(
            serde_json::to_string(&CompleteResponse { ok: true }).unwrap(),
            r#"{"ok":true}"#
        );
    }
}
