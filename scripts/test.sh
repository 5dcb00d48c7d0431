#!/usr/bin/env bash
# Runs every test of the workspace: formatting, lints, unit, behaviour,
# property and end-to-end tests. Called by .ci/run and by developers alike.
set -euo pipefail
cd "$(dirname "$0")/.."

# The TigerBeetle toolchain: Zig and libclang for the client crate, and the
# server the tests start (built once per machine, cached outside the repo).
eval "$(scripts/tigerbeetle.sh env)"
TIGERBEETLE_BIN="$(scripts/tigerbeetle.sh path)"
export TIGERBEETLE_BIN
# libfaketime, which the clock-step tests preload into the server to step its
# wall clock (crates/ratelimiterd/tests/reliability_clock.rs).
RATELIMITER_FAKETIME_LIB="$(scripts/tigerbeetle.sh faketime-lib)"
export RATELIMITER_FAKETIME_LIB

cargo fmt --all --check
# Without features the server must build with the Rust toolchain alone.
cargo check --workspace --all-targets
cargo clippy --workspace --all-targets --all-features -- -D warnings
cargo test --workspace --all-features
# Every command and configuration README.md shows (docs/testing.md, "The README's commands").
scripts/readme-test.sh
scripts/python-test.sh
scripts/gateway-test.sh
scripts/browser-test.sh
