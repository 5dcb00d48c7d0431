#!/usr/bin/env bash
# Replays both Azure traces through every strategy at a speed-up that saturates
# the provider, and writes summaries and plots (BENCHMARKS.md, "Trace replay").
# Usage: crates/replay/scripts/bench.sh [OUT_DIR] [STRATEGY...] ; extra replay
# flags go in REPLAY_FLAGS (e.g. REPLAY_FLAGS="--prompt-estimate bytes").
# With BACKEND=tigerbeetle, `server` and `server-multi` run ratelimiterd on a
# single-replica TigerBeetle cluster formatted anew for each run
# (`scripts/tigerbeetle.sh start`, port TB_PORT, default 3000), and their
# outputs are named with a `-tb` suffix. WINDOW_SECONDS (default 60) sets the
# provider's window; the token limit keeps the same rate (per window: the
# per-minute figure times WINDOW_SECONDS / 60), and outputs of windows other than
# 60 s are named with a `-w<seconds>s` suffix. The limits are defined as the
# provider's; the backend's default window margin applies.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out="${1:-target/replay-bench}"
shift || true
strategies=("${@:-none token-bucket local server server-multi}")
traces="../shared/traces/azure-llm-2023"
mkdir -p "$out"
if [ "${BACKEND:-memory}" = tigerbeetle ]; then
  eval "$(scripts/tigerbeetle.sh env)"
  cargo build --release -p replay -p ratelimiterd --features ratelimiterd/tigerbeetle
else
  cargo build --release -p replay -p ratelimiterd
fi
# At 30x the code trace offers about 9.6 M tokens a minute and the conversation
# trace about 13.6 M; the token limits are about 0.7 of that, so demand exceeds
# capacity for most of the run. Requests per minute and calls in flight are set
# high enough not to bind: the token limit is the binding one.
window="${WINDOW_SECONDS:-60}"
common=(--speedup 30 --provider-window-seconds "$window"
        --provider-rpm 1000000 --provider-concurrency 256 --provider-ms-per-output-token 2
        --max-output-tokens 1024 --quiet ${REPLAY_FLAGS:-})
for trace in code conv; do
  case "$trace" in
    code) tpm=$((6500000 * window / 60)) ;;
    conv) tpm=$((9500000 * window / 60)) ;;
  esac
  for strategy in ${strategies[@]}; do
    name="$trace-$strategy" backend=()
    if [ "$window" != 60 ]; then name="$name-w${window}s"; fi
    if [ "${BACKEND:-memory}" = tigerbeetle ] && [[ "$strategy" == server* ]]; then
      # A fresh cluster per run: the last run's holds would still count for a window.
      scripts/tigerbeetle.sh start >&2
      name="$name-tb" backend=(--tigerbeetle-addresses "127.0.0.1:${TB_PORT:-3000}")
    fi
    echo "== $name $(date +%T)" >&2
    "${CARGO_TARGET_DIR:-target}/release/replay" --trace "$traces/AzureLLMInferenceTrace_$trace.csv" --strategy "$strategy" \
      --provider-tpm "$tpm" "${common[@]}" "${backend[@]}" \
      --summary-json "$out/$name.json" --plot "$out/$name.png" \
      --record-json "$out/$name.record.json" > /dev/null
    if [ ${#backend[@]} -gt 0 ]; then scripts/tigerbeetle.sh stop >&2; fi
  done
done
