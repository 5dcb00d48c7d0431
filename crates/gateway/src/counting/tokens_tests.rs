//! The counter's tests: equal to tiktoken where the encoding is embedded, never
//! below the provider's count where it is not.

use super::*;
use crate::counting::images::tests::png;
use base64::Engine;
use serde_json::json;

fn o200k() -> Counter {
    Counter::new(Encoding::O200kBase, model_table::lookup("gpt-4o"))
}

fn counter(model: &str) -> Counter {
    Counter::new(
        default_encoding(UpstreamKind::Openai, model),
        model_table::lookup(model),
    )
}

fn png_url(width: u32, height: u32) -> String {
    let data = base64::engine::general_purpose::STANDARD.encode(png(width, height));
    format!("data:image/png;base64,{data}")
}

#[test]
fn texts_match_tiktoken_on_both_encodings() {
    let corpus = [
        "",
        "Hello, world!",
        "the cat sat on the mat",
        "  leading spaces and trailing \n\n",
        "def f(x):\n    return x ** 2  # square\n",
        "日本語のテキストと emoji 🎉🎉 mixed",
        "1234567890 3.14159 -42 0xdeadbeef",
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    ];
    let o200k_ref = tiktoken_rs::o200k_base().unwrap();
    let cl100k_ref = tiktoken_rs::cl100k_base().unwrap();
    let cl100k = Counter::new(Encoding::Cl100kBase, &model_table::UNKNOWN);
    for text in corpus {
        assert_eq!(
            o200k().text(text),
            o200k_ref.encode_ordinary(text).len() as u64,
            "{text:?}"
        );
        assert_eq!(
            cl100k.text(text),
            cl100k_ref.encode_ordinary(text).len() as u64,
            "{text:?}"
        );
    }
}

#[test]
fn standard_roles_are_one_token_in_both_encodings() {
    let encodings = [tiktoken_rs::o200k_base().unwrap(), tiktoken_rs::cl100k_base().unwrap()];
    for role in CHAT_ROLES {
        for encoding in &encodings {
            assert_eq!(encoding.encode_ordinary(role).len() as u64, CHAT_ROLE_TOKENS, "{role}");
        }
    }
    let c = o200k();
    assert_eq!(c.role(&json!("user")), CHAT_ROLE_TOKENS);
    assert_eq!(c.role(&json!("moderator")), c.text("moderator"));
}

#[test]
fn prompt_characters_are_the_prompts_text() {
    let chat = json!({"messages": [{"role": "system", "content": "ab"},
        {"role": "user", "content": [{"type": "text", "text": "日本"}, {"type": "image_url", "image_url": {"url": "x"}}]}]});
    assert_eq!(prompt_characters(&chat), 4);
    let responses = json!({"instructions": "abc", "input": [{"role": "user", "content": "de"}]});
    assert_eq!(prompt_characters(&responses), 5);
    assert_eq!(prompt_characters(&json!({"input": ["ab", "c", [1, 2]]})), 3);
}

#[test]
fn chat_counts_follow_the_cookbook() {
    // The cookbook's figure for this conversation on gpt-4o is 3 + per message
    // (3 + role + content) with the name's extra token.
    let body = json!({"model": "gpt-4o", "messages": [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "name": "bob", "content": "Hi"},
    ]});
    let c = o200k();
    let expected = 3
        + (3 + c.text("system") + c.text("You are helpful."))
        + (3 + c.text("user") + c.text("bob") + 1 + c.text("Hi"));
    assert_eq!(c.openai_chat(&body), Tally::text(expected));
}

#[test]
fn tools_are_counted_conservatively() {
    let c = o200k();
    let plain = json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "look"}]}]});
    let tool = json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}});
    let with_tool = json!({"messages": plain["messages"], "tools": [tool]});
    assert_eq!(
        c.openai_chat(&with_tool).total(),
        c.openai_chat(&plain).total() + c.json(&tool) + TOOL_OVERHEAD_TOKENS
    );
}

#[test]
fn images_count_by_the_models_rule_and_the_size_in_their_header() {
    let chat = |url: &str, detail: &str| {
        json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "look"},
            {"type": "image_url", "image_url": {"url": url, "detail": detail}}]}]})
    };
    let plain = json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "look"}]}]});
    let image_of = |c: &Counter, body: &Value| c.openai_chat(body).total() - c.openai_chat(&plain).total();
    let url = png_url(1024, 1024);
    // gpt-4o: 85 + 4 x 170; gpt-4o-mini: 2,833 + 4 x 5,667 (OpenAI's table).
    assert_eq!(image_of(&counter("gpt-4o"), &chat(&url, "high")), 765);
    assert_eq!(image_of(&counter("gpt-4o-mini"), &chat(&url, "auto")), 25_501);
    assert_eq!(image_of(&counter("gpt-4o-mini"), &chat(&url, "low")), 2_833);
    // gpt-4.1-mini: 1,024 patches x 1.62.
    assert_eq!(image_of(&counter("gpt-4.1-mini"), &chat(&url, "high")), 1_659);
    // By URL: the model's maximum (gpt-4o-mini: 8 tiles), low detail its base.
    let web = "https://example.com/cat.png";
    assert_eq!(image_of(&counter("gpt-4o-mini"), &chat(web, "high")), 2_833 + 8 * 5_667);
    assert_eq!(image_of(&counter("gpt-4o"), &chat(web, "low")), 85);
    // The image counts as a rule, not as text.
    let tally = counter("gpt-4o").openai_chat(&chat(&url, "high"));
    assert_eq!(tally.rules, 765);
    // Responses' input_image: the URL is a string beside `detail`.
    let responses = json!({"input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": url, "detail": "high"}]}]});
    assert_eq!(counter("gpt-4o").openai_responses(&responses).rules, 765);
    // Anthropic: a base64 source; 1000 x 1000 pads to 1008 x 1008, / 750.
    let claude = Counter::new(Encoding::Bytes, model_table::lookup("claude-sonnet-4-5"));
    let data = base64::engine::general_purpose::STANDARD.encode(png(1000, 1000));
    let message = json!({"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}]}]});
    assert_eq!(
        claude.anthropic_messages(&message).rules,
        (1008u64 * 1008).div_ceil(750)
    );
    // An image inside a tool result is an image too.
    let result = json!({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
        "content": [{"type": "image", "source": {"type": "url", "url": web}}]}]}]});
    assert_eq!(claude.anthropic_messages(&result).rules, claude.row.image.max_tokens());
}

#[test]
fn files_audio_documents_and_stored_context_count_by_their_bounds() {
    let mut c = counter("gpt-4o");
    c.file_tokens = 5_000;
    c.stored_context_tokens = 7_000;
    let file = json!({"messages": [{"role": "user", "content": [
        {"type": "file", "file": {"file_id": "file-abc"}},
        {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}]}]});
    assert_eq!(c.openai_chat(&file).rules, 10_000);
    let responses = json!({"previous_response_id": "resp_1", "input": [
        {"role": "user", "content": [{"type": "input_file", "file_id": "file-abc"}]},
        {"type": "item_reference", "id": "msg_1"}]});
    assert_eq!(c.openai_responses(&responses).rules, 5_000 + 7_000 + 7_000);
    let prompt = json!({"prompt": {"id": "pmpt_1", "variables": {"city": "Paris"}}, "conversation": "conv_1"});
    let tally = c.openai_responses(&prompt);
    assert_eq!(tally.rules, 14_000);
    assert!(tally.text >= c.text("Paris"));
    // Without a bound configured, a part is bounded by the context window.
    assert_eq!(counter("gpt-4o").openai_chat(&file).rules, 2 * 128_000);
    let mut claude = Counter::new(Encoding::Bytes, model_table::lookup("claude-sonnet-4-5"));
    claude.file_tokens = 3_000;
    let documents = json!({"messages": [{"role": "user", "content": [
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="}},
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "plain words"}, "title": "T"}]}]});
    let tally = claude.anthropic_messages(&documents);
    assert_eq!(tally.rules, 3_000);
    assert_eq!(tally.text, 8 + "plain words".len() as u64 + 1);
}

#[test]
fn the_reservation_is_calibrated_and_capped_at_the_context_window() {
    let mut c = Counter::new(Encoding::Bytes, model_table::lookup("claude-sonnet-4-5"));
    c.calibrator = Some(Arc::new(Calibrator::default()));
    let tally = Tally {
        text: 4_000,
        rules: 1_000,
    };
    assert_eq!(c.reserve(tally), 5_000, "the byte bound before any sample");
    assert_eq!(c.calibration_sample(tally), None, "a rule-counted part makes no sample");
    assert_eq!(c.calibration_sample(Tally::text(4_000)), Some(4_000));
    for _ in 0..crate::counting::calibration::SAMPLES_MIN {
        c.calibrator.as_ref().unwrap().observe(4_000, 1_000);
    }
    assert_eq!(c.reserve(tally), 1_100 + 1_000, "the text scaled, the rules not");
    assert_eq!(c.reserve(Tally::rule(5_000_000)), 1_000_000, "the context window");
    assert_eq!(
        o200k().calibration_sample(Tally::text(9)),
        None,
        "exact encodings are not calibrated"
    );
}

/// JSON of the shapes requests take: parts with known and unknown types,
/// images, data URLs, nested content.
fn json_value() -> impl proptest::strategy::Strategy<Value = Value> {
    use proptest::prelude::*;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        "[a-z :/;,=.+]{0,40}".prop_map(Value::String),
        Just(json!("image_url")),
        Just(json!("input_image")),
        Just(json!("document")),
        Just(json!("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAAB")),
    ];
    let key = prop_oneof![
        Just("type".to_owned()),
        Just("content".to_owned()),
        Just("image_url".to_owned()),
        Just("source".to_owned()),
        Just("text".to_owned()),
        Just("detail".to_owned()),
        Just("data".to_owned()),
        "[a-z]{1,6}",
    ];
    leaf.prop_recursive(4, 64, 6, move |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::btree_map(key.clone(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(1_000))]

    /// Any content in any field: a count, never a panic, never above the
    /// context window once reserved.
    #[test]
    fn any_request_is_counted_without_panic(value in json_value()) {
        let body = json!({"messages": [{"role": "user", "content": value.clone()}, value.clone()],
            "input": value.clone(), "system": value.clone(), "tools": value.clone(), "prompt": value});
        for model in ["gpt-4o-mini", "gpt-4.1-mini", "claude-sonnet-4-5"] {
            let mut c = counter(model);
            c.calibrator = Some(Arc::new(Calibrator::default()));
            for tally in [c.openai_chat(&body), c.openai_responses(&body), c.anthropic_messages(&body)] {
                proptest::prop_assert!(c.reserve(tally) <= c.row.context_window_tokens);
            }
        }
    }
}

#[test]
fn embeddings_are_exact() {
    let c = o200k();
    assert_eq!(c.openai_embeddings(&json!("hello world")), 2);
    assert_eq!(c.openai_embeddings(&json!(["hello", "hello world"])), 3);
    assert_eq!(c.openai_embeddings(&json!([1, 2, 3])), 3);
    assert_eq!(c.openai_embeddings(&json!([[1, 2], [3]])), 3);
}

#[test]
fn the_claude_estimate_is_never_below_any_bpe_count() {
    let bytes = Counter::new(Encoding::Bytes, model_table::lookup("claude"));
    let body = json!({"system": "Be brief.", "messages": [{"role": "user", "content": "Count me: 日本語"}]});
    let estimate = bytes.anthropic_messages(&body);
    assert!(estimate.total() >= o200k().anthropic_messages(&body).total());
    assert_eq!(estimate, Tally::text(9 + 8 + "Count me: 日本語".len() as u64));
}

#[test]
fn output_defaults_come_from_the_table_unless_configured() {
    let config: ModelConfig = serde_yaml::from_str("{name: gpt-4o-mini, upstream: u}").unwrap();
    assert_eq!(output_default(&config), 16_384);
    let config: ModelConfig = serde_yaml::from_str("{name: my-llama, upstream: u}").unwrap();
    assert_eq!(output_default(&config), model_table::UNKNOWN.max_output_tokens);
    let config: ModelConfig =
        serde_yaml::from_str("{name: gpt-4o-mini, upstream: u, max_output_tokens_default: 500}").unwrap();
    assert_eq!(output_default(&config), 500);
    let counter = Counter::for_model(UpstreamKind::Openai, &config);
    assert_eq!(
        (counter.output_default_tokens, counter.calibrator.is_none()),
        (500, true)
    );
    let claude: ModelConfig = serde_yaml::from_str("{name: claude-haiku-4-5, upstream: u}").unwrap();
    assert!(Counter::for_model(UpstreamKind::Anthropic, &claude)
        .calibrator
        .is_some());
}

#[test]
fn bounds_larger_than_a_limit_are_named() {
    let config: ModelConfig =
        serde_yaml::from_str("{name: gpt-4.1, upstream: u, tpm: 30000, stored_context_tokens: 20000}").unwrap();
    let counter = Counter::for_model(UpstreamKind::Openai, &config);
    // A part's bound is named only when the operator set it: the file bound
    // left at the context window is met by file calls alone, whose 400 names it.
    assert_eq!(
        counter.bounds_above_limits(&config, UpstreamKind::Openai),
        [("max_output_tokens_default", 32_768, 30_000)]
    );
    let files: ModelConfig =
        serde_yaml::from_str("{name: gpt-4.1, upstream: u, tpm: 30000, file_tokens: 40000}").unwrap();
    assert_eq!(
        Counter::for_model(UpstreamKind::Openai, &files).bounds_above_limits(&files, UpstreamKind::Openai),
        [
            ("file_tokens", 40_000, 30_000),
            ("max_output_tokens_default", 32_768, 30_000)
        ]
    );
    let open: ModelConfig = serde_yaml::from_str("{name: gpt-4.1, upstream: u}").unwrap();
    assert!(
        counter.bounds_above_limits(&open, UpstreamKind::Openai).is_empty(),
        "no limit, nothing to exceed"
    );
}

#[test]
fn an_anthropic_model_is_warned_only_of_the_bounds_its_calls_use() {
    // Tier-1 Claude Sonnet: its context window is above every limit.
    let config: ModelConfig =
        serde_yaml::from_str("{name: claude-sonnet-4-5, upstream: u, input_tpm: 30000, output_tpm: 8000}").unwrap();
    let counter = Counter::for_model(UpstreamKind::Anthropic, &config);
    // Messages calls always name max_tokens and never continue stored context;
    // a PDF document is counted at file_tokens, which the operator did not set:
    // a model with its limits alone starts without a warning.
    assert!(counter.bounds_above_limits(&config, UpstreamKind::Anthropic).is_empty());
    let sized: ModelConfig = serde_yaml::from_str(
        "{name: claude-sonnet-4-5, upstream: u, input_tpm: 30000, output_tpm: 8000, file_tokens: 20000, stored_context_tokens: 40000}",
    )
    .unwrap();
    let counter = Counter::for_model(UpstreamKind::Anthropic, &sized);
    assert!(counter.bounds_above_limits(&sized, UpstreamKind::Anthropic).is_empty());
    // On an OpenAI-compatible upstream the same bounds are all counted at.
    let fields: Vec<_> = (counter
        .bounds_above_limits(&sized, UpstreamKind::OpenaiCompatible)
        .into_iter())
    .map(|(field, _, _)| field)
    .collect();
    assert_eq!(fields, ["stored_context_tokens", "max_output_tokens_default"]);
}

#[test]
fn encodings_follow_the_model_name() {
    assert_eq!(
        default_encoding(UpstreamKind::Openai, "gpt-4o-mini"),
        Encoding::O200kBase
    );
    assert_eq!(
        default_encoding(UpstreamKind::Openai, "gpt-4-turbo"),
        Encoding::Cl100kBase
    );
    assert_eq!(
        default_encoding(UpstreamKind::Openai, "text-embedding-3-small"),
        Encoding::Cl100kBase
    );
    assert_eq!(
        default_encoding(UpstreamKind::OpenaiCompatible, "llama-3"),
        Encoding::Bytes
    );
    assert_eq!(default_encoding(UpstreamKind::Anthropic, "gpt-4o"), Encoding::Bytes);
}
