//! Whether a call goes now, waits, or is refused (docs/gateway.md, "Waiting"):
//! the served model's entry, the per-call context, the admission (at once, or
//! in the model's fair queue), the tenants' caps, the call's lease from its
//! grant to its complete, what it completed as, and the spend it records then.

pub mod admit;
pub mod budget;
pub mod completed;
pub mod context;
pub mod entry;
pub mod lease;
pub mod queue;
pub mod spend;
pub mod tenant_caps;

pub use admit::Admission;
pub use completed::Completed;
pub use context::CallContext;
pub use entry::{Caller, ModelEntry};
pub use lease::{CallLease, Settle};
