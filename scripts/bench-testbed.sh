#!/usr/bin/env bash
# bench-testbed.sh - reproduce the two-tier test-bed targets (NODES nodes x RPN ranks,
# every node link tbf-limited to RATE) and print them as a markdown table.
#
# Usage (as root, from anywhere):
#   scripts/bench-testbed.sh
#   SIZE=4M ITERS=1 scripts/bench-testbed.sh          # quick check of the plumbing
#   RATE=100mbit NODES=2 RPN=4 scripts/bench-testbed.sh
#
# What it does:
#   1. builds target/release/commbench if it is missing (or always with BUILD=1);
#   2. runs five scripts/testbed.sh invocations, each with --measure, so that every
#      row is compared with the TCP goodput of one node link measured in the same run
#      (just before the collective, same bed, same tbf settings):
#        rr-default  round-robin placement (rank r on node r % NODES), all_reduce with
#                    the planner's default (no --algo), with --stats and --stats-json
#        rr-algos    round-robin, all_reduce --algo hier,ring,flat-ring (one after another)
#        nm-default  node-major placement (rank r on node r / RPN), all_reduce default,
#                    with --stats and --stats-json
#        ag-default  AG_PLACEMENT (default round-robin), all_gather default
#        rs-default  AG_PLACEMENT (default round-robin), reduce_scatter default
#      All with f32 sum, -b SIZE -e SIZE -n ITERS -w 1 -c 1 (results checked).
#   3. prints the targets and every measured row as markdown on stdout and writes the
#      same text, with the exact commands used, to OUT.
#
# Definitions (N = NODES, L = RPN, S = the row's "size" in bytes, g = goodput in B/s):
#   time of a row       out-of-place "median_us" (the median over ITERS of the per-
#                       iteration maximum over ranks); out-of-place "time_us" (mean) if
#                       the row has no median
#   inter-node bound    all_reduce: 2(N-1)/N x S / g; all_gather, reduce_scatter (S is
#                       the total size): (N-1)/N x S / g. The bytes a bandwidth-optimal
#                       algorithm must push through one node link over its goodput.
#   ratio to the bound  bound time / measured time (1.0 = at the bound); goal >= 0.85
#   speedup             flat-ring time (rr-algos) / default time (rr-default); goal >= 2.0
#   cross-tier share    measured: total inter_sent / total (intra_sent + inter_sent) over
#                       all ranks from --stats-json (the same quantity as the "# total:"
#                       line of --stats, which is shown as well); theory for hier
#                       all_reduce: inter = 2(N-1)/N x S/L, intra = 2(L-1)/L x S per rank,
#                       share = inter / (inter + intra); pass when |measured - theory| <=
#                       1e-6 and the default algorithm is hier.
#
# Environment:
#   NODES=4  RPN=2  RATE=1gbit  SIZE=64M (K/M/G = powers of 1024)  ITERS=3
#   AG_PLACEMENT=round-robin   placement of the all_gather / reduce_scatter runs
#                              (round-robin or node-major)
#   MEASURE_SECONDS=2          testbed.sh --measure-seconds
#   TIMEOUT=900                testbed.sh --timeout for one run (seconds)
#   DIR=target/bench-testbed   JSON, stdout/stderr and per-rank logs of every run
#   OUT=$DIR/results.md        the markdown report
#   BUILD=0                    1: run cargo build --release -p commbench even if the
#                              binary exists
#   CALIBRATE=1                run `commbench calibrate` on the bed (round-robin) once
#                              before the runs and give every run SNCL_TOPO_FILE=
#                              $DIR/topo.txt, so the planner's default prices the tiers
#                              this bed has (without it the planner uses its built-in
#                              tiers, 8x faster than a 1 Gbit/s bed); 0: the built-in ones
#
# Compressed mode (COMPRESSED=1): instead of the runs above, the compressed all_reduce on
# the round-robin bed: for each of CREPS interleaved repetitions, uncompressed (--algo
# hier) then --compress each of CCODECS (default int8 fp16 topk:0.01 mxfp8 mxfp4), f32
# sum, -b CSIZE -e CSIZE -n CITERS
# -w 1 -c 1 at CRATE, no --measure. Every rank runs under a wrapper that reads its
# node namespace's TCP RetransSegs (/proc/net/snmp) before and after; local rank 0 of
# each node reports the difference, and a run's retransmits are the sum over nodes.
# Prints medians, speedups vs uncompressed (same repetition's runs) and retransmits
# as markdown (also written to $DIR/compressed.md); targets int8 >= 3.0x,
# fp16 >= 1.8x, top-k 1 % >= 8x, mxfp8 >= 3.6x, mxfp4 >= 6.5x. Environment: CRATE=100mbit CSIZE=16M CITERS=3
# CREPS=5, BIN=commbench (target/release/commbench, built by testbed.sh if missing; a
# path runs that binary instead and builds nothing). CPACING="off" is the list of
# SNCL_TCP_PACING values each repetition runs every codec with (e.g. "off auto"; the
# table has a block per value, speedups against the same value's uncompressed run);
# with CALIBRATE=1 (the default) or when it names auto, `commbench calibrate` runs
# once on the bed first and every run gets SNCL_TOPO_FILE=$DIR/topo.txt (auto paces
# to its inter.bandwidth; the compressed exchange's own pacing, SNCL_COMPRESS_PACING
# = auto by default, needs it too).
#
# Exit status: 0 when every target passes, 1 when some target fails (the table is
# written either way), 2 on a usage or set-up error or when a test-bed run fails
# (the remaining runs still run and the table marks what is missing).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PROG=bench-testbed.sh
cd "$ROOT"

NODES=${NODES:-4}
RPN=${RPN:-2}
RATE=${RATE:-1gbit}
SIZE=${SIZE:-64M}
ITERS=${ITERS:-3}
AG_PLACEMENT=${AG_PLACEMENT:-round-robin}
MEASURE_SECONDS=${MEASURE_SECONDS:-2}
TIMEOUT=${TIMEOUT:-900}
DIR=${DIR:-target/bench-testbed}
OUT=${OUT:-$DIR/results.md}
BUILD=${BUILD:-0}

die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 2; }
note() { printf '%s\n' "$*" >&2; }

is_uint() { [[ $1 =~ ^[0-9]+$ ]]; }
if ! is_uint "$NODES" || ((NODES < 2)); then die "NODES must be a whole number >= 2"; fi
if ! is_uint "$RPN" || ((RPN < 1)); then die "RPN must be a whole number >= 1"; fi
if ! is_uint "$ITERS" || ((ITERS < 1)); then die "ITERS must be a whole number >= 1"; fi
is_uint "$TIMEOUT" || die "TIMEOUT must be a whole number of seconds"
[[ $SIZE =~ ^[0-9]+[KkMmGg]?$ ]] || die "SIZE must be bytes with an optional K/M/G suffix"
case $AG_PLACEMENT in
    node-major | round-robin) ;;
    *) die "AG_PLACEMENT must be node-major or round-robin" ;;
esac
[[ $(id -u) -eq 0 ]] || die "needs root (scripts/testbed.sh uses network namespaces and tc)"
PYTHON=$(command -v python3) || die "python3 is needed to read the JSON results"

# ---------------------------------------------------------------- compressed mode
if [[ ${COMPRESSED:-0} == 1 ]]; then
    CRATE=${CRATE:-100mbit}
    CSIZE=${CSIZE:-16M}
    CITERS=${CITERS:-3}
    CREPS=${CREPS:-5}
    CB=${BIN:-commbench}
    if [[ $CB == commbench ]]; then
        # The retransmit wrapper is the command's first word, so testbed.sh does not
        # resolve `commbench` here: use (and build if missing) the release binary.
        CB=$ROOT/target/release/commbench
        [[ -x $CB ]] || (cd "$ROOT" && cargo build --release -p commbench) >&2 ||
            die "cargo build failed"
    fi
    mkdir -p "$DIR"
    is_uint "$CREPS" && ((CREPS >= 1)) || die "CREPS must be a whole number >= 1"
    is_uint "$CITERS" && ((CITERS >= 1)) || die "CITERS must be a whole number >= 1"
    WRAP=$DIR/retrans-wrap.sh
    cat >"$WRAP" <<'WRAPPER'
#!/bin/sh
# Runs "$@"; local rank 0 prints the node namespace's TCP RetransSegs delta.
rs() { awk '/^Tcp:/ { n++; if (n == 2) print $13 }' /proc/net/snmp; }
r0=$(rs)
"$@"
st=$?
r1=$(rs)
if [ "${SNCL_LOCAL_RANK:-0}" = 0 ]; then echo "# retrans $SNCL_NODE_ID $((r1 - r0))" >&2; fi
exit $st
WRAPPER
    chmod +x "$WRAP"
    CTSV=$DIR/compressed.tsv
    : >"$CTSV"
    CPACING=${CPACING:-off}
    CCODECS=${CCODECS:-int8 fp16 topk:0.01 mxfp8 mxfp4}
    PENV=()
    if [[ " $CPACING " == *" auto "* || ${CALIBRATE:-1} == 1 ]]; then
        TOPO=$(cd "$DIR" && pwd)/topo.txt
        note "# calibrating the bed (SNCL_TOPO_FILE for the runs): $TOPO"
        scripts/testbed.sh --nodes "$NODES" --ranks-per-node "$RPN" --rate "$CRATE" \
            --placement round-robin --timeout "$TIMEOUT" -- "$CB" calibrate -o "$TOPO" \
            --size 8M -n 3 >"$DIR/calibrate.log" 2>&1 || die "calibration failed: $DIR/calibrate.log"
        PENV=(SNCL_TOPO_FILE="$TOPO")
    fi
    for rep in $(seq 1 "$CREPS"); do
        for pace in $CPACING; do
        for codec in none $CCODECS; do
            if [[ $codec == none ]]; then extra=(--algo hier); else extra=(--compress "$codec"); fi
            name=c$rep-$pace-${codec//[:.]/_}
            logs=$DIR/logs/$name json=$DIR/$name.json
            rm -rf "$logs" "$json"
            cmd=(env "${PENV[@]}" SNCL_TCP_PACING="$pace"
                scripts/testbed.sh --nodes "$NODES" --ranks-per-node "$RPN" --rate "$CRATE"
                --placement round-robin --timeout "$TIMEOUT" --keep-logs "$logs"
                -- "$WRAP" "$CB" all_reduce -b "$CSIZE" -e "$CSIZE" -n "$CITERS" -w 1 -c 1
                -d float -o sum "${extra[@]}" --json "$json")
            note "# [$name] ${cmd[*]}"
            st=0
            "${cmd[@]}" >"$DIR/$name.stdout" 2>"$DIR/$name.stderr" || st=$?
            rt=$(cat "$logs"/rank*.log "$DIR/$name.stderr" 2>/dev/null |
                awk '/^# retrans/ { r[$3] = $4 } END { s = 0; for (k in r) s += r[k]; print s }')
            printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$rep" "$codec" "$st" "$json" "$rt" "$pace" >>"$CTSV"
            ((st == 0)) || note "# [$name] FAILED (exit $st, logs $logs)"
        done
        done
    done
    st=0
    "$PYTHON" - "$CTSV" "$NODES" "$RPN" "$CRATE" "$CSIZE" "$CITERS" "$CCODECS" >"$DIR/compressed.md" <<'PY' || st=$?
import json, os, statistics, sys, time
tsv, N, L, rate, size, iters, codecs = sys.argv[1:]
rows = {}
paces = []
for line in open(tsv):
    rep, codec, st, jpath, rt, pace = line.rstrip("\n").split("\t")
    if pace not in paces:
        paces.append(pace)
    t = None
    if st == "0":
        try:
            o = json.load(open(jpath))[0].get("oop") or {}
            t = float(o.get("median_us") or o.get("time_us")) / 1e3
        except (OSError, ValueError, IndexError, TypeError):
            pass
    rows.setdefault((pace, rep), {})[codec] = (t, int(rt or 0))
goal = {"int8": 3.0, "fp16": 1.8, "topk:0.01": 8.0, "mxfp8": 3.6, "mxfp4": 6.5}
print("# compressed all_reduce, test bed %s nodes x %s ranks round-robin, %s, %s f32, -n %s"
      % (N, L, rate, size, iters))
print("")
print("%s on %s (%d CPUs, load %s); %d interleaved repetitions; speedup = the same "
      "repetition's uncompressed time / codec time, median over repetitions."
      % (time.strftime("%Y-%m-%d %H:%M:%S %Z"), os.uname().nodename, os.cpu_count() or 0,
         " ".join(open("/proc/loadavg").read().split()[:3]), len({rep for _, rep in rows})))
print("")
print("| SNCL_TCP_PACING | codec | median time | speedup (median) | speedups | retransmits (median) | goal | result |")
print("|---|---|---:|---:|---|---:|---|---|")
ok = True
for pace in paces:
  prow = [r for (p, _), r in rows.items() if p == pace]
  for codec in ["none"] + codecs.split():
    ts = [r[codec][0] for r in prow if r.get(codec, (None,))[0]]
    rts = [r[codec][1] for r in prow if codec in r]
    sps = [r["none"][0] / r[codec][0] for r in prow
           if r.get(codec, (None,))[0] and r.get("none", (None,))[0]]
    sp = statistics.median(sps) if sps else 0.0
    g = goal.get(codec)
    res = "" if g is None else ("PASS" if sp >= g else "FAIL")
    ok &= g is None or sp >= g
    print("| %s | %s | %s | %.2fx | %s | %s | %s | %s |" % (
        pace, codec, "%.1f ms" % statistics.median(ts) if ts else "-", sp,
        " ".join("%.2f" % x for x in sps), int(statistics.median(rts)) if rts else "-",
        ">= %.1fx" % g if g else "", res))
sys.exit(0 if ok else 1)
PY
    cat "$DIR/compressed.md"
    note "# report written to $DIR/compressed.md"
    exit "$st"
fi

# ---------------------------------------------------------------- build
COMMBENCH=target/release/commbench
if [[ $BUILD == 1 || ! -x $COMMBENCH ]]; then
    command -v cargo >/dev/null || die "$COMMBENCH is missing and cargo is not installed"
    note "# building commbench: cargo build --release -p commbench"
    cargo build --release -p commbench >&2 || die "cargo build failed"
fi

mkdir -p "$DIR" "$(dirname "$OUT")"
MANIFEST=$DIR/manifest.tsv
: >"$MANIFEST"

# ---------------------------------------------------------------- calibration
RUN_ENV=()
if [[ ${CALIBRATE:-1} == 1 && ${COMPRESSED:-0} != 1 ]]; then
    TOPO=$(cd "$DIR" && pwd)/topo.txt
    note "# calibrating the bed (commbench calibrate): $TOPO"
    scripts/testbed.sh --nodes "$NODES" --ranks-per-node "$RPN" --rate "$RATE" \
        --placement round-robin --timeout "$TIMEOUT" -- commbench calibrate -o "$TOPO" \
        --size 8M -n 3 >"$DIR/calibrate.log" 2>&1 || die "calibration failed: $DIR/calibrate.log"
    grep -E '^(intra|inter)\.' "$TOPO" | sed 's/^/#   /' >&2 || true
    RUN_ENV=(SNCL_TOPO_FILE="$TOPO")
fi

# ---------------------------------------------------------------- runs
RUN_FAILED=0

# run NAME PLACEMENT OP [COMMBENCH ARGS...]: one testbed.sh invocation with --measure.
# Writes DIR/NAME.{json,stdout,stderr,cmd} (+ the args' own files), the per-rank logs in
# DIR/logs/NAME, and one manifest line: name placement op status goodput_bps json stdout.
run() {
    local name=$1 placement=$2 op=$3
    shift 3
    local json=$DIR/$name.json logs=$DIR/logs/$name
    local so=$DIR/$name.stdout se=$DIR/$name.stderr
    local cmd=(env "${RUN_ENV[@]}"
        scripts/testbed.sh --nodes "$NODES" --ranks-per-node "$RPN" --rate "$RATE"
        --placement "$placement" --measure --measure-seconds "$MEASURE_SECONDS"
        --timeout "$TIMEOUT" --keep-logs "$logs"
        -- commbench "$op" -b "$SIZE" -e "$SIZE" -n "$ITERS" -w 1 -c 1 -d float -o sum
        "$@" --json "$json")
    rm -rf "$logs" "$json" "$DIR/$name.stats.json"
    printf '%s\n' "${cmd[*]}" >"$DIR/$name.cmd"
    note "# [$name] ${cmd[*]}"
    local st=0 t0=$SECONDS
    "${cmd[@]}" >"$so" 2>"$se" || st=$?
    # rank 0's output and the bed's notes, for the record
    sed 's/^/    /' "$so" >&2
    grep -E '^# (link goodput|testbed|sncl-testbed|logs)|error|exited' "$se" | sed 's/^/    /' >&2 || true
    note "# [$name] exit status $st after $((SECONDS - t0)) s"
    # goodput of this run: testbed.sh's measure.out (exact bytes/s) if the logs kept it,
    # else its "# link goodput: ... (X MB/s" line on stderr
    local bps=
    if [[ -r $logs/measure.out ]]; then bps=$(<"$logs/measure.out"); fi
    if ! is_uint "${bps:-x}"; then
        bps=$(sed -n 's/^# link goodput: .*(\([0-9.]*\) MB\/s.*/\1/p' "$se" | head -n1)
        bps=$(awk -v m="${bps:-0}" 'BEGIN { printf "%.0f", m * 1e6 }')
    fi
    if ((st != 0)); then
        RUN_FAILED=1
        note "# [$name] FAILED; stderr:"
        tail -n 20 "$se" | sed 's/^/    /' >&2
    fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$placement" "$op" "$st" "$bps" "$json" "$so" >>"$MANIFEST"
}

run rr-default round-robin all_reduce --stats --stats-json "$DIR/rr-default.stats.json"
run rr-algos round-robin all_reduce --algo hier,ring,flat-ring
run nm-default node-major all_reduce --stats --stats-json "$DIR/nm-default.stats.json"
run ag-default "$AG_PLACEMENT" all_gather
run rs-default "$AG_PLACEMENT" reduce_scatter

# ---------------------------------------------------------------- table
REPORT=$DIR/report.md.tmp
st=0
"$PYTHON" - "$MANIFEST" "$DIR" "$NODES" "$RPN" "$RATE" "$SIZE" "$ITERS" >"$REPORT" <<'PY' || st=$?
import json, os, re, sys, time, platform
from fractions import Fraction

manifest, wdir, N, L, rate, size_arg, iters = sys.argv[1:]
N, L = int(N), int(L)

runs = {}
with open(manifest) as f:
    for line in f:
        name, placement, op, status, bps, jpath, spath = line.rstrip("\n").split("\t")
        r = dict(name=name, placement=placement, op=op, status=int(status),
                 bps=int(bps) if bps.isdigit() else 0, rows=[], stdout="")
        try:
            with open(jpath) as jf:
                r["rows"] = json.load(jf)
        except (OSError, ValueError):
            pass
        try:
            with open(spath) as sf:
                r["stdout"] = sf.read()
        except OSError:
            pass
        with open(os.path.join(wdir, name + ".cmd")) as cf:
            r["cmd"] = cf.read().strip()
        runs[name] = r


def row_time_us(row):
    o = row.get("oop") or {}
    t = o.get("median_us")
    return float(t) if t else float(o.get("time_us") or 0.0)


def bound_bytes(op, size):
    if op == "all_reduce":
        return Fraction(2 * (N - 1), N) * size
    return Fraction(N - 1, N) * size  # all_gather, reduce_scatter: size = total


def bound_us(op, size, bps):
    return float(bound_bytes(op, size)) / bps * 1e6 if bps > 0 else float("nan")


def find(name, algo=None):
    r = runs.get(name)
    if not r or not r["rows"]:
        return r, None
    for row in r["rows"]:
        if algo is None or row.get("algo") == algo:
            return r, row
    return r, None


def ms(us):
    return "%.1f ms" % (us / 1e3)


def missing(r):
    if r is None:
        return "not run"
    return "run failed (exit %d, logs %s)" % (r["status"], os.path.join(wdir, "logs", r["name"])) \
        if r["status"] else "no row"


targets = []  # (target, measured, reference, ratio, goal, ok)


def bound_target(label, name):
    r, row = find(name)
    if row is None or r["bps"] <= 0:
        targets.append((label, missing(r), "-", "-", ">= 0.85", False))
        return
    t = row_time_us(row)
    b = bound_us(r["op"], row["size"], r["bps"])
    ratio = b / t if t > 0 else 0.0
    targets.append((label, "%s (%s, %s)" % (ms(t), row.get("algo"), r["placement"]),
                    "bound %s = %.1f MB / %.1f MB/s" % (ms(b), float(bound_bytes(r["op"], row["size"])) / 1e6,
                                                         r["bps"] / 1e6),
                    "%.3f" % ratio, ">= 0.85", ratio >= 0.85))


# 1. round-robin all_reduce: default vs topology-unaware flat ring
rd, drow = find("rr-default")
ra, frow = find("rr-algos", "flat-ring")
if drow is None or frow is None:
    targets.append(("all_reduce round-robin: default / flat-ring speedup",
                    missing(rd) if drow is None else missing(ra), "-", "-", ">= 2.0", False))
else:
    td, tf = row_time_us(drow), row_time_us(frow)
    sp = tf / td if td > 0 else 0.0
    targets.append(("all_reduce round-robin: default / flat-ring speedup",
                    "default (%s) %s" % (drow.get("algo"), ms(td)), "flat-ring %s" % ms(tf),
                    "%.2fx" % sp, ">= 2.0x", sp >= 2.0))
# 2.-5. the inter-node bounds
bound_target("all_reduce round-robin default vs inter-node bound", "rr-default")
bound_target("all_reduce node-major default vs inter-node bound", "nm-default")
bound_target("all_gather default vs inter-node bound", "ag-default")
bound_target("reduce_scatter default vs inter-node bound", "rs-default")


# 6. cross-tier share of the default (hier) all_reduce, from --stats-json
def share_target(name):
    r, row = find(name)
    label = "cross-tier share, all_reduce %s default (--stats)" % (r["placement"] if r else name)
    path = os.path.join(wdir, name + ".stats.json")
    try:
        with open(path) as f:
            stats = json.load(f)
    except (OSError, ValueError):
        stats = None
    if row is None or not stats:
        targets.append((label, missing(r), "-", "-", "= theory", False))
        return
    inter = sum(s["inter_sent"] for s in stats)
    total = inter + sum(s["intra_sent"] for s in stats)
    share = inter / total if total else 0.0
    mean = sum(s["cross_tier_share"] for s in stats) / len(stats)
    m = re.search(r"^# total:.*cross-tier share ([0-9.]+)", r["stdout"], re.M)
    shown = m.group(1) if m else "?"
    S = row["size"]
    inter_t = Fraction(2 * (N - 1), N) * Fraction(S, L)
    intra_t = Fraction(2 * (L - 1), L) * S
    theory = float(inter_t / (inter_t + intra_t))
    algo = row.get("algo")
    ok = algo == "hier" and abs(share - theory) <= 1e-6
    targets.append((label,
                    "%.6f (total inter/sent; rank mean %.6f; --stats shows %s; algo %s)"
                    % (share, mean, shown, algo),
                    "theory %.6f (hier: 2(N-1)/N x S/L inter, 2(L-1)/L x S intra)" % theory,
                    "%+.1e" % (share - theory), "= theory", ok))


share_target("rr-default")
share_target("nm-default")

# ---------------------------------------------------------------- markdown
out = []
p = out.append
p("# sncl two-tier test bed: %d nodes x %d ranks, links %s, %s, f32 sum, -n %s -w 1 -c 1"
  % (N, L, rate, size_arg, iters))
p("")
p("%s on %s (%s, %d CPUs); medians of one run; link goodput measured by "
  "`testbed.sh --measure` at the start of each run." % (
      time.strftime("%Y-%m-%d %H:%M:%S %Z"), platform.node(), platform.release(), os.cpu_count() or 0))
p("")
p("## Targets")
p("")
p("| target | measured | bound / reference | ratio | goal | result |")
p("|---|---|---|---|---|---|")
for t, meas, ref, ratio, goal, ok in targets:
    p("| %s | %s | %s | %s | %s | %s |" % (t, meas, ref, ratio, goal, "PASS" if ok else "FAIL"))
p("")
p("## All rows")
p("")
p("| run | placement | op | algo | size (B) | link goodput | median | mean | busbw (GB/s) | bound | bound / median |")
p("|---|---|---|---|---|---|---|---|---|---|---|")
for r in runs.values():
    if not r["rows"]:
        p("| %s | %s | %s | - | - | %.1f MB/s | %s | - | - | - | - |"
          % (r["name"], r["placement"], r["op"], r["bps"] / 1e6, missing(r)))
    for row in r["rows"]:
        t = row_time_us(row)
        b = bound_us(r["op"], row["size"], r["bps"])
        o = row.get("oop") or {}
        p("| %s | %s | %s | %s | %d | %.1f MB/s | %s | %s | %.4f | %s | %.3f |" % (
            r["name"], r["placement"], r["op"], row.get("algo"), row["size"], r["bps"] / 1e6,
            ms(t), ms(float(o.get("time_us") or 0.0)), float(o.get("busbw") or 0.0), ms(b),
            b / t if t > 0 else 0.0))
p("")
p("## Commands")
p("")
p("From the repository root (testbed.sh runs `target/release/commbench` for `commbench`):")
p("")
p("```sh")
for r in runs.values():
    p(r["cmd"])
p("```")
print("\n".join(out))
sys.exit(0 if all(t[5] for t in targets) else 1)
PY
((st <= 1)) || die "building the table failed (python3 exit $st)"
mv "$REPORT" "$OUT"
cat "$OUT"
note "# report written to $OUT"
((!RUN_FAILED)) || exit 2
exit "$st"
