//! Each provider's profile: its definitions, what a call reserves and what it completes with.

use super::*;
use crate::model::definition::LimitDefinition;
use crate::model::definition::LimitKind;
use crate::model::key::LimitKey;

fn shape(profile: &LlmProfile) -> Vec<(String, u64, u64, Option<u64>)> {
    (profile.definitions.iter())
        .map(|d| {
            (
                d.key().as_str().to_owned(),
                d.capacity(),
                d.window_seconds(),
                d.window_margin_ms(),
            )
        })
        .collect()
}

fn kinds(profile: &LlmProfile) -> Vec<LimitKind> {
    profile.definitions.iter().map(LimitDefinition::kind).collect()
}

#[test]
fn only_anthropic_uses_buckets_the_others_enforce_windows() {
    let numbers = Published {
        input_tpm: Some(30_000),
        output_tpm: Some(8_000),
        rpd: Some(10_000),
        ..published(500, 30_000)
    };
    for provider in Provider::ALL {
        let profile = llm_profile(provider.as_str(), "m", &numbers).unwrap();
        let expected = match provider {
            Provider::Anthropic => LimitKind::Bucket,
            _ => LimitKind::Rolling,
        };
        assert!(
            kinds(&profile).iter().all(|kind| *kind == expected),
            "{provider:?}: {:?}",
            kinds(&profile)
        );
    }
    // A published figure too small to keep a burst is a clear error, not a limit
    // that can never grant.
    let tiny = Published {
        rpm: Some(1),
        ..numbers
    };
    let refused = llm_profile("anthropic", "m", &tiny).unwrap_err();
    assert!(refused.to_string().contains("keeps no burst"), "{refused}");
}

fn published(rpm: u64, tpm: u64) -> Published {
    Published {
        rpm: Some(rpm),
        tpm: Some(tpm),
        ..Published::default()
    }
}

fn owned(rows: &[(&str, u64, u64, Option<u64>)]) -> Vec<(String, u64, u64, Option<u64>)> {
    rows.iter().map(|&(k, c, w, m)| (k.to_owned(), c, w, m)).collect()
}

#[test]
fn openai_quantizes_to_a_second_and_grows_the_token_window_to_the_largest_request() {
    // OpenAI tier 1 gpt-4o-mini: 500 RPM, 200,000 TPM. "60,000 requests/minute may be
    // enforced as 1,000 requests/second": 500 RPM is 8 a second (rounded down);
    // 200,000 TPM is 3,333 a second, below a 16,384-token request: 5 s hold 16,666.
    let profile = llm_profile("openai", "gpt-4o-mini", &published(500, 200_000)).unwrap();
    assert_eq!(
        shape(&profile),
        owned(&[
            ("global:llm:openai:gpt-4o-mini:rpm", 8, 1, Some(10)),
            ("global:llm:openai:gpt-4o-mini:tpm", 16_666, 5, Some(50)),
        ])
    );
    // 30,000 RPM and 150,000,000 TPM: a second holds both.
    let big = llm_profile("openai", "gpt-4o", &published(30_000, 150_000_000)).unwrap();
    assert_eq!(
        shape(&big)[0],
        ("global:llm:openai:gpt-4o:rpm".to_owned(), 500, 1, Some(10))
    );
    assert_eq!(shape(&big)[1].1, 2_500_000);
    // 3 RPM: a second holds none; 20 s hold one.
    let tiny = llm_profile("openai", "o1", &published(3, 1_000_000)).unwrap();
    assert_eq!(
        shape(&tiny)[0],
        ("global:llm:openai:o1:rpm".to_owned(), 1, 20, Some(200))
    );
}

#[test]
fn openai_reserves_its_estimate_plus_max_tokens_and_keeps_it() {
    let profile = llm_profile("openai", "gpt-4o", &published(500, 30_000)).unwrap();
    let call = ProfileCall {
        prompt: &"word ".repeat(100), // 500 characters: OpenAI estimates 125 tokens.
        prompt_tokens: Some(100),
        cache_read_tokens: 0,
        max_output_tokens: 400,
        best_of: 1,
    };
    let amounts: Vec<u64> = profile.rules.requirements(&call).iter().map(|r| r.amount).collect();
    assert_eq!(amounts, [1, 525], "not the smaller exact count");
    let usage = ProviderUsage {
        input_tokens: 100,
        output_tokens: 3,
    };
    let actuals = profile.rules.actuals(&call, &usage);
    assert_eq!(actuals[0].actual_amount, 525, "OpenAI still counts its estimate");
}

#[test]
fn a_counted_prompt_is_charged_at_least_openais_character_estimate() {
    let rules = |provider: &str| {
        let mut numbers = published(500, 30_000);
        numbers.input_tpm = Some(30_000);
        numbers.output_tpm = Some(8_000);
        llm_profile(provider, "m", &numbers).unwrap().rules
    };
    for provider in ["openai", "azure"] {
        // 400 characters the tokenizer packs into 50 tokens: OpenAI counts 100.
        assert_eq!(rules(provider).counted_prompt_charge(50, 400), 100, "{provider}");
        assert_eq!(rules(provider).counted_prompt_charge(150, 400), 150, "{provider}");
        assert_eq!(rules(provider).counted_prompt_charge(0, 1), 1, "{provider}: rounds up");
    }
    assert_eq!(
        rules("anthropic").counted_prompt_charge(50, 400),
        50,
        "counts tokens only"
    );
}

#[test]
fn azure_derives_rpm_from_tpm_and_reserves_best_of() {
    // Azure: "6 RPM per 1000 TPM"; 100,000 TPM gives 600 RPM, "10 requests per
    // 1-second period"; tokens are counted per minute.
    let profile = llm_profile(
        "azure",
        "gpt-4o",
        &Published {
            tpm: Some(100_000),
            ..Published::default()
        },
    )
    .unwrap();
    assert_eq!(
        shape(&profile),
        owned(&[
            ("global:llm:azure:gpt-4o:rpm", 10, 1, Some(10)),
            ("global:llm:azure:gpt-4o:tpm", 100_000, 60, None),
        ])
    );
    let call = ProfileCall {
        prompt: "abcdefgh",
        prompt_tokens: None,
        cache_read_tokens: 0,
        max_output_tokens: 100,
        best_of: 3,
    };
    assert_eq!(profile.rules.requirements(&call)[1].amount, 302);
}

#[test]
fn anthropic_splits_input_and_output_and_reconciles_each() {
    // Anthropic tier 4 Claude Sonnet: 4,000 RPM, 2,000,000 ITPM, 400,000 OTPM.
    let profile = llm_profile(
        "anthropic",
        "claude-sonnet-4",
        &Published {
            rpm: Some(4_000),
            input_tpm: Some(2_000_000),
            output_tpm: Some(400_000),
            concurrency: Some(32),
            ..Published::default()
        },
    )
    .unwrap();
    assert_eq!(
        shape(&profile),
        owned(&[
            ("global:llm:anthropic:claude-sonnet-4:rpm", 4_000, 60, None),
            ("global:llm:anthropic:claude-sonnet-4:itpm", 2_000_000, 60, None),
            ("global:llm:anthropic:claude-sonnet-4:otpm", 400_000, 60, None),
            ("global:llm:anthropic:claude-sonnet-4:concurrency", 32, 0, None),
        ])
    );
    // Anthropic enforces token buckets: its three published limits are buckets.
    assert_eq!(
        kinds(&profile),
        [
            LimitKind::Bucket,
            LimitKind::Bucket,
            LimitKind::Bucket,
            LimitKind::Concurrency
        ]
    );
    let call = ProfileCall {
        prompt: "",
        prompt_tokens: Some(10_000),
        cache_read_tokens: 9_000,
        max_output_tokens: 1_000,
        best_of: 1,
    };
    let got: Vec<(String, u64)> = (profile.rules.requirements(&call).iter())
        .map(|r| (r.key.as_str().rsplit(':').next().unwrap().to_owned(), r.amount))
        .collect();
    let expected: Vec<(String, u64)> = [("rpm", 1), ("itpm", 1_000), ("otpm", 1_000), ("concurrency", 1)]
        .iter()
        .map(|&(k, a)| (k.to_owned(), a))
        .collect();
    assert_eq!(got, expected, "cache reads are not input");
    let actuals = profile.rules.actuals(
        &call,
        &ProviderUsage {
            input_tokens: 1_000,
            output_tokens: 120,
        },
    );
    assert_eq!(
        actuals.iter().map(|a| a.actual_amount).collect::<Vec<_>>(),
        [1_000, 120]
    );
    let token_keys: Vec<String> = (profile.rules.token_keys().iter())
        .map(|k| k.as_str().to_owned())
        .collect();
    assert_eq!(
        token_keys,
        [
            "global:llm:anthropic:claude-sonnet-4:itpm",
            "global:llm:anthropic:claude-sonnet-4:otpm"
        ],
        "a Complete frees room on both"
    );
    let missing = llm_profile("anthropic", "m", &published(50, 30_000)).unwrap_err();
    assert!(missing.to_string().contains("input_tpm"), "{missing}");
}

#[test]
fn gemini_adds_requests_per_day_and_bedrock_burns_output_down_at_five() {
    let gemini = llm_profile(
        "gemini",
        "gemini-2.5-flash",
        &Published {
            rpd: Some(10_000),
            ..published(1_000, 1_000_000)
        },
    )
    .unwrap();
    assert_eq!(
        shape(&gemini)[2],
        (
            "global:llm:gemini:gemini-2.5-flash:rpd".to_owned(),
            10_000,
            86_400,
            None
        )
    );
    let bedrock = llm_profile("bedrock", "claude", &published(100, 200_000)).unwrap();
    let call = ProfileCall {
        prompt: "",
        prompt_tokens: Some(1_000),
        cache_read_tokens: 0,
        max_output_tokens: 2_000,
        best_of: 1,
    };
    assert_eq!(bedrock.rules.requirements(&call)[1].amount, 11_000);
    assert_eq!(
        bedrock.rules.token_keys(),
        [LimitKey::llm_tpm("bedrock", "claude").unwrap()]
    );
    assert_eq!(bedrock.rules.actuals_from_total(&call, 1_300)[0].actual_amount, 2_500);
}

#[test]
fn bad_input_is_a_clear_error() {
    assert!(matches!(
        llm_profile("mistral", "m", &published(1, 1)),
        Err(ProfileError::UnknownProvider(_))
    ));
    assert!(llm_profile("openai", "gpt:4o", &published(1, 1)).is_err());
    let zero = llm_profile("openai", "m", &published(0, 1)).unwrap_err();
    assert!(zero.to_string().contains("rpm"), "{zero}");
    let quantum = llm_profile(
        "openai",
        "m",
        &Published {
            quantum_seconds: Some(61),
            ..published(1, 1)
        },
    );
    assert!(quantum.is_err());
}
