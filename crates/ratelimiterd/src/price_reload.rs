//! The gateway's prices changed at runtime (docs/gateway.md, "Prices"): the
//! configuration file read again (on SIGHUP and `POST
//! /v1/admin/gateway/prices/reload`), validated whole as at start, and its
//! `price:` fields applied to calls admitted from then on; any other
//! difference is reported as needing a restart and left alone. The server's
//! state holds it; the HTTP handlers are `prices_api`.

use std::path::PathBuf;
use std::sync::Arc;

use gateway::proxy::prices::{PriceChange, PriceInForce};
use serde::Serialize;

use crate::config::Config;

/// The running gateway's prices and the configuration they were read from.
pub struct PriceReload {
    /// The configuration file, read again at each reload.
    path: PathBuf,
    /// The configuration in force: the file read at start with the prices of
    /// the last reload. One reload at a time.
    in_force: tokio::sync::Mutex<Config>,
    /// The gateway whose prices are set.
    gateway: Arc<gateway::Gateway>,
}

/// What a reload did.
#[derive(Debug, Serialize)]
pub struct Reloaded {
    /// The deployments whose price changed, before and after.
    pub changed: Vec<PriceChange>,
    /// The entries of the file that differ beyond prices: not applied; only a
    /// restart applies them.
    pub needs_restart: Vec<String>,
    /// The digest of the prices now in force.
    pub prices_digest: String,
}

/// The prices in force.
#[derive(Debug, Serialize)]
pub struct PricesInForce {
    /// Their digest: servers with the same digest apply the same prices.
    pub prices_digest: String,
    /// Each deployment's price.
    pub prices: Vec<PriceInForce>,
}

impl PriceReload {
    /// The reload of `gateway`'s prices from `config`'s file; `None` for a
    /// configuration not read from a file (no file to read again).
    pub fn of(config: &Config, gateway: Arc<gateway::Gateway>) -> Option<Self> {
        Some(Self {
            path: config.source.clone()?,
            in_force: tokio::sync::Mutex::new(config.clone()),
            gateway,
        })
    }

    /// Reads the file again and applies its prices. An invalid file, or prices
    /// that would leave a deployment unpriced under the budgets in force, is
    /// refused with the message naming the field, and changes nothing.
    pub async fn reload(&self) -> Result<Reloaded, String> {
        let mut in_force = self.in_force.lock().await;
        let read = Config::load(&self.path).map_err(|e| e.to_string())?;
        let (Some(running), Some(file)) = (in_force.gateway.as_ref(), read.gateway.as_ref()) else {
            let path = self.path.display();
            return Err(format!(
                "config {path}: gateway: the file has no gateway section; nothing changed"
            ));
        };
        // The running configuration with the file's prices: validated whole,
        // so a price the budgets in force need cannot be taken away.
        let next = running.with_prices_of(file);
        let changed = (self.gateway.set_prices(&next))
            .map_err(|e| format!("config {}: gateway.{}: {}", self.path.display(), e.entry, e.message))?;
        let mut needs_restart: Vec<String> = (running.differences_beyond_prices(file).into_iter())
            .map(|entry| format!("gateway: {entry}"))
            .collect();
        needs_restart.extend(sections_beyond_gateway(&in_force, &read));
        in_force.gateway = Some(next);
        for change in &changed {
            tracing::info!(model = %change.model, deployment = %change.deployment,
                before = ?change.before, after = ?change.after, "gateway: price changed");
        }
        if !needs_restart.is_empty() {
            tracing::warn!(
                ?needs_restart,
                "gateway: the configuration file differs beyond prices; only a restart applies it"
            );
        }
        Ok(Reloaded {
            changed,
            needs_restart,
            prices_digest: self.gateway.prices_digest(),
        })
    }

    /// Reloads the prices at each SIGHUP, logging what changed or why nothing did.
    pub fn reload_on_hangup(self: &Arc<Self>) -> std::io::Result<()> {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hangups = signal(SignalKind::hangup())?;
        let reload = self.clone();
        tokio::spawn(async move {
            while hangups.recv().await.is_some() {
                match reload.reload().await {
                    Ok(done) => tracing::info!(changed = done.changed.len(), digest = %done.prices_digest,
                        "gateway: prices reloaded on SIGHUP"),
                    Err(message) => {
                        tracing::error!(%message, "gateway: prices not reloaded on SIGHUP; nothing changed")
                    }
                }
            }
        });
        Ok(())
    }
}

/// The sections of the file beyond `gateway:` that differ from those in force.
fn sections_beyond_gateway(in_force: &Config, read: &Config) -> Vec<String> {
    let sections = |c: &Config| {
        [
            ("server", format!("{:?}", c.server)),
            ("registry", format!("{:?}", c.registry)),
            ("tigerbeetle", format!("{:?}", c.tigerbeetle)),
            ("retry_policy", format!("{:?}", c.retry_policy)),
            ("decrease", format!("{:?}", c.decrease)),
            ("defaults", format!("{:?}", c.defaults)),
            ("memory", format!("{:?}", c.memory)),
            ("log", format!("{:?}", c.log)),
            ("profiles", format!("{:?}", c.profiles)),
        ]
    };
    (sections(in_force).into_iter().zip(sections(read)))
        .filter(|(a, b)| a.1 != b.1)
        .map(|(a, _)| a.0.to_owned())
        .collect()
}
