#!/usr/bin/env bash
# Deterministic mode's cost (docs/DETERMINISM.md): PAIRS interleaved
# launches of `commbench all_reduce` at one size, without and with
# SNCL_DETERMINISTIC=1, and the median of each mode's out-of-place time.
#
#   scripts/bench-deterministic.sh [SIZE] [NP]      # defaults: 64M 4
#
# Environment: PAIRS (8), ITERS (10), DTYPE (float).
set -euo pipefail
cd "$(dirname "$0")/.."
size=${1:-64M}
np=${2:-4}
pairs=${PAIRS:-8}
iters=${ITERS:-10}
cargo build --quiet --release -p commbench
bin=target/release/commbench
declare -a t0 t1
for _ in $(seq "$pairs"); do
    for mode in 0 1; do
        us=$(SNCL_DETERMINISTIC=$mode "$bin" all_reduce --np "$np" -b "$size" -e "$size" \
            -n "$iters" -w 3 -d "${DTYPE:-float}" | awk '!/^#/ && NF > 6 { t = $6 } END { print t }')
        if [ "$mode" = 0 ]; then t0+=("$us"); else t1+=("$us"); fi
    done
done
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
m0=$(median "${t0[@]}")
m1=$(median "${t1[@]}")
echo "all_reduce $size, $np ranks, $pairs launches each (out-of-place µs)"
echo "default:       median $m0   (${t0[*]})"
echo "deterministic: median $m1   (${t1[*]})"
awk -v a="$m0" -v b="$m1" 'BEGIN { printf "ratio deterministic / default: %.2f\n", b / a }'
