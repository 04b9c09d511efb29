#!/usr/bin/env bash
# Installs the CUDA 13.0 compiler pieces sncl's kernel checks need — NVRTC
# (libnvrtc.so.13), the CUDA headers (cuda_fp16.h, cuda_bf16.h) and ptxas —
# from NVIDIA's Python wheels into target/cuda-wheels with `pip --target`.
# No GPU, driver or system change is needed; nothing outside that directory
# is written. Idempotent: a second run with the same pins does nothing.
#
# Prints, on stdout, one KEY=VALUE line each:
#   NVRTC_LIB_DIR=<directory holding libnvrtc.so.13>
#   CUDA_INCLUDE=<directory holding cuda_fp16.h>
#   PTXAS=<the ptxas binary>
# Progress and errors go to stderr. Exit status 2: pip is missing; 3: the
# package index cannot provide the wheels (unreachable, or it lacks these
# versions): callers skip with the reason rather than fail.
#
# Environment: PYTHON (default python3), CARGO_TARGET_DIR (default
# <repo>/target).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${CARGO_TARGET_DIR:-$repo/target}/cuda-wheels"
python="${PYTHON:-python3}"

# Pinned together (--no-deps): nvcc's unpinned dependency on the crt headers
# would otherwise pull a newer release than the rest.
pins=(
    "nvidia-cuda-nvrtc==13.0.*"
    "nvidia-cuda-runtime==13.0.*"
    "nvidia-cuda-nvcc==13.0.*"
    "nvidia-cuda-crt==13.0.*"
)
stamp="$dest/.sncl-installed"
want="${pins[*]}"

root="$dest/nvidia/cu13"
lib="$root/lib"
include="$root/include"
ptxas="$root/bin/ptxas"

complete() {
    [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && -e "$lib/libnvrtc.so.13" &&
        -f "$include/cuda_fp16.h" && -x "$ptxas" ]]
}

mkdir -p "$(dirname "$dest")"
# One installer at a time (parallel test processes); flock where present.
if command -v flock >/dev/null 2>&1; then
    exec 9>"$dest.lock"
    flock 9
fi

if ! complete; then
    if ! "$python" -m pip --version >/dev/null 2>&1; then
        echo "cuda-wheels: pip is not available ($python -m pip)" >&2
        exit 2
    fi
    echo "cuda-wheels: installing ${pins[*]} into $dest" >&2
    # A fresh directory: pip --target does not replace files of an older set.
    rm -rf "$dest"
    mkdir -p "$dest"
    log="$dest.pip.log"
    if ! "$python" -m pip install --quiet --no-cache-dir --disable-pip-version-check --no-input --root-user-action=ignore \
        --retries 2 --timeout 30 --no-deps --only-binary=:all: --target "$dest" "${pins[@]}" >"$log" 2>&1; then
        cat "$log" >&2
        if grep -qiE 'No matching distribution|Could not find a version|NewConnectionError|Failed to establish a new connection|Temporary failure in name resolution|Network is unreachable|ConnectTimeout|ReadTimeout|Max retries exceeded|ProxyError|SSLError' "$log"; then
            echo "cuda-wheels: the package index cannot provide ${pins[*]} (unreachable, or without these versions)" >&2
            rm -rf "$dest"
            exit 3
        fi
        echo "cuda-wheels: pip install failed (see above)" >&2
        exit 1
    fi
    if [[ ! -e "$lib/libnvrtc.so.13" || ! -f "$include/cuda_fp16.h" || ! -x "$ptxas" ]]; then
        echo "cuda-wheels: the wheels did not provide $lib/libnvrtc.so.13, $include/cuda_fp16.h and $ptxas" >&2
        exit 1
    fi
    printf '%s' "$want" >"$stamp"
fi

echo "NVRTC_LIB_DIR=$lib"
echo "CUDA_INCLUDE=$include"
echo "PTXAS=$ptxas"
