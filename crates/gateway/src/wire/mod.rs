//! The providers' APIs as the gateway reads and answers them: the endpoints and
//! one parsed request, OpenAI's and Anthropic's formats, server-sent events,
//! usage (from a whole answer, a stream's events, or scanned as an answer
//! passes), and the error shapes the SDKs parse.

pub mod anthropic;
pub mod call;
mod capture;
pub mod content;
pub mod envelope;
pub mod error;
pub mod event_stream;
pub mod format;
pub mod openai;
pub mod response_facts;
pub mod sse;
pub mod usage;
pub mod usage_scan;
