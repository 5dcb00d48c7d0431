//! The interfaces of a limiter (lib.rs, "Layout"): the `Limiter` and `Backend`
//! traits, the fleet's shared alert claims and handed ids, and the runtime
//! changes of definitions on top of a backend. Backends implement them from
//! the layers above.

pub mod admin;
pub mod alert_claims;
pub mod handed_ids;
pub mod limiter;
