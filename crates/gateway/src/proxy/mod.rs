//! The HTTP side (docs/gateway.md): the gateway built from its configuration,
//! the service and its routes, the client's body, forwarding to a deployment
//! and failing over, the answer passed back over one upstream-body reader, the
//! upstream client, the headers that cross, the tenants' keys, and the
//! callers of the directory's keys.

pub mod answer;
pub mod auth;
pub mod body;
pub mod connector;
pub mod conversations;
pub mod credentials;
pub mod forward;
pub mod gateway;
pub mod headers;
pub mod key_callers;
pub mod origin;
pub mod prices;
pub mod response_ids;
pub mod service;
pub mod service_account;
pub mod upstream;
pub mod vertex_token;

pub use gateway::Gateway;
pub use service::router;
