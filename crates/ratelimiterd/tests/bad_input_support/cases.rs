//! The bad requests of each endpoint with their documented answers: the
//! malformed bodies every JSON endpoint refuses, then each endpoint's own.

use super::{case, lease, reserve_text, Case};

/// Bodies no JSON endpoint accepts, for every endpoint alike.
fn malformed_bodies(path: &str, valid: &str) -> Vec<Case> {
    let mut cases = vec![
        case("empty body", path, "", 400, "invalid_json: "),
        case("one brace", path, "{", 400, "invalid_json: "),
        case(
            "half a valid body",
            path,
            &valid[..valid.len() / 2],
            400,
            "invalid_json: ",
        ),
        case(
            "valid body minus its last byte",
            path,
            &valid[..valid.len() - 1],
            400,
            "invalid_json: ",
        ),
        case("trailing garbage", path, format!("{valid}x"), 400, "invalid_json: "),
        case("two bodies", path, format!("{valid}{valid}"), 400, "invalid_json: "),
        case(
            "byte order mark",
            path,
            format!("\u{feff}{valid}"),
            400,
            "invalid_json: ",
        ),
        case("single quotes", path, valid.replace('"', "'"), 400, "invalid_json: "),
        case("not JSON", path, "lease_id=1", 400, "invalid_json: "),
        case("NUL bytes", path, vec![0u8; 64], 400, "invalid_json: "),
        case("invalid UTF-8", path, b"\xff\xfe\xfd".to_vec(), 400, "invalid_json: "),
        // Deep nesting is valid JSON of the wrong shape, and must not overflow a stack.
        case(
            "10,000 nested arrays",
            path,
            "[".repeat(10_000) + &"]".repeat(10_000),
            400,
            "invalid_request: ",
        ),
        case(
            "10,000 unclosed arrays",
            path,
            "[".repeat(10_000),
            400,
            "invalid_json: ",
        ),
        case(
            "10,000 nested objects",
            path,
            r#"{"a":"#.repeat(10_000) + "1" + &"}".repeat(10_000),
            400,
            "invalid_request: ",
        ),
        case("null", path, "null", 400, "invalid_request: "),
        case("a number", path, "42", 400, "invalid_request: "),
        case("a string", path, r#""{}""#, 400, "invalid_request: "),
        case("an array", path, format!("[{valid}]"), 400, "invalid_request: "),
        case("an empty object", path, "{}", 400, "invalid_request: "),
        case(
            "an unknown field",
            path,
            format!(r#"{{"zzz":1,{}"#, &valid[1..]),
            400,
            "invalid_request: ",
        ),
    ];
    // Every prefix of a valid body is truncated JSON.
    for cut in (1..valid.len()).step_by(7) {
        cases.push(case(
            format!("truncated at {cut}"),
            path,
            &valid[..cut],
            400,
            "invalid_json: ",
        ));
    }
    cases
}

/// The reserve endpoint's bad requests, for lease `l` (never burnt by them) on
/// the rolling key `rolling`.
pub fn reserve(l: &str, rolling: &str) -> Vec<Case> {
    let path = "/v1/reserve";
    let valid = reserve_text(l, &format!(r#"[{{"key":"{rolling}","amount":1}}]"#));
    let mut cases = malformed_bodies(path, &valid);
    let with = |requirements: &str| reserve_text(l, requirements);
    let req = |amount: &str| with(&format!(r#"[{{"key":"{rolling}","amount":{amount}}}]"#));
    let keyed = |key: &str| with(&format!(r#"[{{"key":{key},"amount":1}}]"#));
    let many: Vec<String> = (0..33).map(|i| format!(r#"{{"key":"k{i}","amount":1}}"#)).collect();
    let mut invalid_utf8_key = format!(r#"{{"lease_id":"{l}","requirements":[{{"key":"bad"#).into_bytes();
    invalid_utf8_key.extend_from_slice(b"\xc3\x28\"");
    invalid_utf8_key.extend_from_slice(br#","amount":1}]}"#);
    cases.extend([
        case("amount as a string", path, req(r#""1""#), 400, "invalid_request: "),
        case("amount as a float", path, req("1.5"), 400, "invalid_request: "),
        case("amount as an exponent", path, req("1e3"), 400, "invalid_request: "),
        case("amount true", path, req("true"), 400, "invalid_request: "),
        case("amount null", path, req("null"), 400, "invalid_request: "),
        case("amount 0", path, req("0"), 400, "invalid_request: "),
        case("amount -0", path, req("-0"), 400, "invalid_request: "),
        case("amount -1", path, req("-1"), 400, "invalid_request: "),
        case(
            "amount i64::MIN",
            path,
            req("-9223372036854775808"),
            400,
            "invalid_request: ",
        ),
        case(
            "amount u64::MAX + 1",
            path,
            req("18446744073709551616"),
            400,
            "invalid_request: ",
        ),
        case("amount 1e30", path, req("1e30"), 400, "invalid_request: "),
        // Numbers past f64's range are refused by the JSON parser itself.
        case(
            "amount of 400 digits",
            path,
            req(&"9".repeat(400)),
            400,
            "invalid_json: ",
        ),
        case("amount 1e400 (past f64)", path, req("1e400"), 400, "invalid_json: "),
        case("no requirements", path, with("[]"), 400, "invalid_request: "),
        case(
            "33 requirements",
            path,
            with(&format!("[{}]", many.join(","))),
            400,
            "invalid_request: ",
        ),
        case(
            "requirements as an object",
            path,
            with(r#"{"key":"a","amount":1}"#),
            400,
            "invalid_request: ",
        ),
        case("requirements null", path, with("null"), 400, "invalid_request: "),
        case(
            "no lease_id",
            path,
            format!(r#"{{"requirements":[{{"key":"{rolling}","amount":1}}]}}"#),
            400,
            "invalid_request: ",
        ),
        case(
            "lease_id a number",
            path,
            valid.replace(&format!("\"{l}\""), "7"),
            400,
            "invalid_request: ",
        ),
        case(
            "lease_id not a ULID",
            path,
            valid.replace(l, "not-a-ulid"),
            400,
            "invalid_request: ",
        ),
        case(
            "lease_id 25 characters",
            path,
            valid.replace(l, &l[..25]),
            400,
            "invalid_request: ",
        ),
        case(
            "lease_id past 128 bits",
            path,
            valid.replace(l, "8ZZZZZZZZZZZZZZZZZZZZZZZZZ"),
            400,
            "invalid_request: ",
        ),
        case(
            "lease_id with a U",
            path,
            valid.replace(l, &format!("{}U", &l[..25])),
            400,
            "invalid_request: ",
        ),
        case("key a number", path, keyed("1"), 400, "invalid_request: "),
        case("key empty", path, keyed(r#""""#), 400, "invalid_request: "),
        case("key with a space", path, keyed(r#""a b""#), 400, "invalid_request: "),
        case("key with a NUL", path, keyed(r#""a\u0000b""#), 400, "invalid_request: "),
        case("key non-ASCII", path, keyed(r#""clé""#), 400, "invalid_request: "),
        case(
            "key of 257 bytes",
            path,
            keyed(&format!("\"{}\"", "k".repeat(257))),
            400,
            "invalid_request: ",
        ),
        case(
            "key of 60 KiB",
            path,
            keyed(&format!("\"{}\"", "k".repeat(60 * 1024))),
            400,
            "invalid_request: ",
        ),
        case(
            "key with a lone surrogate",
            path,
            keyed(r#""\ud800""#),
            400,
            "invalid_json: ",
        ),
        case("key with invalid UTF-8", path, invalid_utf8_key, 400, "invalid_json: "),
        case(
            "duplicate key in requirements",
            path,
            with(&format!(
                r#"[{{"key":"{rolling}","amount":1}},{{"key":"{rolling}","amount":2}}]"#
            )),
            400,
            "invalid_request: ",
        ),
        case(
            "duplicate JSON field lease_id",
            path,
            format!(
                r#"{{"lease_id":"{l}","lease_id":"{}","requirements":[{{"key":"{rolling}","amount":1}}]}}"#,
                lease()
            ),
            400,
            "invalid_request: ",
        ),
        case(
            "duplicate JSON field amount",
            path,
            with(&format!(r#"[{{"key":"{rolling}","amount":1,"amount":2}}]"#)),
            400,
            "invalid_request: ",
        ),
        case(
            "unknown field in a requirement",
            path,
            with(&format!(r#"[{{"key":"{rolling}","amount":1,"units":"x"}}]"#)),
            400,
            "invalid_request: ",
        ),
        case(
            "job_id of 129 bytes",
            path,
            format!(
                r#"{{"lease_id":"{l}","job_id":"{}","requirements":[{{"key":"{rolling}","amount":1}}]}}"#,
                "j".repeat(129)
            ),
            400,
            "invalid_request: ",
        ),
        case(
            "job_id a number",
            path,
            format!(r#"{{"lease_id":"{l}","job_id":5,"requirements":[{{"key":"{rolling}","amount":1}}]}}"#),
            400,
            "invalid_request: ",
        ),
        case(
            "a body past body_bytes_max",
            path,
            format!(r#"{{"pad":"{}"}}"#, "x".repeat(70 * 1024)),
            413,
            "payload_too_large: ",
        ),
    ]);
    cases
}

/// The complete endpoint's bad requests, for the live lease `holder` with
/// units on the rolling key `rolling` and the concurrency key `inflight`.
pub fn complete(holder: &str, rolling: &str, inflight: &str) -> Vec<Case> {
    let path = "/v1/complete";
    let valid = format!(r#"{{"lease_id":"{holder}","actuals":[{{"key":"{rolling}","actual_amount":3}}]}}"#);
    let mut cases = malformed_bodies(path, &valid);
    let actuals = |actuals: &str| format!(r#"{{"lease_id":"{holder}","actuals":{actuals}}}"#);
    let amount = |a: &str| actuals(&format!(r#"[{{"key":"{rolling}","actual_amount":{a}}}]"#));
    let many: Vec<String> = (0..33)
        .map(|i| format!(r#"{{"key":"k{i}","actual_amount":1}}"#))
        .collect();
    cases.extend([
        case("actual -1", path, amount("-1"), 400, "invalid_request: "),
        case("actual 1.5", path, amount("1.5"), 400, "invalid_request: "),
        case("actual a string", path, amount(r#""3""#), 400, "invalid_request: "),
        case(
            "actual u64::MAX + 1",
            path,
            amount("18446744073709551616"),
            400,
            "invalid_request: ",
        ),
        case("actual null", path, amount("null"), 400, "invalid_request: "),
        case(
            "actuals an object",
            path,
            actuals(r#"{"key":"a"}"#),
            400,
            "invalid_request: ",
        ),
        case(
            "33 actuals",
            path,
            actuals(&format!("[{}]", many.join(","))),
            400,
            "invalid_request: ",
        ),
        case(
            "duplicate actual keys",
            path,
            actuals(&format!(
                r#"[{{"key":"{rolling}","actual_amount":1}},{{"key":"{rolling}","actual_amount":2}}]"#
            )),
            400,
            "invalid_request: ",
        ),
        case(
            "duplicate JSON field actual_amount",
            path,
            actuals(&format!(
                r#"[{{"key":"{rolling}","actual_amount":1,"actual_amount":2}}]"#
            )),
            400,
            "invalid_request: ",
        ),
        case(
            "unknown field in an actual",
            path,
            actuals(&format!(r#"[{{"key":"{rolling}","actual_amount":1,"x":1}}]"#)),
            400,
            "invalid_request: ",
        ),
        case("no lease_id", path, r#"{"actuals":[]}"#, 400, "invalid_request: "),
        case(
            "lease_id not a ULID",
            path,
            valid.replace(holder, "nope"),
            400,
            "invalid_request: ",
        ),
        case(
            "an actual for a key the lease did not reserve",
            path,
            actuals(r#"[{"key":"bad:other","actual_amount":1}]"#),
            400,
            "invalid_request: ",
        ),
        case(
            "an actual for a concurrency key",
            path,
            actuals(&format!(r#"[{{"key":"{inflight}","actual_amount":1}}]"#)),
            400,
            "invalid_request: ",
        ),
        case(
            "one bad actual among good ones",
            path,
            actuals(&format!(
                r#"[{{"key":"{rolling}","actual_amount":0}},{{"key":"{inflight}","actual_amount":1}}]"#
            )),
            400,
            "invalid_request: ",
        ),
        case(
            "a body past body_bytes_max",
            path,
            format!(r#"{{"pad":"{}"}}"#, "x".repeat(70 * 1024)),
            413,
            "payload_too_large: ",
        ),
    ]);
    cases
}

/// The limits API's bad PUTs of the undefined key `new_key` (and of the
/// existing rolling key `rolling`), then its bad GETs.
pub fn admin(new_key: &str, rolling: &str) -> Vec<Case> {
    let path = "/v1/admin/limits";
    let valid = &format!(r#"{{"key":"{new_key}","kind":"rolling","capacity":5,"window_seconds":60}}"#);
    let mut cases = malformed_bodies(path, valid);
    let def = |fields: &str| format!(r#"{{"key":"{new_key}",{fields}}}"#);
    cases.extend([
        case(
            "capacity 0",
            path,
            def(r#""kind":"rolling","capacity":0,"window_seconds":60"#),
            400,
            "invalid_request: ",
        ),
        case(
            "capacity -1",
            path,
            def(r#""kind":"rolling","capacity":-1,"window_seconds":60"#),
            400,
            "invalid_request: ",
        ),
        case(
            "capacity 2^64",
            path,
            def(r#""kind":"rolling","capacity":18446744073709551616,"window_seconds":60"#),
            400,
            "invalid_request: ",
        ),
        case(
            "capacity a string",
            path,
            def(r#""kind":"rolling","capacity":"5","window_seconds":60"#),
            400,
            "invalid_request: ",
        ),
        case(
            "capacity 1.5",
            path,
            def(r#""kind":"rolling","capacity":1.5,"window_seconds":60"#),
            400,
            "invalid_request: ",
        ),
        case(
            "window 0",
            path,
            def(r#""kind":"rolling","capacity":5,"window_seconds":0"#),
            400,
            "invalid_request: ",
        ),
        case(
            "window 31 days + 1 s",
            path,
            def(r#""kind":"rolling","capacity":5,"window_seconds":2678401"#),
            400,
            "invalid_request: ",
        ),
        case(
            "rolling with a timeout",
            path,
            def(r#""kind":"rolling","capacity":5,"window_seconds":60,"timeout_seconds":5"#),
            400,
            "invalid_request: ",
        ),
        case(
            "concurrency timeout 0",
            path,
            def(r#""kind":"concurrency","capacity":5"#),
            400,
            "invalid_request: ",
        ),
        case(
            "concurrency timeout past a day",
            path,
            def(r#""kind":"concurrency","capacity":5,"timeout_seconds":86401"#),
            400,
            "invalid_request: ",
        ),
        case(
            "unknown kind",
            path,
            def(r#""kind":"leaky","capacity":5,"window_seconds":60"#),
            400,
            "invalid_request: ",
        ),
        case(
            "unknown overage",
            path,
            def(r#""kind":"rolling","capacity":5,"window_seconds":60,"overage":"maybe""#),
            400,
            "invalid_request: ",
        ),
        case(
            "unit of 65 bytes",
            path,
            def(&format!(
                r#""kind":"rolling","capacity":5,"window_seconds":60,"unit":"{}""#,
                "u".repeat(65)
            )),
            400,
            "invalid_request: ",
        ),
        case(
            "description of 1025 bytes",
            path,
            def(&format!(
                r#""kind":"rolling","capacity":5,"window_seconds":60,"description":"{}""#,
                "d".repeat(1025)
            )),
            400,
            "invalid_request: ",
        ),
        case(
            "a status field",
            path,
            def(r#""kind":"rolling","capacity":5,"window_seconds":60,"status":"active""#),
            400,
            "invalid_request: ",
        ),
        case(
            "duplicate capacity",
            path,
            def(r#""kind":"rolling","capacity":5,"capacity":6,"window_seconds":60"#),
            400,
            "invalid_request: ",
        ),
        case(
            "no kind",
            path,
            def(r#""capacity":5,"window_seconds":60"#),
            400,
            "invalid_request: ",
        ),
        case(
            "bad key",
            path,
            r#"{"key":"a b","kind":"rolling","capacity":5,"window_seconds":60}"#,
            400,
            "invalid_request: ",
        ),
        case(
            "key of 257 bytes",
            path,
            format!(
                r#"{{"key":"{}","kind":"rolling","capacity":5,"window_seconds":60}}"#,
                "k".repeat(257)
            ),
            400,
            "invalid_request: ",
        ),
        case(
            "kind change",
            path,
            format!(r#"{{"key":"{rolling}","kind":"concurrency","capacity":5,"timeout_seconds":60}}"#),
            409,
            "conflict: ",
        ),
        case(
            "a body past body_bytes_max",
            path,
            format!(r#"{{"pad":"{}"}}"#, "x".repeat(70 * 1024)),
            413,
            "payload_too_large: ",
        ),
    ]);
    let get = |what: &str, key: &str, status: u16, code: &'static str| Case {
        what: what.to_owned(),
        method: "GET",
        path: format!("/v1/admin/limits/{key}"),
        body: Vec::new(),
        status,
        code,
    };
    cases.extend([
        get("GET an unknown key", "bad:none", 404, "unknown_limit_key: bad:none"),
        get("GET a key with an escaped space", "a%20b", 400, "invalid_request: "),
        get("GET a key of 257 bytes", &"k".repeat(257), 400, "invalid_request: "),
        get("GET a path of 8 KiB", &"k/".repeat(4096), 400, "invalid_request: "),
        get("GET a key escaping invalid UTF-8", "a%FFb", 400, "invalid_request: "),
        get("GET a key escaping NUL", "a%00b", 400, "invalid_request: "),
        get("GET a key with a bad escape", "a%zzb", 400, "invalid_request: "),
    ]);
    cases
}
