#!/usr/bin/env bash
# The operator's console in a real browser (docs/console.md, "Tests"): installs
# Debian's chromium when it is missing, builds ratelimiterd and provider-sim,
# and runs tests/console_browser/console_test.mjs with Node, which drives
# Chromium over the DevTools protocol (no npm package; Debian's nodejs installed
# when node is missing). Screenshots are kept in $ARTIFACTS_DIR (default
# target/artifacts). UPDATE_CONSOLE_PNG=1 also replaces docs/console.png with
# the whole page (docs/console.md, "Tests"). Called by scripts/test.sh.
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

# Installs Debian's package $2 when the command $1 is missing.
install_missing() {
    if command -v "$1" >/dev/null 2>&1; then
        return
    fi
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        sudo="sudo"
    fi
    echo "browser-test: installing Debian's $2" >&2
    $sudo apt-get update -q
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "$2"
}

# Node (18 or later) drives chromium; a fresh machine has neither.
install_missing node nodejs
install_missing chromium chromium
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
