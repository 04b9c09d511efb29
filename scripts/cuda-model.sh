#!/usr/bin/env bash
# Runs CMD ARGS... on the strict CUDA driver model (cuda-model/): builds the
# model's cdylib if needed, installs it as libcuda.so / libcuda.so.1 in
# target/cuda-model/lib, puts that and NVRTC (scripts/cuda-wheels.sh) on the
# loader's path, and execs CMD. sncl's real `cuda` backend then loads the
# model as its driver:
#
#   scripts/cuda-model.sh target/release/commbench all_reduce --device cuda --np 2 -b 8 -e 16M -f 4
#
# A deadlock or stall in CMD ends it with exit status 86 and a
# "cuda-model: deadlock" / "cuda-model: stall" report on stderr.
#
# Environment: CUDA_MODEL_PROFILE (release, default, or test: the cargo
# profile the model is built with), CUDA_MODEL_NO_BUILD=1 (use the built
# library as is), and the model's own settings (docs/CUDA-MODEL.md):
# CUDA_MODEL_DEVICES, CUDA_MODEL_SMS, CUDA_MODEL_MPS, CUDA_MODULE_LOADING,
# CUDA_MODEL_STALL_S, CUDA_MODEL_DEADLOCK_S, CUDA_MODEL_REPORT, CUDA_MODEL_LOG.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/target}"
profile="${CUDA_MODEL_PROFILE:-release}"
if [[ $# -eq 0 ]]; then
    echo "usage: scripts/cuda-model.sh CMD [ARGS...]" >&2
    exit 2
fi
if [[ "$profile" == "dev" || "$profile" == "test" ]]; then dir=debug; else dir="$profile"; fi
if [[ "${CUDA_MODEL_NO_BUILD:-0}" != 1 ]]; then
    (cd "$repo" && cargo build --quiet -p cuda-model --profile "$profile" >&2)
fi
built="$target/$dir/libcuda_model.so"
if [[ ! -f "$built" ]]; then
    echo "cuda-model: $built is missing (build it: cargo build -p cuda-model --profile $profile)" >&2
    exit 2
fi
lib="$target/cuda-model/lib"
mkdir -p "$lib"
# A copy, not a link: a rebuild while CMD runs must not change its driver.
cp -f "$built" "$lib/libcuda.so.1.tmp.$$"
mv -f "$lib/libcuda.so.1.tmp.$$" "$lib/libcuda.so.1"
ln -sf libcuda.so.1 "$lib/libcuda.so"

nvrtc_dir=""
include=""
if wheels="$("$repo/scripts/cuda-wheels.sh" 2>/dev/null)"; then
    nvrtc_dir="$(sed -n 's/^NVRTC_LIB_DIR=//p' <<<"$wheels")"
    include="$(sed -n 's/^CUDA_INCLUDE=//p' <<<"$wheels")"
else
    echo "cuda-model: NVRTC wheels unavailable (scripts/cuda-wheels.sh failed); kernels will not compile" >&2
fi
export LD_LIBRARY_PATH="$lib${nvrtc_dir:+:$nvrtc_dir}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [[ -n "$include" && -z "${SNCL_CUDA_INCLUDE:-}" ]]; then
    export SNCL_CUDA_INCLUDE="$include"
fi
export SNCL_CUDA_MODEL=1
exec "$@"
