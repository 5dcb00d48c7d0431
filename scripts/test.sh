#!/usr/bin/env bash
# Runs every test of the workspace: formatting, lints, unit, behaviour,
# property and end-to-end tests. Called by .ci/run and by developers alike.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
