#!/usr/bin/env bash
# The gateway's integration tests with the real openai and anthropic Python SDKs
# (tests/gateway_sdk, docs/testing.md): builds ratelimiterd and provider-sim,
# installs the SDKs and pytest into a virtual environment of its own (reused
# between runs), and runs pytest. Called by scripts/test.sh; needs the Rust
# toolchain, python3 and pip.
#
# GATEWAY_TEST_TARGET=sim runs the same tests against the simulator directly
# (the harness's own check); the default, and the only mode scripts/test.sh uses
# once ratelimiterd has the gateway, is `gateway`.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"

VENV="${XDG_CACHE_HOME:-$HOME/.cache}/ratelimiter/gateway-venv"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
case "$TARGET" in /*) ;; *) TARGET="$ROOT/$TARGET" ;; esac
export CARGO_TARGET_DIR="$TARGET"

if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
# Majors pinned: the tests read the SDKs' public surface (errors, streams, usage);
# the bedrock extra brings botocore, which AnthropicBedrock signs its calls with;
# the vertex extra google-auth, which AnthropicVertex makes its tokens with.
"$VENV/bin/python" -m pip install -q "openai>=1.60,<3" "anthropic[bedrock,vertex]>=0.45,<1" "pytest>=8,<10"

if [ -z "${GATEWAY_TEST_TARGET:-}" ]; then
    if grep -q '^gateway' crates/ratelimiterd/Cargo.toml; then
        GATEWAY_TEST_TARGET=gateway
    else
        # Until ratelimiterd has the gateway, the harness runs against the simulator.
        echo "gateway-test: ratelimiterd has no gateway yet; testing against provider-sim" >&2
        GATEWAY_TEST_TARGET=sim
    fi
fi
export GATEWAY_TEST_TARGET

cargo build -q -p ratelimiterd --bin ratelimiterd
cargo build -q -p replay --bin provider-sim
export RATELIMITERD_BIN="$TARGET/debug/ratelimiterd"
export PROVIDER_SIM_BIN="$TARGET/debug/provider-sim"

# pytest exits 5 when it collected nothing: that is a failure here, not a pass.
set +e
(cd tests/gateway_sdk && "$VENV/bin/pytest" -q -p no:cacheprovider "$@")
status=$?
set -e
if [ "$status" -eq 5 ]; then
    echo "gateway-test: pytest collected no tests" >&2
    exit 1
fi
exit "$status"
