#!/usr/bin/env bash
# The device checks for a session that has the lent GPU machine (no Rust
# toolchain there, no network). Two steps:
#
#   scripts/gpu-check.sh --prepare   here: builds stripped release binaries and
#                                    test executables into target/gpu-check
#                                    (what travels is limited to 64 MiB)
#   scripts/gpu-check.sh             there (run with carry ["target/gpu-check"]):
#                                    runs the sections below with the machine's
#                                    own CUDA driver and NVRTC
#
# Sections (each prints its result even if a later one fails; the whole run
# stays under 5 minutes):
#   1 probe       nvidia-smi, driver version, the CUDA backend's open()
#   2 suite       the device test suite against the cuda backend
#   3 kernels     every reduce kernel's output against the CPU kernels (the
#                 suite's reduce tests, listed on their own)
#   4 bandwidth   reduce-copy kernels vs a device-to-device copy (>= 64 MiB),
#                 first-use compile+load, then load from the disk cache
#   5 commbench   commbench all_reduce --np 2 --device cuda over shm staging
# Exits non-zero when any section fails or prints a wrong value.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=target/gpu-check

prepare() {
    set -e
    rm -rf "$OUT_DIR" && mkdir -p "$OUT_DIR"
    cargo build --release -p commbench
    cargo build --release -p device --features emu --example kernel_bandwidth
    local suite
    suite=$(cargo test --release -p device --features emu --test suite --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "suite":
        print(m["executable"])' | tail -1)
    [[ -n $suite ]] || { echo "gpu-check: the device suite did not build" >&2; exit 1; }
    cp target/release/commbench "$OUT_DIR/"
    cp target/release/examples/kernel_bandwidth "$OUT_DIR/"
    cp "$suite" "$OUT_DIR/device-suite"
    strip "$OUT_DIR"/*
    du -sh "$OUT_DIR"
    local kib
    kib=$(du -sk "$OUT_DIR" | cut -f1)
    ((kib < 60 * 1024)) || { echo "gpu-check: $OUT_DIR is ${kib} KiB, over the 60 MiB budget" >&2; exit 1; }
}

if [[ ${1:-} == --prepare ]]; then
    prepare
    exit
fi

[[ -x $OUT_DIR/device-suite ]] || { echo "gpu-check: run scripts/gpu-check.sh --prepare first" >&2; exit 2; }
export SNCL_TEST_DEVICE=cuda SNCL_TEST_DEVICE_REQUIRED=1
FAILED=()
section() {
    local name=$1 limit=$2
    shift 2
    echo "=== $name (limit ${limit}s): $*"
    local start=$SECONDS
    timeout "$limit" "$@" 2>&1
    local rc=$?
    echo "=== $name: exit $rc after $((SECONDS - start)) s"
    ((rc == 0)) || FAILED+=("$name")
}

section probe 30 bash -c 'nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; ls /usr/local/cuda*/lib64/libnvrtc.so* /usr/lib/x86_64-linux-gnu/libnvrtc.so* 2>/dev/null; true'
section suite 90 "$OUT_DIR/device-suite" --test-threads=1
section kernels 60 "$OUT_DIR/device-suite" --test-threads=1 reduce
CACHE=$(mktemp -d)
section bandwidth 60 env XDG_CACHE_HOME="$CACHE" "$OUT_DIR/kernel_bandwidth" cuda 256 20
section bandwidth-cached 30 env XDG_CACHE_HOME="$CACHE" "$OUT_DIR/kernel_bandwidth" cuda 64 5
rm -rf "$CACHE"
section commbench 60 "$OUT_DIR/commbench" all_reduce --np 2 --device cuda -b 8 -e 256M -f 4 -c 1
if ((${#FAILED[@]})); then
    echo "gpu-check: FAILED sections: ${FAILED[*]}"
    exit 1
fi
echo "gpu-check: every section passed"
