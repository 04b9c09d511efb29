#!/usr/bin/env bash
# The device checks for a session that has the lent GPU machine (no Rust
# toolchain there, no network). Two steps:
#
#   scripts/gpu-check.sh --prepare   here: builds stripped release binaries,
#                                    test executables, libsncl and the C
#                                    device test into target/gpu-check (what
#                                    travels is limited to 64 MiB)
#   scripts/gpu-check.sh [GROUP...]  there (run with carry ["target/gpu-check"]):
#                                    runs the groups' sections with the
#                                    machine's own CUDA driver and NVRTC
#   scripts/gpu-check.sh --on-model  here: the basics group on the strict CUDA
#                                    driver model (scripts/cuda-model.sh) with
#                                    target/release/commbench (or
#                                    $GPU_CHECK_COMMBENCH), to try this
#                                    script's first section before a GPU is
#                                    lent (same commands, same limits; the
#                                    test command runs it)
#
# Groups (default: basics device nvlink; each keeps within its own limit, so
# that one call stays well under the 600 s a command may run):
#   basics (first; at most 120 s; the other groups run only if it passes):
#     env         locates NVRTC (the system's, CUDA_HOME's, or a Python
#                 environment's nvidia/*/lib, torch's included) and puts it on
#                 the loader's path; prints the driver, the module loading
#                 mode (CUDA_MODULE_LOADING) and whether MPS runs
#     threads-2   commbench all_reduce --device cuda --threads 2 (two ranks as
#                 threads of one process on the one GPU, no MPS needed),
#                 8 B to 64 MiB, checked, SNCL_TIMEOUT_MS=15000: the device
#                 path's first contact (it deadlocked on the strict driver
#                 model until stop 28; this is the same run on a GPU)
#     np-2        the same as 2 processes (time-sliced without MPS: the
#                 lane's collectives then run ordered between the processes
#                 by IPC events, no kernel spinning; must still complete)
#     capture     CUDA graph capture and replay of sncl collectives: commbench
#                 -G 10 captures 5 all-reduces (the kernel path, 8 B to
#                 64 KiB, 2 ranks as threads) into a graph and launches it 10
#                 times per size, results checked
#   device (GPU buffers, kernels, codecs; 260 s):
#     probe       nvidia-smi, driver version, the CUDA backend's open()
#     suite       the device test suite against the cuda backend
#     kernels     every reduce kernel's output against the CPU kernels (the
#                 suite's reduce tests, listed on their own)
#     bandwidth   reduce-copy kernels vs a device-to-device copy (>= 64 MiB),
#                 first-use compile+load, then load from the disk cache
#     commbench   commbench all_reduce --np 2 --device cuda over shm staging
#     codecs      every codec kernel's output vs the CPU codec (compress) on
#                 the device: the codec suite (device/tests/codec_suite.rs)
#     cudarc-slices  collectives on cudarc's CudaSlice (tests/cuda_slices.rs)
#     compressed  commbench --device cuda --compress int8: compressed
#                 all_reduce on device buffers, 2 processes, checked bit for
#                 bit against the host form
#     compressed-mx  the same with mxfp8 (the MX device kernels)
#     deterministic  SNCL_DETERMINISTIC=1 commbench all_reduce --device cuda
#                 --np 2 -d bfloat16: inexact inputs, the device result
#                 checked bit for bit against the host's canonical order
#     codec-bandwidth  codec encode/decode vs a device-to-device copy in the
#                 same run (>= 64 MiB; bytes read + written), first-use compile
#   nvlink (transport-nvlink, the kernel path, the C ABI on device pointers; 300 s):
#     nvlink-2 / nvlink-4  2 and 4 processes on the one GPU over the nvlink
#                 transport (SNCL_TRANSPORT=nvlink): all_reduce, all_gather,
#                 reduce_scatter, broadcast, checked, 8 B to 512 MiB; the
#                 bound is printed by the d2d section (busbw target at
#                 256 MiB, 2 ranks: >= 0.35 x the D2D copy rate)
#     d2d         the device-to-device copy rate in the same run (bytes
#                 copied / time, kernel_bandwidth's copy row)
#     kernel-path / kernel-path-graph / kernel-path-ops  the kernel path
#                 (every device collective as one launch on the caller's
#                 stream), 2 ranks as threads: all_reduce 8 B to 256 MiB
#                 (8 B <= 15 us, 256 MiB busbw >= 0.35 x d2d), 8 B from a
#                 CUDA graph (<= 8 us), the other four collectives
#     latency     8 B all_reduce, 2 processes, with MPS when
#                 nvidia-cuda-mps-control is there (target <= 20 us)
#     c-device    capi/tests/c/c_abi_device_test.c on the cuda backend, 2 ranks
#     direct-256M nvlink version 2 (device windows, direct kernels): 2
#                 processes on the one GPU, 256 MiB f32 all_reduce busbw of
#                 v1 (copy engine), one-shot and two-shot, with the D2D copy
#                 rate of the same run and each ratio (target: two-shot >=
#                 0.35 x D2D; tests/nvlink_direct_bench.rs)
#   torch (scripts/gpu-check-torch.sh: builds sncl_torch against that
#     machine's torch from target/gpu-check/lib/libsncl.a; CUDA tensors,
#     DDP parity with gloo; 280 s)
# Exits non-zero when any section fails or prints a wrong value.
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
    # nvlink version 2's measurement (section direct-256M).
    local direct
    direct=$(test_exe nvlink_direct_bench -p sncl)
    [[ -n $direct ]] || { echo "gpu-check: the direct all-reduce bench did not build" >&2; exit 1; }
    cp "$direct" "$OUT_DIR/direct-bench"
    # The C ABI test on device pointers, linked against the release
    # libsncl.so that travels beside it.
    cargo build --release -p sncl-capi
    cp target/release/libsncl.so "$OUT_DIR/"
    cc -O2 -Wall -Werror -Iinclude -o "$OUT_DIR/c-device-test" capi/tests/c/c_abi_device_test.c \
        -L"$OUT_DIR" -lsncl -Wl,-rpath,'$ORIGIN'
    strip "$OUT_DIR"/*
    # sncl_torch is built there from this archive (scripts/gpu-check-torch.sh).
    scripts/gpu-check-torch.sh --prepare
    du -sh "$OUT_DIR"
    local kib
    kib=$(du -sk "$OUT_DIR" | cut -f1)
    ((kib < 60 * 1024)) || { echo "gpu-check: $OUT_DIR is ${kib} KiB, over the 60 MiB budget" >&2; exit 1; }
}

if [[ ${1:-} == --prepare ]]; then
    prepare
    exit
fi

# On the device the binaries run as they are; on the model through
# scripts/cuda-model.sh, which loads the model as libcuda.
ON_MODEL=0
RUN_WITH=()
COMMBENCH=$OUT_DIR/commbench
if [[ ${1:-} == --on-model ]]; then
    shift
    ON_MODEL=1
    RUN_WITH=(scripts/cuda-model.sh)
    COMMBENCH=${GPU_CHECK_COMMBENCH:-target/release/commbench}
    [[ -x $COMMBENCH ]] || { echo "gpu-check: $COMMBENCH is missing; cargo build --release -p commbench first" >&2; exit 2; }
    [[ $# -eq 0 ]] || { echo "gpu-check: --on-model runs the basics group only" >&2; exit 2; }
    set -- basics
fi

GROUPS_WANTED=("$@")
((${#GROUPS_WANTED[@]})) || GROUPS_WANTED=(basics device nvlink)
for g in "${GROUPS_WANTED[@]}"; do
    case $g in basics | device | nvlink | torch) ;; *) echo "gpu-check: unknown group $g (basics, device, nvlink, torch)" >&2; exit 2 ;; esac
done
if ((!ON_MODEL)); then
    for exe in device-suite codec-suite codec_bandwidth cuda-slices commbench c-device-test libsncl.so; do
        [[ -e $OUT_DIR/$exe ]] || { echo "gpu-check: $OUT_DIR/$exe is missing; run scripts/gpu-check.sh --prepare first" >&2; exit 2; }
    done
fi
export SNCL_TEST_DEVICE=cuda SNCL_TEST_DEVICE_REQUIRED=1
FAILED=()
SUMMARY=()
GROUP_END=0
# section NAME LIMIT COMMAND...: runs COMMAND within LIMIT seconds, cut to
# what is left of the group's budget.
section() {
    local name=$1 limit=$2
    shift 2
    local left=$((GROUP_END - SECONDS))
    ((limit < left)) || limit=$left
    if ((limit < 5)); then
        echo "=== $name: skipped, the group's budget is spent"
        FAILED+=("$name")
        return
    fi
    echo "=== $name (limit ${limit}s): $*"
    local start=$SECONDS
    timeout "$limit" "$@" 2>&1
    local rc=$?
    echo "=== $name: exit $rc after $((SECONDS - start)) s"
    SUMMARY+=("$name: exit $rc, $((SECONDS - start)) s")
    ((rc == 0)) || FAILED+=("$name")
}

# Puts the first directory holding libnvrtc.so.13 or .12 on LD_LIBRARY_PATH:
# the system's CUDA, CUDA_HOME, then any Python environment's nvidia/*/lib
# (the NVRTC wheels, which torch's CUDA wheels bring).
find_nvrtc() {
    local d sites
    sites=$(python3 -c 'import site; print(" ".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null)
    # shellcheck disable=SC2086 # word splitting and globbing wanted
    for d in ${CUDA_HOME:+$CUDA_HOME/lib64} /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu \
        $(for s in $sites /opt/torch/.venv/lib/python3*/site-packages; do ls -d "$s"/nvidia/*/lib 2>/dev/null; done); do
        if ls "$d"/libnvrtc.so.1[23]* >/dev/null 2>&1; then
            export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
            echo "NVRTC: $d"
            return 0
        fi
    done
    echo "NVRTC: not found (the device path compiles its kernels with it)"
    return 1
}

basics_env() {
    if ((ON_MODEL)); then
        echo "the strict CUDA driver model (scripts/cuda-model.sh; NVRTC from target/cuda-wheels)"
        local loading=${CUDA_MODULE_LOADING:-unset}
        echo "CUDA_MODULE_LOADING=$loading (unset: lazy, the model follows the driver default)"
        local mps=${CUDA_MODEL_MPS:-0}
        echo "MPS: CUDA_MODEL_MPS=$mps (0: off, the model default)"
        return 0
    fi
    find_nvrtc || return 1
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    echo "CUDA_MODULE_LOADING=${CUDA_MODULE_LOADING:-unset, so the driver default: LAZY since 12.2}"
    if pgrep -x nvidia-cuda-mps-server >/dev/null 2>&1 || pgrep -x nvidia-cuda-mps-control >/dev/null 2>&1; then
        echo "MPS: running"
    else
        echo "MPS: not running (processes on one GPU time-slice; sncl orders their collectives by IPC events, no spinning kernels)"
    fi
}

# `timeout` runs programs, not shell functions: the section runs it in a
# child bash (it exited 127, "command not found", before, which failed the
# basics and so every group).
export -f basics_env find_nvrtc

group_basics() {
    GROUP_END=$((SECONDS + 120))
    section env 10 env ON_MODEL="$ON_MODEL" bash -c basics_env
    # NVRTC's directory must reach the later sections too.
    ((ON_MODEL)) || find_nvrtc >/dev/null || true
    section threads-2 40 env SNCL_TIMEOUT_MS=15000 "${RUN_WITH[@]}" "$COMMBENCH" all_reduce --device cuda --threads 2 -b 8 -e 64M -f 4 -n 5 -w 1 -c 1
    section np-2 40 env SNCL_TIMEOUT_MS=15000 "${RUN_WITH[@]}" "$COMMBENCH" all_reduce --device cuda --np 2 -b 8 -e 64M -f 4 -n 5 -w 1 -c 1
    section capture 25 env SNCL_TIMEOUT_MS=15000 "${RUN_WITH[@]}" "$COMMBENCH" all_reduce --device cuda --threads 2 -b 8 -e 64K -f 8 -n 5 -w 1 -G 10 -c 1
}

group_device() {
    GROUP_END=$((SECONDS + 260))
    section probe 30 bash -c 'nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; ls /usr/local/cuda*/lib64/libnvrtc.so* /usr/lib/x86_64-linux-gnu/libnvrtc.so* 2>/dev/null; true'
    section suite 60 "$OUT_DIR/device-suite" --test-threads=1
    section kernels 40 "$OUT_DIR/device-suite" --test-threads=1 reduce
    local cache
    cache=$(mktemp -d)
    section bandwidth 40 env XDG_CACHE_HOME="$cache" "$OUT_DIR/kernel_bandwidth" cuda 256 20
    section bandwidth-cached 20 env XDG_CACHE_HOME="$cache" "$OUT_DIR/kernel_bandwidth" cuda 64 5
    rm -rf "$cache"
    section commbench 40 "$OUT_DIR/commbench" all_reduce --np 2 --device cuda -b 8 -e 256M -f 4 -c 1
    section codecs 40 "$OUT_DIR/codec-suite" --test-threads=1
    cache=$(mktemp -d)
    section cudarc-slices 20 "$OUT_DIR/cuda-slices" --test-threads=1
    section compressed 30 "$OUT_DIR/commbench" all_reduce --np 2 --device cuda -b 1M -e 64M -f 8 -c 1 --compress int8 --compress-scope flat
    section compressed-mx 30 "$OUT_DIR/commbench" all_reduce --np 2 --device cuda -b 1M -e 64M -f 8 -c 1 --compress mxfp8 --compress-scope flat
    section deterministic 30 env SNCL_DETERMINISTIC=1 "$OUT_DIR/commbench" all_reduce --np 2 --device cuda -b 8 -e 64M -f 8 -c 1 -d bfloat16
    section codec-bandwidth 40 env XDG_CACHE_HOME="$cache" "$OUT_DIR/codec_bandwidth" cuda 64 10
    rm -rf "$cache"
}

# Two ranks of the C device test on the cuda backend.
c_device_ranks() {
    local secret port pids=() rc=0
    secret=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
    port=$((20000 + RANDOM % 20000))
    for r in 0 1; do
        SNCL_TEST_C_BACKEND=cuda SNCL_RANK=$r SNCL_WORLD_SIZE=2 SNCL_ROOT=127.0.0.1:$port \
            SNCL_SECRET=$secret "$OUT_DIR/c-device-test" &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    return $rc
}

export -f c_device_ranks
export OUT_DIR

group_nvlink() {
    GROUP_END=$((SECONDS + 300))
    local ops=(all_reduce all_gather reduce_scatter broadcast)
    for np in 2 4; do
        section "nvlink-$np" 90 bash -c "for op in ${ops[*]}; do SNCL_TRANSPORT=nvlink $OUT_DIR/commbench \$op --np $np --device cuda -b 8 -e 512M -f 8 -n 5 -w 1 -c 1 || exit 1; done"
    done
    # The bound: a device-to-device copy in the same run (kernel_bandwidth's copy row).
    local cache
    cache=$(mktemp -d)
    section d2d 30 env XDG_CACHE_HOME="$cache" "$OUT_DIR/kernel_bandwidth" cuda 256 10
    rm -rf "$cache"
    # The kernel path (one launch per collective on the caller's stream;
    # 2 ranks as threads): 8 B latency (target <= 15 us eager) to 256 MiB
    # busbw (target >= 0.35 x d2d), <= 8 us per 8 B all-reduce replayed from
    # a CUDA graph, and its other collectives; then point-to-point on
    # device memory (host-driven through the staging: sendrecv).
    section kernel-path 25 "$OUT_DIR/commbench" all_reduce --device cuda --threads 2 -b 8 -e 256M -f 32 -n 10 -w 2 -c 1
    section kernel-path-graph 15 "$OUT_DIR/commbench" all_reduce --device cuda --threads 2 -b 8 -e 8 -G 100 -n 20 -w 2 -c 1
    section kernel-path-ops 40 bash -c "for op in all_gather reduce_scatter broadcast reduce alltoall gather scatter; do $OUT_DIR/commbench \$op --device cuda --threads 2 -b 8 -e 64M -f 64 -n 5 -w 1 -c 1 || exit 1; done"
    section sendrecv 30 "$OUT_DIR/commbench" sendrecv --device cuda --threads 2 -b 8 -e 64M -f 64 -n 5 -w 1 -c 1
    section nvlink-256M 30 env SNCL_TRANSPORT=nvlink "$OUT_DIR/commbench" all_reduce --np 2 --device cuda -b 256M -e 256M -n 10 -w 2 -c 1
    section direct-256M 60 env SNCL_TEST_DEVICE=cuda DIRECT_BENCH_MIB=256 "$OUT_DIR/direct-bench" direct_busbw --exact --nocapture --test-threads=1
    if command -v nvidia-cuda-mps-control >/dev/null; then
        section latency-mps 30 bash -c "nvidia-cuda-mps-control -d && SNCL_TRANSPORT=nvlink $OUT_DIR/commbench all_reduce --np 2 --device cuda -b 8 -e 8 -n 200 -w 20; rc=\$?; echo quit | nvidia-cuda-mps-control; exit \$rc"
    else
        echo "=== latency-mps: skipped, nvidia-cuda-mps-control is not on this machine (ranks on one GPU time-slice)"
    fi
    section latency 30 env SNCL_TRANSPORT=nvlink "$OUT_DIR/commbench" all_reduce --np 2 --device cuda -b 8 -e 8 -n 200 -w 20
    section c-device 40 bash -c c_device_ranks
}

group_torch() {
    GROUP_END=$((SECONDS + 280))
    section torch 280 env TOTAL_LIMIT=270 scripts/gpu-check-torch.sh
}

for g in "${GROUPS_WANTED[@]}"; do
    echo "##### group $g"
    "group_$g"
    if [[ $g == basics ]] && ((${#FAILED[@]})); then
        echo "gpu-check: the basics failed (${FAILED[*]}); the other groups are not run"
        break
    fi
done
echo "##### summary"
printf '%s\n' "${SUMMARY[@]}"
if ((${#FAILED[@]})); then
    echo "gpu-check: FAILED sections: ${FAILED[*]}"
    exit 1
fi
echo "gpu-check: every section passed"
