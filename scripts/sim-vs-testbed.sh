#!/usr/bin/env bash
# Predicted (commbench sim, after commbench calibrate) vs measured (commbench on
# the network-namespace test bed) for all_reduce, all_gather and reduce_scatter
# with hier, ring and flat-ring; prints a markdown table side by side.
# Needs root (scripts/testbed.sh); every bed is removed by testbed.sh itself
# and the temporary directory by the trap below.
#
# Environment (defaults):
#   CONFIGS="4x2:1gbit 2x4:1gbit 4x2:100mbit 2x4:100mbit"   NODESxRANKS:RATE
#   OPS="all_reduce all_gather reduce_scatter"
#   ALGOS="hier,ring,flat-ring"
#   MINB=4M MAXB=64M FACTOR=4      sizes
#   ITERS=3 WARMUP=1               most measured / warm-up iterations per size
#   BUDGET=1800                    seconds for the whole grid: after calibrating
#                                  a config, each op is simulated first and its
#                                  iterations are cut (to 1, without warm-up at
#                                  the least) so that twice the predicted time
#                                  fits the op's share of what is left; the
#                                  table says how many ran (the full grid at
#                                  100 Mbit/s gets 1 iteration of its largest
#                                  sizes; a quiet machine is assumed)
#   PLACEMENT=round-robin          or node-major
#   COMMBENCH=target/release/commbench (built if missing)
#   KEEP=DIR                       keep the JSON files in DIR
#   PACING=                        SNCL_TCP_PACING values to measure one after another
#                                  per op (e.g. "off auto"); when set, the measured
#                                  ranks also get SNCL_TOPO_FILE = the calibrated file
#                                  (auto paces to its inter.bandwidth), and the table
#                                  has one row per value; empty: neither is set
#   BED_ARGS=                      more scripts/testbed.sh options for every bed, e.g.
#                                  "--host-latency 200ms" (a host-sized upload queue)
#   BED_TIMEOUT=1800               seconds per measured op (testbed.sh --timeout;
#                                  2x4 at 100 Mbit/s all_reduce needs > 600)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CONFIGS=${CONFIGS:-"4x2:1gbit 2x4:1gbit 4x2:100mbit 2x4:100mbit"}
OPS=${OPS:-"all_reduce all_gather reduce_scatter"}
ALGOS=${ALGOS:-hier,ring,flat-ring}
MINB=${MINB:-4M} MAXB=${MAXB:-64M} FACTOR=${FACTOR:-4}
ITERS=${ITERS:-3} WARMUP=${WARMUP:-1}
PLACEMENT=${PLACEMENT:-round-robin}
BED_TIMEOUT=${BED_TIMEOUT:-1800}
BUDGET=${BUDGET:-1800}
COMMBENCH=${COMMBENCH:-$ROOT/target/release/commbench}
[[ $(id -u) == 0 ]] || { echo "sim-vs-testbed: needs root (network namespaces, tc)" >&2; exit 2; }
if [[ ! -x $COMMBENCH ]]; then
    echo "# building commbench (cargo build --release --bin commbench)" >&2
    (cd "$ROOT" && cargo build --release --bin commbench) >&2
fi
COMMBENCH=$(cd "$(dirname "$COMMBENCH")" && pwd)/$(basename "$COMMBENCH")
WORK=$(mktemp -d /tmp/sncl-simvs.XXXXXX)
cleanup() { [[ -n ${KEEP:-} ]] && mkdir -p "$KEEP" && cp -r "$WORK"/. "$KEEP"/; rm -rf "$WORK"; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
start=$(date +%s)
pairs_left=0
for cfg in $CONFIGS; do for op in $OPS; do pairs_left=$((pairs_left + 1)); done; done
echo "# start: load $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores, budget $BUDGET s" >&2
for cfg in $CONFIGS; do
    shape=${cfg%%:*} rate=${cfg#*:}
    nodes=${shape%x*} rpn=${shape#*x}
    tag="${shape}-${rate}"
    # shellcheck disable=SC2206 # BED_ARGS is a list of words on purpose
    bed=("$ROOT/scripts/testbed.sh" --nodes "$nodes" --ranks-per-node "$rpn" --rate "$rate" --placement "$PLACEMENT" --timeout "$BED_TIMEOUT" ${BED_ARGS:-})
    burst=$( [[ $rate == 100mbit ]] && echo 128K || echo 1M )
    echo "# $tag: calibrating ($(uptime | sed 's/.*load/load/'))" >&2
    "${bed[@]}" -- "$COMMBENCH" calibrate -o "$WORK/topo-$tag.txt" --size 8M -n 3 --burst "$burst" >"$WORK/cal-$tag.log" 2>&1 \
        || { cat "$WORK/cal-$tag.log" >&2; exit 1; }
    for op in $OPS; do
        "$COMMBENCH" sim "$op" --topo "$WORK/topo-$tag.txt" -b "$MINB" -e "$MAXB" -f "$FACTOR" \
            --algo "$ALGOS" --json "$WORK/sim-$tag-$op.json" >"$WORK/sim-$tag-$op.log"
        pairs_left=$(( pairs_left - 1 ))
        elapsed=$(( $(date +%s) - start ))
        # Iterations that fit: 2 x the predicted time of (warm-up + measured)
        # iterations of every algorithm and size within this op's share.
        read -r iters warm < <(python3 - "$WORK/sim-$tag-$op.json" "$ITERS" "$WARMUP" \
            "$(( (BUDGET - elapsed) / (pairs_left + 1) ))" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1])); iters, warm, share = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
one = 2.0 * sum(r["median_us"] for r in rows) / 1e6  # s per iteration of all sizes and algorithms
while iters + warm > 1 and one * (iters + warm) > share:
    if warm > 0: warm -= 1
    else: iters -= 1
print(iters, warm)
PY
        )
        for mode in ${PACING:--}; do
            sfx=$op$([[ $mode == - ]] || echo "-pace_$mode")
            envs=()
            [[ $mode == - ]] || envs=(SNCL_TOPO_FILE="$WORK/topo-$tag.txt" SNCL_TCP_PACING="$mode")
            load=$(cut -d' ' -f1-3 /proc/loadavg)
            echo "$iters $warm $load" >"$WORK/iters-$tag-$sfx.txt"
            echo "# $tag: measuring $op ${envs[*]}, $iters iteration(s) + $warm warm-up (load $load; $elapsed s so far)" >&2
            env "${envs[@]}" "${bed[@]}" -- "$COMMBENCH" "$op" -b "$MINB" -e "$MAXB" -f "$FACTOR" -n "$iters" -w "$warm" -c 0 \
                --algo "$ALGOS" --stats --json "$WORK/meas-$tag-$sfx.json" >"$WORK/meas-$tag-$sfx.log" 2>&1 \
                || { tail -20 "$WORK/meas-$tag-$sfx.log" >&2; exit 1; }
            echo " $(cut -d' ' -f1-3 /proc/loadavg)" >>"$WORK/iters-$tag-$sfx.txt"
        done
    done
done
python3 - "$WORK" "$CONFIGS" "$OPS" "$PLACEMENT" "${PACING:--}" <<'PY'
import json, os, re, sys
work, configs, ops, placement = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), sys.argv[4]
modes = sys.argv[5].split()
print(f"| config | op | SNCL_TCP_PACING | algo | size | iters | load (1/5/15 min, before; after) | measured median (ms) | predicted (ms) | predicted / measured | retransmits |")
print("|---|---|---|---|---:|---:|---|---:|---:|---:|---:|")
worst = 0.0; within = 0; total = 0
for cfg in configs:
    shape, rate = cfg.split(":"); tag = f"{shape}-{rate}"
    for op, mode in [(o, m) for o in ops for m in modes]:
        sfx = op if mode == "-" else f"{op}-pace_{mode}"
        try:
            meas = json.load(open(f"{work}/meas-{tag}-{sfx}.json"))
            sim = json.load(open(f"{work}/sim-{tag}-{op}.json"))
        except OSError:
            continue
        # commbench --stats: one retransmit line per --algo run, in order.
        log = open(f"{work}/meas-{tag}-{sfx}.log", errors="replace").read()
        rts = re.findall(r"# TCP retransmitted segments[^:]*: (\d+)", log)
        algos = list(dict.fromkeys(r["algo"] for r in meas))
        pred = {(r["algo"], r["size"]): r["median_us"] for r in sim}
        for r in meas:
            p = pred.get((r["algo"], r["size"]))
            if p is None: continue
            m = r["median_us"]; ratio = p / m; total += 1
            within += abs(ratio - 1) <= 0.15; worst = max(worst, abs(ratio - 1))
            it = open(f"{work}/iters-{tag}-{sfx}.txt").read().split()
            load = f"{' '.join(it[2:5])}; {' '.join(it[5:8])}"
            ai = algos.index(r["algo"])
            rt = rts[ai] if len(rts) == len(algos) else (f"{rts[-1]} (all algos)" if rts else "-")
            print(f"| {shape} {rate} {placement} | {op} | {mode} | {r['algo']} | {r['size']>>20} MiB | {it[0]}+{it[1]} | {load} | {m/1e3:.1f} | {p/1e3:.1f} | {ratio:.3f} | {rt} |")
print(f"\n{within} of {total} rows within 15 %; worst deviation {worst*100:.1f} %")
for cfg in configs:
    shape, rate = cfg.split(":"); tag = f"{shape}-{rate}"
    f = f"{work}/topo-{tag}.txt"
    if os.path.exists(f):
        print(f"\ncalibrated {tag}: " + "; ".join(l.strip() for l in open(f) if l.strip() and not l.startswith("#")))
PY
echo "# done in $(( $(date +%s) - start )) s" >&2
