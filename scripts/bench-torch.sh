#!/usr/bin/env bash
# Times dist.all_reduce (float32, SUM) through torch with the "sncl" backend
# and with "gloo", in the same job (interleaved samples, medians), 1 KiB to
# 64 MiB in steps of 4, and writes a markdown table with the sncl / gloo
# bus-bandwidth ratio to target/bench-torch/results.md (JSON beside it).
#
#   scripts/bench-torch.sh [bench_allreduce.py options: --min-size 1K --max-size 64M --factor 4]
#
# Sets up like scripts/test-torch.sh (virtualenv with torch, libsncl, the
# backend). NPROC (default 4) processes; BENCH_CHECK=1 makes the exit status
# 3 when the targets (sncl >= 1.5x gloo busbw at >= 1 MiB, never slower)
# are missed.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
NPROC=${NPROC:-4}
TORCH_VENV=${TORCH_VENV:-$ROOT/target/torch-venv}
export TORCH_VENV
TARGET_DIR=${CARGO_TARGET_DIR:-${CARGO_BUILD_TARGET_DIR:-$ROOT/target}}
OUT=$TARGET_DIR/bench-torch
mkdir -p "$OUT"

scripts/test-torch.sh --setup-only

echo
echo "[bench-torch] all_reduce, $NPROC processes, sncl vs gloo (load average: $(cut -d' ' -f1-3 /proc/loadavg))"
OMP_NUM_THREADS=1 "$TORCH_VENV/bin/torchrun" --standalone --nproc_per_node "$NPROC" \
    python/bench/bench_allreduce.py --out "$OUT/results.md" --json "$OUT/results.json" "$@" \
    2> >(grep -v -E '^W[0-9]{4} .*(run.py|\*{5}|OMP_NUM_THREADS)|^W[0-9]{4} [0-9:. ]+[0-9]+ torch/distributed/run.py' >&2)
echo "[bench-torch] wrote $OUT/results.md"
