#!/usr/bin/env bash
# The compressed-gradient convergence study (docs/COMPRESSION.md): DDP over
# sncl on CPU, one small classifier trained with each codec of the
# compressed all-reduce, with and without error feedback, then the loss
# curves plotted.
#
#   scripts/convergence.sh [OUT]      # default OUT: target/convergence
#
# Sets up what it needs the way the PyTorch tests do (scripts/test-torch.sh
# --setup-only: torch in target/torch-venv, libsncl, the backend) and adds
# matplotlib to that virtualenv for the plot. Writes OUT/convergence.json
# and OUT/convergence.svg. Environment: NPROC (2 ranks), STEPS (2500), SEEDS (3).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/convergence}
TORCH_VENV=${TORCH_VENV:-$PWD/target/torch-venv}
scripts/test-torch.sh --setup-only
vpy=$TORCH_VENV/bin/python
"$vpy" -c "import matplotlib" 2>/dev/null || "$vpy" -m pip install --quiet matplotlib
OMP_NUM_THREADS=1 "$vpy" -m torch.distributed.run --standalone --nproc_per_node "${NPROC:-2}" \
    python/bench/convergence.py --out "$out" --steps "${STEPS:-2500}" --seeds "${SEEDS:-3}"
"$vpy" python/bench/plot_convergence.py "$out/convergence.json" "$out/convergence.svg"
echo "[convergence] $out/convergence.json, $out/convergence.svg"
