//! What a provider's answers teach a limiter (lib.rs, "Layout"): its rate-limit
//! headers compared with the definitions, and the pause of a model's keys after
//! a 429. Above the backends, whose memory backend their tests run against.

pub mod pause;
pub mod provider_headers;
