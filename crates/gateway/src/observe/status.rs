//! What the gateway shows an operator of each model right now (the console of
//! docs/console.md): whether it is paused after a provider 429, how many calls
//! wait in its queue, and its deployments. Names only: no upstream or tenant
//! key ever appears here.
//!
//! Deployments are generic on purpose: a model served by one upstream has
//! none listed; a model spread over several reports each with whatever the
//! router knows (its share of traffic, a pause, a breaker state), and the
//! console shows the fields that are present.

use std::sync::atomic::Ordering;

use serde::Serialize;

use crate::config::HEADROOM_PPM_ONE;
use crate::limits::Classes;
use crate::routing::Pool;

/// The live state of one served model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelStatus {
    /// The model's name, as clients send it.
    pub name: String,
    /// The upstream it is sent to.
    pub upstream: String,
    /// Time left of this server's pause after a provider 429; `None` when the
    /// model is not paused.
    pub paused_ms_left: Option<u64>,
    /// Calls waiting in the model's queue now.
    pub queue_len: usize,
    /// The deployments the model is spread over; empty when it has one upstream.
    pub deployments: Vec<DeploymentStatus>,
}

/// The live state of one deployment of a model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeploymentStatus {
    /// The deployment's name.
    pub name: String,
    /// Its share of the model's traffic, 0.0..=1.0, when the router weighs them.
    pub share: Option<f64>,
    /// Time left of its pause; `None` when it takes calls.
    pub paused_ms_left: Option<u64>,
    /// Its circuit breaker's state (`closed`, `open`, `half_open`), when it has one.
    pub breaker: Option<String>,
}

impl DeploymentStatus {
    /// Each deployment's live state for the operator's console: its share of
    /// the calls this server reserved on the pool (`None` before the first),
    /// this server's pause after its 429, and its breaker.
    pub fn of_pool(pool: &Pool) -> Vec<Self> {
        let admitted: Vec<u64> = (pool.deployments.iter())
            .map(|d| d.state.admitted.load(Ordering::Relaxed))
            .collect();
        let total: u64 = admitted.iter().sum();
        (pool.deployments.iter().zip(admitted))
            .map(|(d, admitted)| Self {
                name: format!("{}/{}", d.label, d.config.name),
                share: (total > 0).then(|| admitted as f64 / total as f64),
                paused_ms_left: d.state.cooldown.left_ms(),
                breaker: (d.state.breaker.as_ref()).map(|_| d.state.breaker_state().label().to_owned()),
            })
            .collect()
    }
}

/// One priority class as configured, with what waits in it now (docs/gateway.md,
/// "Classes"): what the console's classes panel shows besides the counters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClassStatus {
    /// The class's name.
    pub name: String,
    /// Its weight when waiting classes share freed capacity.
    pub share: u32,
    /// Its own headroom in millionths of every model limit: what the classes
    /// below it may not take (0 for the lowest).
    pub headroom_ppm: u64,
    /// What it may hold of every model limit with the classes below it, in
    /// millionths: its ceiling keys' fraction (1,000,000 for the top class).
    pub ceiling_ppm: u64,
    /// The tenants whose calls run in it, in configuration order.
    pub tenants: Vec<String>,
    /// Per model (configuration order), its calls waiting in that model's queue now.
    pub queue_len: Vec<(String, usize)>,
}

impl ModelStatus {
    /// The state of model `name` served by `pool` (`single`: a model of the
    /// single-deployment form), with `queue_len` calls waiting.
    pub fn of(name: &str, pool: &Pool, single: bool, queue_len: usize) -> Self {
        let deployments = &pool.deployments;
        Self {
            name: name.to_owned(),
            upstream: if single {
                deployments[0].label.to_string()
            } else {
                let labels: Vec<&str> = deployments.iter().map(|d| d.label.as_ref()).collect();
                labels.join(", ")
            },
            paused_ms_left: if single {
                deployments[0].state.cooldown.left_ms()
            } else {
                None
            },
            queue_len,
            deployments: if single {
                Vec::new()
            } else {
                DeploymentStatus::of_pool(pool)
            },
        }
    }

    /// True when the model or every one of its deployments is paused: calls to
    /// it wait or are refused until a pause ends.
    pub fn is_paused(&self) -> bool {
        self.paused_ms_left.is_some()
            || (!self.deployments.is_empty() && self.deployments.iter().all(|d| d.paused_ms_left.is_some()))
    }
}

impl ClassStatus {
    /// Class `class` of `classes`, run by `tenants`, with `queue_len` waiting per model.
    pub fn of(classes: &Classes, class: usize, tenants: Vec<String>, queue_len: Vec<(String, usize)>) -> Self {
        Self {
            name: classes.name(class).to_owned(),
            share: classes.work_classes()[class].share(),
            headroom_ppm: classes.headroom_ppm(class),
            ceiling_ppm: HEADROOM_PPM_ONE - classes.above_ppm(class),
            tenants,
            queue_len,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployment(name: &str, paused_ms_left: Option<u64>) -> DeploymentStatus {
        DeploymentStatus {
            name: name.to_owned(),
            share: Some(0.5),
            paused_ms_left,
            breaker: None,
        }
    }

    #[test]
    fn a_model_is_paused_by_its_own_pause_or_all_its_deployments() {
        let mut model = ModelStatus {
            name: "gpt".to_owned(),
            upstream: "openai".to_owned(),
            paused_ms_left: None,
            queue_len: 0,
            deployments: Vec::new(),
        };
        assert!(!model.is_paused());
        model.paused_ms_left = Some(10);
        assert!(model.is_paused());
        model.paused_ms_left = None;
        model.deployments = vec![deployment("a", Some(5)), deployment("b", None)];
        assert!(!model.is_paused(), "one deployment still takes calls");
        model.deployments[1].paused_ms_left = Some(7);
        assert!(model.is_paused());
    }
}
