#!/usr/bin/env bash
# The test command: the whole suite (unit, schedule checks, multi-rank
# thread and process tests, failure tests). Safe to run repeatedly.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cargo >/dev/null 2>&1; then
    echo "cargo is missing: install the Rust toolchain (rustup) first" >&2
    exit 1
fi
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}
cargo build --workspace --all-targets --profile test
exec cargo test --workspace --profile test --no-fail-fast -- --test-threads="${SNCL_TEST_THREADS:-2}"
