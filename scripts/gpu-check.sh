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
#   6 codecs      every codec kernel's output vs the CPU codec (compress) on
#                 the device: the codec suite (device/tests/codec_suite.rs)
#   7 cudarc-slices  collectives on cudarc's CudaSlice (tests/cuda_slices.rs)
#   8 compressed  commbench --device cuda --compress int8: compressed
#                 all_reduce on device buffers, 2 processes, checked bit for
#                 bit against the host form
#   9 codec-bandwidth  codec encode/decode vs a device-to-device copy in the
#                 same run (>= 64 MiB; bytes read + written), first-use compile
# Exits non-zero when any section fails or prints a wrong value. Each
# section's limit is cut to what is left of TOTAL_LIMIT (290 s), so the whole
# run stays under 5 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=target/gpu-check

# The path of test executable $1 (built in release; the device crate's with
# emu unless package arguments follow).
test_exe() {
    local name=$1
    shift
    (($#)) || set -- -p device --features emu
    cargo test --release "$@" --test "$name" --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == sys.argv[1]:
        print(m["executable"])' "$name" | tail -1
}

prepare() {
    set -e
    rm -rf "$OUT_DIR" && mkdir -p "$OUT_DIR"
    cargo build --release -p commbench
    cargo build --release -p device --features emu --example kernel_bandwidth --example codec_bandwidth
    local suite codecs slices
    suite=$(test_exe suite)
    [[ -n $suite ]] || { echo "gpu-check: the device suite did not build" >&2; exit 1; }
    codecs=$(test_exe codec_suite)
    [[ -n $codecs ]] || { echo "gpu-check: the codec suite did not build" >&2; exit 1; }
    slices=$(test_exe cuda_slices -p sncl --features cuda)
    [[ -n $slices ]] || { echo "gpu-check: the cudarc slice test did not build" >&2; exit 1; }
    cp target/release/commbench "$OUT_DIR/"
    cp target/release/examples/kernel_bandwidth target/release/examples/codec_bandwidth "$OUT_DIR/"
    cp "$suite" "$OUT_DIR/device-suite"
    cp "$codecs" "$OUT_DIR/codec-suite"
    cp "$slices" "$OUT_DIR/cuda-slices"
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

for exe in device-suite codec-suite codec_bandwidth cuda-slices; do
    [[ -x $OUT_DIR/$exe ]] || { echo "gpu-check: $OUT_DIR/$exe is missing; run scripts/gpu-check.sh --prepare first" >&2; exit 2; }
done
TOTAL_LIMIT=290
export SNCL_TEST_DEVICE=cuda SNCL_TEST_DEVICE_REQUIRED=1
FAILED=()
section() {
    local name=$1 limit=$2
    shift 2
    local left=$((TOTAL_LIMIT - SECONDS))
    ((limit < left)) || limit=$left
    if ((limit < 5)); then
        echo "=== $name: skipped, the ${TOTAL_LIMIT} s budget is spent"
        FAILED+=("$name")
        return
    fi
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
section codecs 60 "$OUT_DIR/codec-suite" --test-threads=1
CACHE=$(mktemp -d)
section cudarc-slices 30 "$OUT_DIR/cuda-slices" --test-threads=1
section compressed 40 "$OUT_DIR/commbench" all_reduce --np 2 --device cuda -b 1M -e 64M -f 8 -c 1 --compress int8 --compress-scope flat
section codec-bandwidth 60 env XDG_CACHE_HOME="$CACHE" "$OUT_DIR/codec_bandwidth" cuda 64 10
rm -rf "$CACHE"
if ((${#FAILED[@]})); then
    echo "gpu-check: FAILED sections: ${FAILED[*]}"
    exit 1
fi
echo "gpu-check: every section passed"
