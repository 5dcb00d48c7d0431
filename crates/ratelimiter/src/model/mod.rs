//! The limit model (lib.rs, "Layout"): keys, owners, the reserve and complete
//! wire types, definitions and their bucket arithmetic, errors, the decisions
//! both backends make the same way, the registry file and retry hints. It
//! imports only the primitives.

pub mod bucket;
pub mod decision;
pub mod definition;
pub mod error;
pub mod key;
pub mod owner;
pub mod registry;
pub mod retry;
pub mod wire;
