//! Tests of the usage scan (`usage_scan.rs`).

use super::*;
use crate::wire::capture::KEY_BYTES_MAX;
use crate::wire::usage::UsageFields;

fn scan(chunks: &[&[u8]]) -> Option<UsageFields> {
    let mut scanner = UsageScanner::default();
    for chunk in chunks {
        scanner.push(chunk);
    }
    UsageFields::of_answer(&scanner.answer()?)
}

#[test]
fn the_top_level_usage_is_read_across_chunks() {
    let body = br#"{"id":"x","data":[{"embedding":[0.1,-2e3],"usage":{"prompt_tokens":99}}],
        "text":"a \"usage\": {\"prompt_tokens\": 5} }","usage" : {"prompt_tokens":9,"total_tokens":9}}"#;
    for split in 0..body.len() {
        let fields = scan(&[&body[..split], &body[split..]]).expect("read");
        assert_eq!(fields.prompt_tokens, 9, "split at {split}");
    }
    let bytes: Vec<&[u8]> = body.chunks(1).collect();
    assert_eq!(scan(&bytes).unwrap().prompt_tokens, 9);
}

#[test]
fn the_top_level_id_is_read_and_a_nested_or_long_one_is_not() {
    let body = br#"{"id" : "resp_1","output":[{"id":"msg_2"}],"usage":{"input_tokens":3}}"#;
    for split in 0..body.len() {
        let mut scanner = UsageScanner::default();
        scanner.push(&body[..split]);
        scanner.push(&body[split..]);
        assert_eq!(scanner.id().as_deref(), Some("resp_1"), "split at {split}");
        assert!(scanner.answer().is_some());
    }
    let long = format!(r#"{{"id":"{}"}}"#, "x".repeat(ID_BYTES_MAX));
    for body in [
        long.as_bytes(),
        br#"{"id":7}"#,
        br#"{"id":"a","id":"b"}"#,
        br#"{"id":"a""#,
    ] {
        let mut scanner = UsageScanner::default();
        scanner.push(body);
        assert_eq!(scanner.id(), None, "{}", String::from_utf8_lossy(body));
    }
}

#[test]
fn the_top_level_conversation_is_read_and_a_long_one_is_not() {
    let body = br#"{"id":"resp_1","conversation":{"id":"conv_9"},"output":[{"conversation":"x"}]}"#;
    for split in 0..body.len() {
        let mut scanner = UsageScanner::default();
        scanner.push(&body[..split]);
        scanner.push(&body[split..]);
        let conversation = scanner.conversation();
        assert_eq!(
            conversation,
            Some(serde_json::json!({"id": "conv_9"})),
            "split at {split}"
        );
        assert_eq!(scanner.id().as_deref(), Some("resp_1"));
    }
    let long = format!(
        r#"{{"conversation":{{"id":"{}"}}}}"#,
        "x".repeat(CONVERSATION_BYTES_MAX)
    );
    for body in [long.as_bytes(), br#"{"conversation":{"id":"a"}"#, br#"{"id":"a"}"#] {
        let mut scanner = UsageScanner::default();
        scanner.push(body);
        assert_eq!(scanner.conversation(), None, "{}", String::from_utf8_lossy(body));
    }
}

#[test]
fn the_facts_of_each_shape_are_read_across_chunks() {
    let chat = br#"{"id":"chatcmpl-1","model":"gpt-4o-2024","choices":[{"index":0,"message":{"content":"hi"},
        "finish_reason":"stop"},{"index":1,"finish_reason":"length"}],"usage":{"prompt_tokens":1}}"#;
    let responses = br#"{"id":"resp_1","status":"incomplete","model":"gpt-4.1","output":[{"status":"done"}]}"#;
    let anthropic = br#"{"id":"msg_1","type":"message","model":"claude-x","stop_reason":"end_turn"}"#;
    let error = br#"{"type":"error","error":{"type":"overloaded_error","message":"busy"}}"#;
    let expected = [
        (Some("chatcmpl-1"), Some("gpt-4o-2024"), vec!["stop", "length"], None),
        (Some("resp_1"), Some("gpt-4.1"), vec!["incomplete"], None),
        (Some("msg_1"), Some("claude-x"), vec!["end_turn"], None),
        (None, None, vec![], Some("overloaded_error")),
    ];
    for (body, (id, model, reasons, error_type)) in [&chat[..], responses, anthropic, error].into_iter().zip(expected) {
        for split in 0..body.len() {
            let mut scanner = UsageScanner::with_facts();
            scanner.push(&body[..split]);
            scanner.push(&body[split..]);
            let facts = scanner.response_facts().expect("whole");
            assert_eq!(facts.id.as_deref(), id, "split at {split}");
            assert_eq!(facts.model.as_deref(), model);
            assert_eq!(facts.finish_reasons, reasons);
            assert_eq!(facts.error_type.as_deref(), error_type);
        }
    }
    let mut plain = UsageScanner::default();
    plain.push(chat);
    assert_eq!(plain.response_facts(), None, "only when asked");
    let mut cut = UsageScanner::with_facts();
    cut.push(&chat[..40]);
    assert_eq!(cut.response_facts(), None);
}

/// Everything a scanner read, to compare two ways of reading.
fn read_all(scanner: &UsageScanner) -> String {
    format!(
        "{:?} {:?} {:?} {:?} {:?} {:?}",
        scanner.answer(),
        scanner.id(),
        scanner.conversation(),
        scanner.response_facts(),
        scanner.content(),
        scanner.top
    )
}

#[test]
fn skipping_unread_strings_and_copying_read_ones_in_runs_reads_what_byte_by_byte_reads() {
    let bodies: [&[u8]; 7] = [
        br#"{"id":"chatcmpl-1","object":"chat.completion","model":"gpt-4o","choices":[{"index":0,
            "message":{"role":"assistant","content":"say \"finish_reason\": \"x\" \\ ok"},
            "logprobs":null,"finish_reason":"stop"},{"finish_reason":"len\"gth"}],
            "usage":{"prompt_tokens":9,"note":"a \"b\" c"},"conversation":{"id":"conv_\u0031"}}"#,
        br#"{"id":"resp_1","status":"completed","output":[{"type":"message","content":[{"text":"t\\"}]}],
            "usage":{"input_tokens":3,"output_tokens":4}}"#,
        br#"{"type":"error","error":{"type":"overloaded_error","message":"busy \"now\""}}"#,
        br#"{"k\"ey":"v","usage":{"prompt_tokens":1}}"#,
        br#"{"choices":[{"finish_reason":"stop","message":{"content":"}]}"}}],"id":"x"}"#,
        br#"{"id":"a","text":"unterminated"#,
        br#""a bare string""#,
    ];
    for body in bodies {
        reads_alike(body);
    }
    // Escapes past the first bytes of a string read, and of one skipped.
    reads_alike(br#"{"id":"abcdefghijklmnopqrstuvwxyz\"q","text":"0123456789abcdefghij\"k","usage":{"k":"0123456789abcdefghij\\x"}}"#);
    // Values nothing keeps, nested, with numbers, literals and whitespace, and
    // nesting past the deepest followed.
    reads_alike(br#"{ "a" : [1, {"b":[true,null,-2.5e3,{}]} , "x\"]"], "n":12345 ,"usage":{"prompt_tokens":1}}"#);
    let deep = format!(
        r#"{{"a":{}{},"usage":{{"prompt_tokens":1}}}}"#,
        "[".repeat(DEPTH_MAX as usize),
        "]".repeat(DEPTH_MAX as usize)
    );
    let mut scanner = UsageScanner::default();
    scanner.push(deep.as_bytes());
    assert_eq!(
        scanner.finish(),
        None,
        "nesting past the deepest followed reads as no usage"
    );
    let mut bytewise = UsageScanner::default();
    bytewise.push_bytes(deep.as_bytes(), false);
    assert_eq!(read_all(&scanner), read_all(&bytewise));
    let deepest = format!(
        r#"{{"a":{}{},"usage":{{"prompt_tokens":1}}}}"#,
        "[".repeat(DEPTH_MAX as usize - 1),
        "]".repeat(DEPTH_MAX as usize - 1)
    );
    let mut scanner = UsageScanner::default();
    scanner.push(deepest.as_bytes());
    assert!(scanner.finish().is_some(), "the deepest nesting followed");
    // Strings at each reader's bound and one byte past it: a key of 12 and 13
    // bytes, an id and a finish reason of 256 bytes with their quotes and past.
    for extra in [0, 1] {
        let key = "k".repeat(KEY_BYTES_MAX + extra);
        let id = "i".repeat(ID_BYTES_MAX - 2 + extra);
        let reason = "r".repeat(FACT_BYTES_MAX + extra);
        let model = "m".repeat(FACT_BYTES_MAX - 2 + extra);
        let body = format!(
            r#"{{"{key}":1,"id":"{id}","model":"{model}","choices":[{{"finish_reason":"{reason}"}}],"usage":{{"{key}":"{id}"}}}}"#
        );
        reads_alike(body.as_bytes());
    }
}

/// Reading `body` split anywhere, skipping what no reader reads, gives what
/// reading it whole byte by byte gives, for each kind of scanner.
fn reads_alike(body: &[u8]) {
    for make in [
        UsageScanner::default,
        UsageScanner::with_facts,
        UsageScanner::with_content,
    ] {
        let mut bytewise = make();
        bytewise.push_bytes(body, false);
        for split in 0..body.len() {
            let mut skipping = make();
            skipping.push(&body[..split]);
            skipping.push(&body[split..]);
            assert_eq!(
                read_all(&skipping),
                read_all(&bytewise),
                "split at {split} of {}",
                String::from_utf8_lossy(body)
            );
        }
    }
}

#[test]
fn doubt_reads_as_no_usage() {
    for body in [
        &br#"{"usage":{"prompt_tokens":9}"#[..],
        br#"{"usage":{"prompt_tokens":9},"usage":{"prompt_tokens":1}}"#,
        br#"{"usag\u0065":{"prompt_tokens":9}}"#,
        br#"[{"usage":{"prompt_tokens":9}}]"#,
        br#"{"usage":{"prompt_tokens":9}} trailing"#,
        br#"{"choices":[]}"#,
        b"not json",
    ] {
        assert_eq!(scan(&[body]), None, "{}", String::from_utf8_lossy(body));
    }
    let huge = format!(
        r#"{{"usage":{{"pad":"{}","prompt_tokens":9}}}}"#,
        "x".repeat(USAGE_BYTES_MAX)
    );
    assert_eq!(scan(&[huge.as_bytes()]), None);
}

#[test]
fn a_captured_string_is_read_as_serde_json_reads_it() {
    let values: [&[u8]; 12] = [
        br#""chatcmpl-1""#,
        br#" "spaced" "#,
        br#""a\"b""#,
        br#""\u0041""#,
        b"\"raw\ttab\"",
        b"\"\xff\"",
        "\"ünï 名前\"".as_bytes(),
        br#""a" "b""#,
        br#""""#,
        b"12",
        b"null",
        br#"""#,
    ];
    for value in values {
        assert_eq!(
            json_string(value),
            serde_json::from_slice::<String>(value).ok(),
            "{}",
            String::from_utf8_lossy(value)
        );
    }
}
