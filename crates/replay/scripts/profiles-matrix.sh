#!/usr/bin/env bash
# The provider-profile matrix (BENCHMARKS.md, "Provider profiles"): every profile of
# the simulated provider x both Azure traces x the `local`, `server` and
# `token-bucket` strategies, with the limits entered as the provider publishes them
# (our strategies: `--limiter-profile`, the library's profile fed those numbers;
# nothing tuned by hand). Writes summaries and plots to OUT_DIR.
# Usage: crates/replay/scripts/profiles-matrix.sh [OUT_DIR] [PROFILE...]
# REQUESTS (default 1800) bounds each run: the first requests of each trace at 30x,
# about 25 s of arrivals that the token limit takes a minute or more to serve, so
# demand exceeds capacity for a full provider window. TRACES: the traces' directory.
# SKIP_BUILD=1: use the release binaries already built. SKIP_DONE=1: skip runs whose
# summary exists. STRATEGIES: the strategies to run (default `local server
# token-bucket`); `local-rolling` and `server-rolling` are `local` and `server` with
# the profile's bucket limits turned into rolling ones of the same size
# (`--profile-windows rolling`: Anthropic's reference rows).
set -euo pipefail
cd "$(dirname "$0")/../../.."
out="${1:-target/profiles-matrix}"
shift || true
profiles=("${@:-openai azure anthropic gemini bedrock}")
traces="${TRACES:-../shared/traces/azure-llm-2023}"
mkdir -p "$out"
if [ -z "${SKIP_BUILD:-}" ]; then cargo build --release -p replay -p ratelimiterd; fi
# The published numbers: tokens a minute as below (Anthropic: input tokens, with the
# default output limit of a fifth of it), 21,000 requests a minute (Azure's 6 per
# 1,000 TPM for 3.5 M), 256 calls in flight. At 30x the first 1,800 requests arrive
# in about 25 s.
common=(--speedup 30 --requests "${REQUESTS:-1800}" --provider-rpm 21000
        --provider-concurrency 256 --provider-ms-per-output-token 2 --max-output-tokens 1024 --quiet)
for profile in ${profiles[@]}; do
  for trace in code conv; do
    # Demand exceeds the token limit for more than a provider window: OpenAI's 1 s
    # quanta bind continuously (3.5 M and 2.5 M tokens a minute); a minute window or
    # bucket admits a minute's worth at once, so the run's tokens must be over twice
    # the limit: Azure, which charges max_tokens at admission, 2.4 M and 1.7 M;
    # Anthropic's input limit and Gemini's count only the prompt, 1.5 M and 0.85 M;
    # Bedrock settles to input plus 5x output, 3.9 M (code) and 4.3 M (conv) in all:
    # 1.5 M and 1.7 M.
    case "$profile-$trace" in
      openai-code) tpm=3500000 ;;
      openai-conv) tpm=2500000 ;;
      anthropic-code|gemini-code|bedrock-code) tpm=1500000 ;;
      anthropic-conv|gemini-conv) tpm=850000 ;;
      *-code) tpm=2400000 ;;
      *-conv) tpm=1700000 ;;
    esac
    for strategy in ${STRATEGIES:-local server token-bucket}; do
      name="$profile-$trace-$strategy" limiter=()
      if [ -n "${SKIP_DONE:-}" ] && [ -s "$out/$name.json" ]; then continue; fi
      if [ "$strategy" != token-bucket ]; then limiter=(--limiter-profile); fi
      case "$strategy" in *-rolling) strategy=${strategy%-rolling} limiter+=(--profile-windows rolling) ;; esac
      echo "== $name $(date +%T)" >&2
      "${CARGO_TARGET_DIR:-target}/release/replay" --trace "$traces/AzureLLMInferenceTrace_$trace.csv" \
        --strategy "$strategy" --provider-profile "$profile" --provider-tpm "$tpm" "${limiter[@]}" "${common[@]}" \
        --summary-json "$out/$name.json" --plot "$out/$name.png" > /dev/null
    done
  done
done
