#!/usr/bin/env bash
# The test command: the whole suite (unit, schedule checks, multi-rank
# thread and process tests, failure tests). Safe to run repeatedly.
#
#   scripts/test.sh          the suite (what .ci/run runs), then the short
#                            form of the reliability suite (scripts/reliability.sh)
#   scripts/test.sh --long   the measurements kept out of it (#[ignore]d with
#                            "scripts/test.sh --long" as their reason): they
#                            time things, some assert a ratio, and want an
#                            otherwise idle machine
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cargo >/dev/null 2>&1; then
    echo "cargo is missing: install the Rust toolchain (rustup) first" >&2
    exit 1
fi
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}
if [ "${1:-}" = "--long" ]; then
    # package, test target, test name: one at a time (they time things).
    long=(
        "sncl cpu_hog one_mib_all_reduce_with_a_cpu_hog_stays_within_twice_its_quiet_time"
        "transport-rdma throughput emulated_rdma_vs_shm_64mib"
        "sncl nvlink_collectives nvlink_vs_shm_staging_timing"
    )
    failed=()
    for entry in "${long[@]}"; do
        read -r pkg target name <<<"$entry"
        echo "[test.sh --long] $pkg --test $target $name"
        cargo test -p "$pkg" --profile test --test "$target" -- --ignored --exact "$name" \
            --nocapture --test-threads=1 || failed+=("$name")
    done
    if [ ${#failed[@]} -gt 0 ]; then
        echo "[test.sh --long] failed: ${failed[*]}" >&2
        exit 1
    fi
    exit 0
fi
cargo build --workspace --all-targets --profile test
status=0
cargo test --workspace --profile test --no-fail-fast -- --test-threads="${SNCL_TEST_THREADS:-2}" || status=$?
# SNCL_TEST_FREE_DISK=1 (set by .ci/run): what the rest no longer needs goes
# before the fuzzer's instrumented build. The torch virtualenv (≈5 GB) served
# the PyTorch backend's test above; a CI machine once ran out of disk in that
# build with it still there.
if [ "${SNCL_TEST_FREE_DISK:-0}" = 1 ]; then
    rm -rf target/torch-venv target/torch-venv.lock
    df -h . | tail -1 | awk '{print "[test.sh] disk after the cargo tests, torch virtualenv removed: " $4 " free"}'
fi
# The reliability suite's short form (its long form: scripts/reliability.sh --long).
scripts/reliability.sh || status=1
# The lent GPU's first section, on the strict driver model (seconds): the
# script itself is checked before a GPU meets it. The model's cdylib came
# with the workspace build above; `cargo build -p cuda-model` alone would
# resolve features differently (serde_json's, and cc's for the kernels'
# build script) and compile again, the C++ kernels included (minutes).
[[ -f target/debug/libcuda_model.so ]] || cargo build --workspace --all-targets --profile test
GPU_CHECK_COMMBENCH=target/debug/commbench CUDA_MODEL_PROFILE=test CUDA_MODEL_NO_BUILD=1 \
    scripts/gpu-check.sh --on-model >target/gpu-check-on-model.log 2>&1 || {
    tail -20 target/gpu-check-on-model.log
    status=1
}
tail -2 target/gpu-check-on-model.log
exit $status
