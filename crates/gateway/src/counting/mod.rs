//! What a call can use at most, counted before it is sent (docs/gateway.md,
//! "Counting"): prompt tokens by the model's encoding, images by their
//! provider's rule, the per-model numbers those rules need, and the byte bound
//! calibrated to the provider's reports.

pub mod calibration;
pub mod images;
pub mod model_table;
pub mod tokens;
