#!/usr/bin/env bash
# compare-builds.sh OLD NEW - "no slowdown" check between two commbench binaries.
#
# Runs both binaries interleaved (old, new, old, new, ...) REPS times over shm and
# tcp, 2 ranks, all_reduce at 8 B, 64 KiB, 1 MiB and 64 MiB (out of place), and
# prints one markdown row per point: medians, new/old (busbw; time for 8 B, as
# old/new so that higher is better everywhere), and both ranges. A point passes
# when the ratio is >= 0.95 or the medians lie within each other's range.
#
# Usage: scripts/compare-builds.sh target/old/commbench target/release/commbench
# Environment: REPS=7, TRANSPORTS="shm tcp", POINTS="8:3000 65536:500 ..." (size in
# bytes:iterations, replacing the default points).
set -eu
old=${1:?old commbench binary}
new=${2:?new commbench binary}
reps=${REPS:-7}
transports=${TRANSPORTS:-shm tcp}
# size in bytes and iterations per run (8 B needs many for a stable median)
points=("8 3000" "65536 500" "1048576 100" "67108864 5")
if [ -n "${POINTS:-}" ]; then
    points=()
    for p in $POINTS; do points+=("${p%%:*} ${p##*:}"); done
fi

# One run: prints the out-of-place column (time in us for 8 B, busbw GB/s else).
one() {
    local bin=$1 transport=$2 size=$3 iters=$4
    # shm: the automatic choice (one node), which older binaries also understand
    local force=SNCL_TRANSPORT=$transport
    [ "$transport" = shm ] && force=SNCL_TRANSPORT_UNSET=1
    env -u SNCL_TRANSPORT "$force" "$bin" all_reduce -b "$size" -e "$size" -n "$iters" -w 20 --np 2 2>/dev/null |
        awk -v s="$size" '$1 == s && !done { if (s == 8) print $6; else print $8; done = 1 }' || true
}

median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
range() { sort -g | awk 'NR==1 {lo=$1} {hi=$1} END {printf "%s–%s", lo, hi}'; }

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
echo "| transport | size | old (median) | new (median) | new/old | old range | new range |"
echo "|---|---|---:|---:|---:|---|---|"
for t in $transports; do
    for p in "${points[@]}"; do
        read -r size iters <<<"$p"
        o=(); n=()
        for _ in $(seq "$reps"); do
            o+=("$(one "$old" "$t" "$size" "$iters")")
            n+=("$(one "$new" "$t" "$size" "$iters")")
        done
        om=$(printf '%s\n' "${o[@]}" | median)
        nm=$(printf '%s\n' "${n[@]}" | median)
        if [ "$size" = 8 ]; then
            ratio=$(awk -v a="$om" -v b="$nm" 'BEGIN {printf "%.2f (time old/new)", a / b}')
            unit=" µs"
        else
            ratio=$(awk -v a="$om" -v b="$nm" 'BEGIN {printf "%.2f", b / a}')
            unit=" GB/s"
        fi
        echo "| $t | $size B | $om$unit | $nm$unit | $ratio | $(printf '%s\n' "${o[@]}" | range) | $(printf '%s\n' "${n[@]}" | range) |"
    done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
