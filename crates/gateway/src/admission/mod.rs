//! Whether a call goes now, waits, or is refused (docs/gateway.md, "Waiting"):
//! the served model's entry, the per-call context, the admission (at once, or
//! in the model's fair queue), the tenants' caps, and the call's lease from its
//! grant to its complete.

pub mod admit;
pub mod budget;
pub mod context;
pub mod entry;
pub mod lease;
pub mod queue;
pub mod tenant_caps;

pub use admit::Admission;
pub use context::CallContext;
pub use entry::{Caller, ModelEntry};
pub use lease::{CallLease, Completed, Settle};
