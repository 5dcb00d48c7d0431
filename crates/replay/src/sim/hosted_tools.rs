//! OpenAI's hosted web search in the Responses API, as it is billed: the
//! search reads pages into the model's context, and those tokens are billed as
//! input tokens of the call, beyond anything the request itself holds, so no
//! gateway can bound them before the call. The simulator runs one search per
//! call that offers the tool, and bills its content as OpenAI's pricing page
//! states for `gpt-4o-mini` and `gpt-4.1-mini`: "search content tokens are
//! billed as a fixed block of 8,000 input tokens per call"
//! (<https://platform.openai.com/docs/pricing#built-in-tools>; the tool:
//! <https://platform.openai.com/docs/guides/tools-web-search>). The
//! per-call tool fee on that page is not in `usage` and is not simulated.

use serde_json::{json, Value};

/// The input tokens one web search adds to a call's usage (and bill).
pub const WEB_SEARCH_CONTENT_TOKENS: u64 = 8_000;

/// The tool types that run OpenAI's web search
/// (<https://platform.openai.com/docs/api-reference/responses/create>, `tools`).
const WEB_SEARCH_TYPES: [&str; 3] = ["web_search", "web_search_preview", "web_search_preview_2025_03_11"];

/// Whether a request's `tools` offer the web search.
pub fn offers_web_search(tools: &[Value]) -> bool {
    (tools.iter()).any(|tool| tool["type"].as_str().is_some_and(|t| WEB_SEARCH_TYPES.contains(&t)))
}

/// The output item of one completed search, as the Responses API puts it
/// before the message it informed.
pub fn web_search_call(id_suffix: &str) -> Value {
    json!({
        "type": "web_search_call", "id": format!("ws_{id_suffix}"), "status": "completed",
        "action": {"type": "search", "query": "simulated search"},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_web_search_tools_search() {
        assert!(offers_web_search(&[json!({"type": "web_search"})]));
        assert!(offers_web_search(&[
            json!({"type": "function", "name": "f"}),
            json!({"type": "web_search_preview"})
        ]));
        assert!(!offers_web_search(&[json!({"type": "function", "name": "web_search"})]));
        assert!(!offers_web_search(&[]));
        assert_eq!(web_search_call("x")["type"], "web_search_call");
    }
}
