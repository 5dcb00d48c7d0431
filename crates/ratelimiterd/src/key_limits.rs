//! The own limits of the directory's keys (`key:<id>:llm:rpm`, `...:concurrency`,
//! `...:daily_tokens`, `key:<id>:usd:<span>`; docs/gateway.md, "Tenants and
//! keys"), derived from the key's record.
//!
//! On the memory backend they are not written to the registry file: that file
//! is rewritten whole at every definition, so a key's limits there would make
//! each key's creation cost as much as every key before it (and a million
//! keys' limits would pass the file's bound). The directory's journal already
//! holds each key with its limits, appended once; so a creation applies them to
//! the backend only, and every start derives them again from the records, before
//! the memory snapshot restores what they held ([`define_at_start`]). On
//! TigerBeetle the cluster keeps them, as every definition, at a constant cost.
//!
//! A key's budgets changed by its PATCH are defined through the registry
//! (rare, and serialized with the decrease step). A budget is its key's record
//! (the server refuses `PUT /v1/admin/limits` of one): at start, a budget limit
//! that disagrees with its key's record (a stop between the two writes of a
//! PATCH) is defined again from the record. The rates are defined only where
//! missing: one an operator changed with `PUT /v1/admin/limits` stays.

use std::collections::{HashMap, HashSet};

use gateway::limits::budgets::is_budget_key;
use ratelimiter::directory::{Directory, KeyRecord};
use ratelimiter::{LimitDefinition, LimitKey, LimitState};

use crate::error::ApiError;
use crate::state::AppState;

/// The definitions of `key`'s own limits, as the gateway reserves them.
fn definitions(state: &AppState, key: &KeyRecord) -> Vec<LimitDefinition> {
    let hold_seconds = state.gateway_scope().concurrency_hold_seconds();
    gateway::limits::directory_key_definitions(key, hold_seconds)
}

/// Defines a limit no state holds yet: on the memory backend applied only
/// (its record is the key's, in the directory's journal), elsewhere defined.
async fn define_missing(state: &AppState, definition: LimitDefinition) -> Result<(), ApiError> {
    if state.backend().keeps_definitions() {
        state.admin().define(definition).await?;
        return Ok(());
    }
    let fresh = LimitState::after_definition(None, definition).map_err(ratelimiter::LimiterError::from)?;
    state.backend().apply_state(&fresh).await?;
    Ok(())
}

/// Defines the own limits of `key`, just created: none of them exists
/// (a rotation's key shares its first key's, already defined, and is not
/// given here).
pub async fn define_new(state: &AppState, key: &KeyRecord) -> Result<(), ApiError> {
    for definition in definitions(state, key) {
        define_missing(state, definition).await?;
    }
    Ok(())
}

/// Defines the budgets of `next`, the record a key's PATCH is about to write,
/// before the record names them: no call meets a budget not defined yet.
pub async fn define_budgets(state: &AppState, next: &KeyRecord) -> Result<(), ApiError> {
    let budgets = definitions(state, next)
        .into_iter()
        .filter(|d| is_budget_key(d.key().as_str()));
    for definition in budgets {
        state.admin().define(definition).await?;
    }
    Ok(())
}

/// What a start did to the keys' limits.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StartDefinitions {
    /// Limits no state held (on the memory backend: every key's, each start).
    pub missing: usize,
    /// Budgets that disagreed with their key's record, defined again from it.
    pub budgets_redefined: usize,
}

/// At start, before the memory snapshot is restored: the own limits of every
/// key that has not ended (a revoked or expired key's are never charged
/// again, and on the memory backend they are gone after a restart), from the
/// directory's records, after one read of every limit the backend holds.
pub async fn define_at_start(state: &AppState, directory: &Directory) -> Result<StartDefinitions, String> {
    let reports = state.backend().limit_reports().await.map_err(|e| e.to_string())?;
    let known: HashMap<LimitKey, LimitState> = (reports.into_iter())
        .map(|r| (r.state.definition().key().clone(), r.state))
        .collect();
    // The keys of one rotation share their limits: each is defined once.
    let mut done: HashSet<LimitKey> = HashSet::new();
    let mut out = StartDefinitions::default();
    for key in directory.unended_key_records() {
        for definition in definitions(state, &key) {
            if !done.insert(definition.key().clone()) {
                continue;
            }
            let error = |e: ApiError| format!("{}: {e}", definition.key());
            match known.get(definition.key()) {
                None => {
                    define_missing(state, definition.clone()).await.map_err(error)?;
                    out.missing += 1;
                }
                Some(current) if is_budget_key(definition.key().as_str()) => {
                    let next = LimitState::after_definition(Some(current), definition.clone());
                    if next.as_ref().is_ok_and(|next| next == current) {
                        continue;
                    }
                    tracing::warn!(key = %definition.key(),
                        "gateway: a key's budget disagreed with its record (a stop between the two writes of a change); defined again from the record");
                    (state.admin().define(definition.clone()).await).map_err(|e| error(e.into()))?;
                    out.budgets_redefined += 1;
                }
                Some(_) => {}
            }
        }
    }
    Ok(out)
}
