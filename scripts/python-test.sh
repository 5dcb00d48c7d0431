#!/usr/bin/env bash
# Tests the Python package (python/): builds its wheel, installs it into a virtual
# environment this script creates (reused between runs), runs pytest, which
# includes the README's black-box check in a fresh environment. Called by
# scripts/test.sh after the cargo tests; needs the Rust toolchain, python3 and pip.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"

VENV="${XDG_CACHE_HOME:-$HOME/.cache}/ratelimiter/py-venv"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
case "$TARGET" in /*) ;; *) TARGET="$ROOT/$TARGET" ;; esac
export CARGO_TARGET_DIR="$TARGET"

if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q "maturin>=1.9,<2" "pytest>=8" "opentelemetry-api>=1.20"

# The server the remote tests and the README's remote example run against.
cargo build -q -p ratelimiterd
export RATELIMITERD_BIN="$TARGET/debug/ratelimiterd"

WHEELS="$(mktemp -d)"
trap 'rm -rf "$WHEELS"' EXIT
(cd python && "$VENV/bin/maturin" build --release -q -i "$VENV/bin/python" -o "$WHEELS")
WHEEL="$(ls "$WHEELS"/*.whl)"
"$VENV/bin/python" -m pip install -q --force-reinstall --no-deps "$WHEEL"
export LLM_RATELIMITER_WHEEL="$WHEEL"

# From the repository root, so python/llm_ratelimiter (without the compiled
# module) cannot shadow the installed package.
"$VENV/bin/pytest" python/tests
