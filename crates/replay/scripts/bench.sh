#!/usr/bin/env bash
# Replays both Azure traces through every strategy at a speed-up that saturates
# the provider, and writes summaries and plots (BENCHMARKS.md, "Trace replay").
# Usage: crates/replay/scripts/bench.sh [OUT_DIR] [STRATEGY...] ; extra replay
# flags go in REPLAY_FLAGS (e.g. REPLAY_FLAGS="--prompt-estimate bytes").
# With BACKEND=tigerbeetle, `server` and `server-multi` run ratelimiterd on a
# single-replica TigerBeetle cluster formatted anew for each run
# (`scripts/tigerbeetle.sh start`, port TB_PORT, default 3000), and their
# outputs are named with a `-tb` suffix.
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
common=(--speedup 30 --provider-window-seconds 60 --limiter-window-margin-seconds 1
        --provider-rpm 1000000 --provider-concurrency 256 --provider-ms-per-output-token 2
        --max-output-tokens 1024 --quiet ${REPLAY_FLAGS:-})
for trace in code conv; do
  case "$trace" in
    code) tpm=6500000 ;;
    conv) tpm=9500000 ;;
  esac
  for strategy in ${strategies[@]}; do
    name="$trace-$strategy" backend=()
    if [ "${BACKEND:-memory}" = tigerbeetle ] && [[ "$strategy" == server* ]]; then
      # A fresh cluster per run: the last run's holds would still count for a window.
      scripts/tigerbeetle.sh start >&2
      name="$name-tb" backend=(--tigerbeetle-addresses "127.0.0.1:${TB_PORT:-3000}")
    fi
    echo "== $name $(date +%T)" >&2
    target/release/replay --trace "$traces/AzureLLMInferenceTrace_$trace.csv" --strategy "$strategy" \
      --provider-tpm "$tpm" "${common[@]}" "${backend[@]}" \
      --summary-json "$out/$name.json" --plot "$out/$name.png" \
      --record-json "$out/$name.record.json" > /dev/null
    if [ ${#backend[@]} -gt 0 ]; then scripts/tigerbeetle.sh stop >&2; fi
  done
done
