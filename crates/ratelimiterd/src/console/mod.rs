//! The operator's console (docs/console.md): a page at `/ui` on the limiter's
//! listener, its HTML, CSS and JavaScript compiled into the binary, the JSON
//! endpoint it reads every second, `GET /ui/api/state`, and the tenants and
//! keys panel's, `GET /ui/api/directory`, and the budgets panel's and spend
//! chart's, `GET /ui/api/budgets` and `GET /ui/api/spend`.
//!
//! Who may read it: with `server.admin_token` set, the endpoint needs that
//! token, as the admin API does (the page asks for it and keeps it for the tab
//! only). Without one, the console is served only when the server listens on
//! loopback; on any other address it is off and the log says why at startup.
//! The page's files carry no data, so they load without a header (a browser
//! cannot send one when it navigates); everything they show comes from the
//! endpoint.
//!
//! # Layout
//!
//! Imports point down this list; the server's state (`crate::state`) holds a
//! [`Console`] and so sits between the two halves:
//!
//! - [`access`]: who may open the console (a leaf: configuration only);
//! - [`history`]: the rings of recent samples (a leaf: no server module);
//! - [`query`]: the page of limits asked for (sort, filter, slice);
//! - this module: [`Console`], the access rule and the history the state holds;
//! - [`owners`]: whose a limit is: a budget's owner, a revoked or expired key's limits;
//! - [`budgets`]: the budgets panel's and the spend chart's documents;
//! - [`view`]: the JSON document of `GET /ui/api/state`, read from the state;
//! - [`directory`]: the tenants and keys panel's document, `GET /ui/api/directory`;
//! - [`routes`]: the page's files, the endpoint and who may call it;
//! - [`sampler`]: the task that fills the history.
//!
//! The page's own files are in `crates/ratelimiterd/ui/`.

pub mod access;
pub mod budgets;
pub mod directory;
pub mod history;
pub mod owners;
pub mod query;
pub mod routes;
pub mod sampler;
pub mod view;

use crate::config::Config;
use crate::console::access::Access;
use crate::console::history::History;

/// The console's state, held by the server's state: who may read it and the
/// history it shows.
pub struct Console {
    access: Access,
    history: History,
}

impl Console {
    /// The console of a configuration.
    pub fn new(config: &Config) -> Self {
        Self {
            access: Access::of(config),
            history: History::default(),
        }
    }

    /// Who may open it.
    pub fn access(&self) -> Access {
        self.access
    }

    /// Its history rings.
    pub fn history(&self) -> &History {
        &self.history
    }
}
