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
# SKIP_BUILD=1: use the release binaries already built.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out="${1:-target/profiles-matrix}"
shift || true
profiles=("${@:-openai azure anthropic gemini bedrock}")
traces="${TRACES:-../shared/traces/azure-llm-2023}"
mkdir -p "$out"
if [ -z "${SKIP_BUILD:-}" ]; then cargo build --release -p replay -p ratelimiterd; fi
# The published numbers: 3,500,000 tokens a minute (Anthropic: input tokens, with
# the default output limit of a fifth of it) and 21,000 requests a minute (Azure's 6
# per 1,000 TPM), 256 calls in flight. At 30x the first 1,800 requests offer
# 3.5 to 5.5 M tokens (with or without max_tokens) in about 25 s: the token limit binds.
common=(--speedup 30 --requests "${REQUESTS:-1800}" --provider-rpm 21000 --provider-tpm 3500000
        --provider-concurrency 256 --provider-ms-per-output-token 2 --max-output-tokens 1024 --quiet)
for profile in ${profiles[@]}; do
  for trace in code conv; do
    for strategy in local server token-bucket; do
      name="$profile-$trace-$strategy" limiter=()
      if [ "$strategy" != token-bucket ]; then limiter=(--limiter-profile); fi
      echo "== $name $(date +%T)" >&2
      "${CARGO_TARGET_DIR:-target}/release/replay" --trace "$traces/AzureLLMInferenceTrace_$trace.csv" \
        --strategy "$strategy" --provider-profile "$profile" "${limiter[@]}" "${common[@]}" \
        --summary-json "$out/$name.json" --plot "$out/$name.png" > /dev/null
    done
  done
done
