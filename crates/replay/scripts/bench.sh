#!/usr/bin/env bash
# Replays both Azure traces through every strategy at a speed-up that saturates
# the provider, and writes summaries and plots (BENCHMARKS.md, "Trace replay").
# Usage: crates/replay/scripts/bench.sh [OUT_DIR] [STRATEGY...] ; extra replay
# flags go in REPLAY_FLAGS (e.g. REPLAY_FLAGS="--prompt-estimate bytes").
set -euo pipefail
cd "$(dirname "$0")/../../.."
out="${1:-target/replay-bench}"
shift || true
strategies=("${@:-none token-bucket local server server-multi}")
traces="../shared/traces/azure-llm-2023"
mkdir -p "$out"
cargo build --release -p replay -p ratelimiterd
# At 30x the code trace offers about 9.6 M tokens a minute and the conversation
# trace about 13.6 M; the token limits are about 0.7 of that, so demand exceeds
# capacity for most of the run. Requests per minute and calls in flight are set
# high enough not to bind: the token limit is the binding one.
common=(--speedup 30 --provider-window-seconds 60 --limiter-window-margin-seconds 1
        --provider-rpm 1000000 --provider-concurrency 256 --provider-ms-per-output-token 2
        --max-output-tokens 1024 --quiet ${REPLAY_FLAGS:-})
for trace in code conv; do
  case "$trace" in
    code) tpm=6500000 ;;
    conv) tpm=9500000 ;;
  esac
  for strategy in ${strategies[@]}; do
    echo "== $trace $strategy $(date +%T)" >&2
    target/release/replay --trace "$traces/AzureLLMInferenceTrace_$trace.csv" --strategy "$strategy" \
      --provider-tpm "$tpm" "${common[@]}" \
      --summary-json "$out/$trace-$strategy.json" --plot "$out/$trace-$strategy.png" \
      --record-json "$out/$trace-$strategy.record.json" > /dev/null
  done
done
