//! Whose a limit is, as the console shows it (docs/console.md, "The state
//! endpoint"): a budget in money with its period, and a key's own limit whose
//! keys no longer work. A revoked or expired key's limits keep what they held
//! until their window rolls, but nothing can call with that key any more: the
//! console shows them as retired and counts them in no card (at capacity,
//! above 80%, in debt), so an operator's red is only what can still refuse a
//! call.

use std::collections::HashMap;
use std::sync::Mutex;

use gateway::limits::budgets::is_budget_key;
use ratelimiter::directory::{Directory, KeyStatus, Source, KEY_LIMIT_PREFIX};
use serde::Serialize;
use serde_json::{json, Value};

/// The most keys followed from the key whose id a limit carries to the key
/// that charges it now: each rotation links a key to its successor, which
/// charges the first key's limits. Rotations are made by hand, so a real chain
/// is short; the bound keeps a damaged record's loop from spinning.
pub const ROTATION_CHAIN_MAX: usize = 64;

/// Why a key's own limit is counted no more: no key that charges it works.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Retired {
    /// The last key of its rotation chain was revoked (or its tenant deleted).
    Revoked,
    /// The last key of its rotation chain expired.
    Expired,
}

/// Whose budget a limit key is, from its shape (docs/gateway.md, "Budgets"):
/// `(owner kind, owner name)`; the gateway's has no name.
pub fn budget_owner(key: &str) -> Option<(&'static str, Option<&str>)> {
    if !is_budget_key(key) {
        return None;
    }
    let (head, _span) = key.rsplit_once(':')?;
    let head = head.strip_suffix(":usd")?;
    if head == "gateway" {
        return Some(("gateway", None));
    }
    let (kind, name) = head.split_once(':')?;
    let kind = match kind {
        "tenant" => "tenant",
        "key" => "key",
        "model" => "model",
        _ => return None,
    };
    Some((kind, Some(name)))
}

/// The owners of the limits of one document: the directory read once per key
/// (a key has several limits), at the instant the directory judges. Shared by
/// the document's concurrent row reads, hence the lock.
pub struct Owners<'a> {
    directory: Option<&'a Directory>,
    /// Each key id's answer so far.
    seen: Mutex<HashMap<String, Option<Retired>>>,
}

impl<'a> Owners<'a> {
    /// The owners the directory knows; without one (no gateway), no limit is retired.
    pub fn new(directory: Option<&'a Directory>) -> Self {
        Self {
            directory,
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// Whether `key` is a key's own limit (`key:<id>:...`) that no working key
    /// charges: the key with its id and every successor of its rotations are
    /// revoked or expired. A key the directory does not know is not judged
    /// (another server of a fleet may have made it a moment ago).
    pub fn retired(&self, key: &str) -> Option<Retired> {
        let directory = self.directory?;
        let id = key.strip_prefix(KEY_LIMIT_PREFIX)?.split(':').next()?;
        let mut seen = self.seen.lock().expect("the console's owners lock");
        *(seen.entry(id.to_owned())).or_insert_with(|| chain_retired(directory, id))
    }

    /// The budget `key` is, for the limits table: its owner, and where it is
    /// changed: `directory` for a tenant made through the admin API and for a
    /// key (its record holds the budget, so the limit alone must not change),
    /// `configuration` for the rest (the file sets it; the admin API may change
    /// its limit until the next start). `None` for a limit that is no budget.
    pub fn budget(&self, key: &str) -> Option<Value> {
        if !is_budget_key(key) {
            return None;
        }
        let (owner, name) = budget_owner(key)?;
        let in_directory = match (owner, name) {
            ("key", _) => true,
            ("tenant", Some(name)) => (self.directory)
                .and_then(|d| d.tenant(name))
                .is_some_and(|t| t.source == Source::Api),
            _ => false,
        };
        let kept_on = if in_directory { "directory" } else { "configuration" };
        Some(json!({ "owner": owner, "owner_name": name, "kept_on": kept_on }))
    }
}

/// The status of the last key of the rotation chain from `id`, when it is not active.
fn chain_retired(directory: &Directory, id: &str) -> Option<Retired> {
    let mut id = id.to_owned();
    for _ in 0..ROTATION_CHAIN_MAX {
        let view = directory.key_view(&id)?;
        match (view.status, view.rotated_to) {
            (KeyStatus::Active, _) => return None,
            (_, Some(next)) => id = next,
            (KeyStatus::Revoked, None) => return Some(Retired::Revoked),
            (KeyStatus::Expired, None) => return Some(Retired::Expired),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_key_names_its_owner() {
        assert_eq!(budget_owner("gateway:usd:day"), Some(("gateway", None)));
        assert_eq!(budget_owner("tenant:acme:usd:month"), Some(("tenant", Some("acme"))));
        assert_eq!(budget_owner("key:01J:usd:window3600"), Some(("key", Some("01J"))));
        assert_eq!(
            budget_owner("model:llama3:8b:usd:week"),
            Some(("model", Some("llama3:8b")))
        );
        assert_eq!(budget_owner("tenant:acme:llm:rpm"), None, "not money");
        assert_eq!(budget_owner("global:usd:day"), None, "no such owner");
    }
}
