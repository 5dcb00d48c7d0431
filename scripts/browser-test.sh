#!/usr/bin/env bash
# The operator's console in a real browser (docs/console.md, "Tests"): installs
# Debian's chromium when it is missing, builds ratelimiterd and provider-sim,
# and runs tests/console_browser/console_test.mjs with Node, which drives
# Chromium over the DevTools protocol (no npm package). Screenshots are kept in
# $ARTIFACTS_DIR (default target/artifacts). Called by scripts/test.sh.
#
# `scripts/browser-test.sh bench` runs the console's benchmark instead
# (tests/console_browser/bench.mjs, BENCHMARKS.md "The console").
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"

TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
case "$TARGET" in /*) ;; *) TARGET="$ROOT/$TARGET" ;; esac
export CARGO_TARGET_DIR="$TARGET"
export ARTIFACTS_DIR="${ARTIFACTS_DIR:-$TARGET/artifacts}"

install_chromium() {
    if command -v chromium >/dev/null 2>&1; then
        return
    fi
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        sudo="sudo"
    fi
    echo "browser-test: installing Debian's chromium" >&2
    $sudo apt-get update -q
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends chromium
}

if ! command -v node >/dev/null 2>&1; then
    echo "browser-test: node (18 or later) is needed to drive chromium" >&2
    exit 1
fi
install_chromium
export CHROMIUM_BIN="${CHROMIUM_BIN:-$(command -v chromium)}"

# The test runs the debug build the other tests share; the benchmark the release build.
MODE="${1:-test}"
PROFILE=debug
if [ "$MODE" = bench ]; then
    PROFILE=release
fi
cargo build -q --profile "$( [ "$PROFILE" = debug ] && echo dev || echo release )" -p ratelimiterd --bin ratelimiterd
cargo build -q --profile "$( [ "$PROFILE" = debug ] && echo dev || echo release )" -p replay --bin provider-sim
export RATELIMITERD_BIN="$TARGET/$PROFILE/ratelimiterd"
export PROVIDER_SIM_BIN="$TARGET/$PROFILE/provider-sim"

case "$MODE" in
    test) node tests/console_browser/console_test.mjs ;;
    bench) node tests/console_browser/bench.mjs ;;
    *) echo "usage: scripts/browser-test.sh [test|bench]" >&2; exit 2 ;;
esac
