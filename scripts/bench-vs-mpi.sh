#!/usr/bin/env bash
# bench-vs-mpi.sh - side-by-side all-reduce benchmark: sncl's commbench vs Open MPI and Gloo.
#
# Usage (as root on Debian 12, from anywhere; idempotent):
#   scripts/bench-vs-mpi.sh
#   REPS=7 CONFIGS="shm2 tcp2" SIZES="8 1M 64M" scripts/bench-vs-mpi.sh
#
# What it does:
#   1. installs Open MPI from Debian if mpicc.openmpi is missing;
#   2. builds bench/mpi_allreduce.c and bench/memcpy_bw.c into target/bench-vs-mpi/ and
#      sncl's commbench (cargo build --release -p commbench);
#   3. runs REPS repetitions, interleaved (MPI, sncl, MPI, sncl, ...), of every configuration:
#        shm2  2 ranks, shared memory     (Open MPI defaults: ob1 + vader)
#        shm4  4 ranks, shared memory
#        tcp2  2 ranks, TCP over loopback (Open MPI: ob1, btl self,tcp on lo; sncl: SNCL_TRANSPORT=tcp)
#      plus a single-thread 64 MiB memcpy per repetition as the physical reference;
#      and, when a Python with torch is found (GLOO_PYTHON), torch's ProcessGroupGloo on the same
#      sizes (bench/gloo_allreduce.py under torchrun; Gloo has no shared-memory transport, so it
#      runs over loopback TCP in every config);
#   4. prints one table of medians across repetitions (stdout) and writes it as markdown to OUT.
#
# Both sides: float sum all-reduce, out-of-place, 5 warm-up ops, per-op median time;
# busbw = 2(n-1)/n * bytes / time (GB/s = 1e9 B/s). Progress goes to stderr.
#
# Environment:
#   REPS=5                           repetitions of each configuration
#   SIZES="8 64K 256K 1M 4M 16M 64M" message sizes (bytes, K/M/G suffixes = powers of 1024;
#                                    multiples of 4; spaces or commas)
#   CONFIGS="shm2 shm4 tcp2"         subset to run
#   MPI_SECONDS=0.5                  time budget per size for the MPI bench (the name SECONDS
#                                    cannot be used: it is a bash builtin variable)
#   SNCL_SECONDS=0.4                 target run time per size for commbench's out-of-place
#                                    loop; -n per config and size comes from one short
#                                    calibration run (-n 5) before the repetitions (commbench
#                                    also runs in place, so a size takes about twice this)
#   OUT=target/bench-vs-mpi/results.md  markdown table
#   MPI_BIND="--bind-to none"        Open MPI binding flags (empty string = Open MPI default)
#   MPI_EXTRA=""                     extra mpirun flags for every MPI run
#   SNCL_ARGS=""                     extra commbench flags for every sncl run
#   COMMBENCH=target/release/commbench  binary to run
#   SNCL_BUILD=1                     0: do not run cargo build (COMMBENCH must exist)
#   SKIP_SNCL=0                      1: Open MPI and memcpy only
#   GLOO=auto                        1: run Gloo (fail without torch), 0: skip it, auto: run it
#                                    when GLOO_PYTHON imports torch
#   GLOO_PYTHON=target/torch-venv/bin/python  the Python with torch (scripts/test-torch.sh
#                                    --venv-only makes it)
#   RUN_TIMEOUT=900                  seconds before one benchmark process is killed
#   WAIT_IDLE=120                    before each config's MPI+sncl pair, wait up to this many
#                                    seconds for the CPUs to be idle (other processes < BUSY_PCT
#                                    % busy); pairs started on a busy machine are counted and
#                                    reported. On 2 shared cores a concurrent cargo build makes
#                                    spinning ranks starve (8 B all-reduce: 0.2 us -> 8 ms).
#   BUSY_PCT=15
#   BUSY_RETRIES=2                   if the CPUs are busy right after a pair, discard and rerun
#                                    it (up to this many times; then keep it and count it)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK=$ROOT/target/bench-vs-mpi

REPS=${REPS:-5}
SIZES=${SIZES:-"8 64K 256K 1M 4M 16M 64M"}
CONFIGS=${CONFIGS:-"shm2 shm4 tcp2"}
MPI_SECONDS=${MPI_SECONDS:-0.5}
SNCL_SECONDS=${SNCL_SECONDS:-0.4}
OUT=${OUT:-$WORK/results.md}
MPI_BIND=${MPI_BIND---bind-to none}
MPI_EXTRA=${MPI_EXTRA:-}
SNCL_ARGS=${SNCL_ARGS:-}
COMMBENCH=${COMMBENCH:-$ROOT/target/release/commbench}
SNCL_BUILD=${SNCL_BUILD:-1}
SKIP_SNCL=${SKIP_SNCL:-0}
GLOO=${GLOO:-auto}
GLOO_PYTHON=${GLOO_PYTHON:-$ROOT/target/torch-venv/bin/python}
RUN_TIMEOUT=${RUN_TIMEOUT:-900}
WAIT_IDLE=${WAIT_IDLE:-120}
BUSY_PCT=${BUSY_PCT:-15}
BUSY_RETRIES=${BUSY_RETRIES:-2}

WARMUP=5
SNCL_MIN_ITERS=5
SNCL_MAX_ITERS=200000
MEMCPY_BYTES=$((64 << 20))
MPIRUN=(mpirun.openmpi --allow-run-as-root --oversubscribe)
MPI_TCP=(--mca pml ob1 --mca btl 'self,tcp' --mca btl_tcp_if_include lo --mca mpi_yield_when_idle 1)

log() { printf '[bench-vs-mpi %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { printf 'bench-vs-mpi: error: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------- arguments
to_bytes() {
    local s=${1^^} mult=1
    s=${s%B}
    case $s in
        *K) mult=1024; s=${s%K} ;;
        *M) mult=$((1 << 20)); s=${s%M} ;;
        *G) mult=$((1 << 30)); s=${s%G} ;;
    esac
    [[ $s =~ ^[0-9]+$ ]] || die "bad size '$1' in SIZES"
    echo $((10#$s * mult))
}

SIZE_LIST=()
for s in ${SIZES//,/ }; do
    b=$(to_bytes "$s")
    ((b > 0 && b % 4 == 0)) || die "size '$s' must be a positive multiple of 4 bytes (float)"
    SIZE_LIST+=("$b")
done
((${#SIZE_LIST[@]} > 0)) || die "SIZES is empty"

CONFIG_LIST=()
for c in ${CONFIGS//,/ }; do
    case $c in shm2 | shm4 | tcp2) CONFIG_LIST+=("$c") ;; *) die "unknown config '$c' (use shm2, shm4, tcp2)" ;; esac
done
((${#CONFIG_LIST[@]} > 0)) || die "CONFIGS is empty"
[[ $REPS =~ ^[1-9][0-9]*$ ]] || die "REPS must be a positive integer"
[[ "$WAIT_IDLE $BUSY_PCT $BUSY_RETRIES $RUN_TIMEOUT" =~ ^[0-9]+\ [0-9]+\ [0-9]+\ [0-9]+$ ]] ||
    die "WAIT_IDLE, BUSY_PCT, BUSY_RETRIES and RUN_TIMEOUT must be non-negative integers"
[[ $MPI_SECONDS =~ ^[0-9]*\.?[0-9]+$ ]] || die "MPI_SECONDS must be a number"
[[ $SNCL_SECONDS =~ ^[0-9]*\.?[0-9]+$ ]] || die "SNCL_SECONDS must be a number"
[[ $OUT = /* ]] || OUT=$PWD/$OUT

ranks_of() { echo "${1: -1}"; }

# ---------------------------------------------------------------- 1. Open MPI
PKGS=()
if ! command -v mpicc.openmpi >/dev/null 2>&1 || ! command -v mpirun.openmpi >/dev/null 2>&1; then
    PKGS+=(openmpi-bin libopenmpi-dev)
fi
command -v gcc >/dev/null 2>&1 || PKGS+=(gcc) # mpicc.openmpi wraps gcc
if ((${#PKGS[@]} > 0)); then
    log "installing ${PKGS[*]} from Debian"
    ((EUID == 0)) || die "${PKGS[*]} missing and installing needs root"
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y "${PKGS[@]}"
fi
command -v python3 >/dev/null 2>&1 || die "python3 is required"
command -v timeout >/dev/null 2>&1 || die "timeout (coreutils) is required"

# ---------------------------------------------------------------- 2. builds
mkdir -p "$WORK/logs" "$(dirname "$OUT")"
MPI_BENCH=$WORK/mpi_allreduce
MEMCPY_BENCH=$WORK/memcpy_bw
log "building $MPI_BENCH and $MEMCPY_BENCH"
mpicc.openmpi -O2 -Wall -o "$MPI_BENCH" "$ROOT/bench/mpi_allreduce.c"
gcc -O2 -Wall -o "$MEMCPY_BENCH" "$ROOT/bench/memcpy_bw.c"

if [[ $SKIP_SNCL != 1 ]]; then
    if [[ $SNCL_BUILD == 1 ]]; then
        [[ -x $HOME/.cargo/bin/cargo ]] && ! command -v cargo >/dev/null 2>&1 && PATH=$HOME/.cargo/bin:$PATH
        command -v cargo >/dev/null 2>&1 || die "cargo not found; install Rust or set SNCL_BUILD=0 with COMMBENCH pointing at a built commbench"
        log "building commbench (cargo build --release -p commbench)"
        if ! (cd "$ROOT" && cargo build --release -p commbench >&2); then
            die "cargo build --release -p commbench failed (see above); not benchmarking a stale or missing binary"
        fi
    fi
    [[ -x $COMMBENCH ]] || die "commbench binary not found at $COMMBENCH (build: cargo build --release -p commbench)"
fi

if [[ $GLOO != 0 ]]; then
    if "$GLOO_PYTHON" -c 'import torch.distributed' >/dev/null 2>&1; then
        GLOO=1
    elif [[ $GLOO == 1 ]]; then
        die "GLOO=1 but $GLOO_PYTHON cannot import torch (make it: scripts/test-torch.sh --venv-only)"
    else
        log "Gloo skipped: $GLOO_PYTHON cannot import torch (scripts/test-torch.sh --venv-only makes it)"
        GLOO=0
    fi
fi

# ---------------------------------------------------------------- helpers
RAW=$WORK/raw.tsv # config impl rep size_bytes time_us ok
PENDING=$WORK/pending.tsv # rows of the MPI+sncl pair in progress
printf 'config\timpl\trep\tsize_bytes\ttime_us\tok\n' >"$RAW"

# Prints "size time_us ok" per row of a commbench JSON file (array, single object or JSON lines).
parse_commbench() {
    python3 - "$1" <<'PY'
import json, sys

path = sys.argv[1]
with open(path) as f:
    text = f.read()
rows = []
try:
    doc = json.loads(text)
    if isinstance(doc, list):
        rows = doc
    elif isinstance(doc, dict):
        for key in ("results", "rows", "data"):
            if isinstance(doc.get(key), list):
                rows = doc[key]
                break
        else:
            rows = [doc]
except ValueError:
    for line in text.splitlines():
        line = line.strip().rstrip(",")
        if line in ("", "[", "]"):
            continue
        try:
            rows.append(json.loads(line))
        except ValueError:
            print("bench-vs-mpi: skipping unparsable line in %s: %.80s" % (path, line), file=sys.stderr)


def num(v):
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


for r in rows:
    if not isinstance(r, dict) or "size" not in r:
        continue
    if r.get("op", "all_reduce") not in ("all_reduce", "allreduce"):
        continue
    oop = r.get("oop") if isinstance(r.get("oop"), dict) else {}
    t = num(oop.get("median_us"))
    if t is None:
        t = num(r.get("median_us"))
    if t is None:
        t = num(oop.get("time_us"))
    if t is None:
        t = num(r.get("time_us"))
    if t is None or t <= 0:
        continue
    bad = 0
    for part in (oop, r.get("ip") if isinstance(r.get("ip"), dict) else {}):
        w = num(part.get("wrong"))
        if w is not None and w > 0:
            bad = 1
    print(int(r["size"]), "%.3f" % t, "FAIL" if bad else "ok")
PY
}

run_logged() { # logfile cmd... ; runs under timeout, output to logfile, returns the exit status
    local logf=$1
    shift
    local rc=0
    timeout --kill-after=10 "$RUN_TIMEOUT" "$@" >"$logf" 2>&1 || rc=$?
    return "$rc"
}

mpi_cmd() { # config -> array MPI_RUN
    local np
    np=$(ranks_of "$1")
    MPI_RUN=("${MPIRUN[@]}" -np "$np")
    # shellcheck disable=SC2206 # word splitting of user-given flag strings is intended
    MPI_RUN+=($MPI_BIND $MPI_EXTRA)
    [[ $1 == tcp* ]] && MPI_RUN+=("${MPI_TCP[@]}")
    MPI_RUN+=("$MPI_BENCH" -s "$MPI_SECONDS" -w "$WARMUP" "${SIZE_LIST[@]}")
}

sncl_env() { # config -> array SNCL_ENV (env command prefix)
    if [[ $1 == tcp* ]]; then
        SNCL_ENV=(env SNCL_TRANSPORT=tcp)
    else
        SNCL_ENV=(env -u SNCL_TRANSPORT)
    fi
}

run_commbench() { # config size iters json log
    local np
    np=$(ranks_of "$1")
    sncl_env "$1"
    rm -f "$4"
    # shellcheck disable=SC2086 # SNCL_ARGS is a user-given flag string
    run_logged "$5" "${SNCL_ENV[@]}" "$COMMBENCH" all_reduce --np "$np" -b "$2" -e "$2" -f 2 \
        -w "$WARMUP" -n "$3" -d float -o sum $SNCL_ARGS --json "$4"
}

run_mpi() { # config rep
    local cfg=$1 rep=$2 logf=$WORK/logs/mpi-$1-rep$2.log rc=0
    mpi_cmd "$cfg"
    log "rep $rep/$REPS $cfg Open MPI: ${MPI_RUN[*]}"
    run_logged "$logf" "${MPI_RUN[@]}" || rc=$?
    collect_rows mpi "Open MPI" "$cfg" "$rep" "$logf" "$rc"
}

# Moves the rows of a bench/mpi_allreduce.c-style log ("size iters median_us min_us busbw ok"
# per size, '#' comments) into PENDING as impl's; warns when the run failed or sizes are missing.
collect_rows() { # impl label config rep logfile exit_status
    local impl=$1 label=$2 cfg=$3 rep=$4 logf=$5 rc=$6 got=0 size med ok
    while read -r size _ med _ _ ok; do
        [[ $size =~ ^[0-9]+$ ]] || continue
        printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$cfg" "$impl" "$rep" "$size" "$med" "$ok" >>"$PENDING"
        got=$((got + 1))
    done < <(grep -v '^#' "$logf" || true)
    if ((rc != 0 || got != ${#SIZE_LIST[@]})); then
        log "WARNING: $label $cfg rep $rep exited $rc with $got/${#SIZE_LIST[@]} sizes; see $logf"
        tail -n 5 "$logf" >&2 || true
    fi
}

run_gloo() { # config rep: bench/gloo_allreduce.py under torchrun, Gloo over loopback TCP
    local cfg=$1 rep=$2 logf=$WORK/logs/gloo-$1-rep$2.log rc=0 np port
    np=$(ranks_of "$cfg")
    port=$((29000 + RANDOM % 1000))
    log "rep $rep/$REPS $cfg Gloo: torchrun --nproc_per_node $np bench/gloo_allreduce.py"
    run_logged "$logf" env OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo "$GLOO_PYTHON" -m torch.distributed.run \
        --standalone --nproc_per_node "$np" --master-port "$port" "$ROOT/bench/gloo_allreduce.py" \
        -s "$MPI_SECONDS" -w "$WARMUP" "${SIZE_LIST[@]}" || rc=$?
    collect_rows gloo Gloo "$cfg" "$rep" "$logf" "$rc"
}

declare -A SNCL_ITERS=()
calibrate_sncl() { # config: sets SNCL_ITERS[config:size] from a short commbench run per size
    local cfg=$1 size json logf rc line t n
    for size in "${SIZE_LIST[@]}"; do
        json=$WORK/logs/sncl-$cfg-cal-$size.json
        logf=$WORK/logs/sncl-$cfg-cal-$size.log
        rc=0
        run_commbench "$cfg" "$size" 5 "$json" "$logf" || rc=$?
        line=""
        [[ -s $json ]] && line=$(parse_commbench "$json" | awk -v s="$size" '$1 == s { print; exit }')
        if [[ -z $line ]]; then
            tail -n 20 "$logf" >&2 || true
            die "commbench calibration run failed ($cfg, $size B, exit $rc, no result row); log: $logf"
        fi
        ((rc == 0)) || log "WARNING: commbench calibration run ($cfg, $size B) exited $rc; log: $logf"
        t=$(awk '{ print $2 }' <<<"$line")
        n=$(awk -v t="$t" -v s="$SNCL_SECONDS" -v lo="$SNCL_MIN_ITERS" -v hi="$SNCL_MAX_ITERS" \
            'BEGIN { n = int(s * 1e6 / t); if (n < lo) n = lo; if (n > hi) n = hi; print n }')
        SNCL_ITERS[$cfg:$size]=$n
        log "calibrated $cfg $size B: ~${t} us/op -> -n $n"
    done
}

run_sncl() { # config rep
    local cfg=$1 rep=$2 size json logf rc line t ok
    log "rep $rep/$REPS $cfg sncl: $COMMBENCH all_reduce --np $(ranks_of "$cfg") ($([[ $cfg == tcp* ]] && echo SNCL_TRANSPORT=tcp || echo shm))"
    for size in "${SIZE_LIST[@]}"; do
        json=$WORK/logs/sncl-$cfg-rep$rep-$size.json
        logf=$WORK/logs/sncl-$cfg-rep$rep-$size.log
        rc=0
        run_commbench "$cfg" "$size" "${SNCL_ITERS[$cfg:$size]}" "$json" "$logf" || rc=$?
        line=""
        [[ -s $json ]] && line=$(parse_commbench "$json" | awk -v s="$size" '$1 == s { print; exit }')
        if [[ -z $line ]]; then
            log "WARNING: commbench $cfg $size B rep $rep exited $rc without a result row; see $logf"
            tail -n 5 "$logf" >&2 || true
            continue
        fi
        read -r _ t ok <<<"$line"
        if ((rc != 0)) || [[ $ok != ok ]]; then
            log "WARNING: commbench $cfg $size B rep $rep exited $rc, result check: $ok; see $logf"
            [[ $ok != ok ]] || ok=FAIL
        fi
        printf '%s\tsncl\t%s\t%s\t%s\t%s\n' "$cfg" "$rep" "$size" "$t" "$ok" >>"$PENDING"
    done
}

busy_pct() { # percent of all CPU time that was not idle over the next 0.5 s
    local u n s i w q sq st t1 i1 t2 i2
    read -r _ u n s i w q sq st _ </proc/stat
    t1=$((u + n + s + i + w + q + sq + st)) i1=$((i + w))
    sleep 0.5
    read -r _ u n s i w q sq st _ </proc/stat
    t2=$((u + n + s + i + w + q + sq + st)) i2=$((i + w))
    echo $((t2 > t1 ? 100 - 100 * (i2 - i1) / (t2 - t1) : 0))
}

BUSY_RUNS=0
wait_idle() { # label
    local start=$SECONDS b said=0
    STARTED_BUSY=0
    b=$(busy_pct)
    while ((b > BUSY_PCT)); do
        if ((SECONDS - start >= WAIT_IDLE)); then
            log "WARNING: CPUs still ${b}% busy after ${WAIT_IDLE}s; running $1 anyway (numbers may be off)"
            STARTED_BUSY=1
            return 0
        fi
        ((said)) || log "CPUs ${b}% busy (other processes); waiting up to ${WAIT_IDLE}s before $1"
        said=1
        sleep 2
        b=$(busy_pct)
    done
}

run_memcpy() { # rep
    local out size t
    out=$("$MEMCPY_BENCH" "$MEMCPY_BYTES" 21 2>/dev/null) || die "memcpy_bw failed"
    read -r size t _ <<<"$out"
    printf 'memcpy\tmemcpy\t%s\t%s\t%s\tok\n' "$1" "$size" "$t" >>"$RAW"
    log "rep $1/$REPS memcpy 64 MiB: $out"
}

# ---------------------------------------------------------------- 3. runs
rm -f "$WORK"/logs/*
log "configs: ${CONFIG_LIST[*]}; sizes: ${SIZE_LIST[*]}; reps: $REPS; MPI ${MPI_SECONDS}s/size, sncl ~${SNCL_SECONDS}s/size"
if [[ $SKIP_SNCL != 1 ]]; then
    for cfg in "${CONFIG_LIST[@]}"; do calibrate_sncl "$cfg"; done
fi
for ((rep = 1; rep <= REPS; rep++)); do
    wait_idle "rep $rep memcpy"
    run_memcpy "$rep"
    for cfg in "${CONFIG_LIST[@]}"; do
        for ((try = 0; ; try++)); do
            wait_idle "rep $rep $cfg"
            : >"$PENDING"
            run_mpi "$cfg" "$rep"
            [[ $SKIP_SNCL == 1 ]] || run_sncl "$cfg" "$rep"
            [[ $GLOO == 0 ]] || run_gloo "$cfg" "$rep"
            b=$(busy_pct)
            if ((b <= BUSY_PCT)); then
                ((STARTED_BUSY == 0)) || BUSY_RUNS=$((BUSY_RUNS + 1))
                break
            fi
            if ((try >= BUSY_RETRIES)); then
                log "WARNING: CPUs ${b}% busy right after rep $rep $cfg; keeping it (numbers may be off)"
                BUSY_RUNS=$((BUSY_RUNS + 1))
                break
            fi
            log "CPUs ${b}% busy right after rep $rep $cfg (other processes); discarding and repeating it"
        done
        cat "$PENDING" >>"$RAW"
    done
done

# ---------------------------------------------------------------- 4. table
MPI_VERSION=$(mpirun.openmpi --version 2>/dev/null | head -n 1 || true)
CPU=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n 1 || true)
python3 - "$RAW" "$OUT" "$REPS" "$(nproc)" "$CPU" "$MPI_VERSION" "${MPI_BIND:-default binding}" \
    "$MPI_SECONDS" "$SNCL_SECONDS" "$BUSY_RUNS" "${CONFIG_LIST[*]}" "${SIZE_LIST[*]}" <<'PY'
import statistics, sys, time

raw, out, reps, ncpu, cpu, mpiver, bind, mpisec, snclsec, busy, configs, sizes = sys.argv[1:]
configs, sizes = configs.split(), [int(s) for s in sizes.split()]
data = {}  # (config, impl, size) -> [time_us]
fails = {}
with open(raw) as f:
    next(f)
    for line in f:
        cfg, impl, rep, size, t, ok = line.rstrip("\n").split("\t")
        key = (cfg, impl, int(size))
        data.setdefault(key, []).append(float(t))
        if ok != "ok":
            fails[key] = fails.get(key, 0) + 1


def label(b):
    for unit, sh in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << sh and b % (1 << sh) == 0:
            return "%d %s" % (b >> sh, unit)
    return "%d B" % b


def cell(cfg, impl, size):
    ts = data.get((cfg, impl, size))
    if not ts:
        return None, "-", "-"
    n = int(cfg[-1])
    t = statistics.median(ts)
    bw = 2.0 * (n - 1) / n * size / t / 1e3  # bytes/us = MB/s -> GB/s
    mark = " FAIL" if fails.get((cfg, impl, size)) else ""
    tstr = "%.2f" % t if t < 100 else "%.0f" % t
    return bw, "%.3f%s" % (bw, mark), tstr + mark


gloo = any(k[1] == "gloo" for k in data)
head = ["config", "size", "MPI busbw GB/s", "MPI µs", "sncl busbw GB/s", "sncl µs", "sncl/MPI"]
if gloo:
    head += ["Gloo busbw GB/s", "Gloo µs", "sncl/Gloo"]
rows = []
for cfg in configs:
    for size in sizes:
        mb, mbs, mt = cell(cfg, "mpi", size)
        sb, sbs, st = cell(cfg, "sncl", size)
        ratio = "%.2f" % (sb / mb) if mb and sb else "-"
        row = [cfg, label(size), mbs, mt, sbs, st, ratio]
        if gloo:
            gb, gbs, gt = cell(cfg, "gloo", size)
            row += [gbs, gt, "%.2f" % (sb / gb) if gb and sb else "-"]
        rows.append(row)
mc = data.get(("memcpy", "memcpy", 64 << 20)) or next((v for k, v in data.items() if k[0] == "memcpy"), [])
memline = "memcpy 64 MiB, one thread: %.2f GB/s (%.0f µs; size/time, median of %d runs x 21 copies)" % (
    (64 << 20) / statistics.median(mc) / 1e3, statistics.median(mc), len(mc)) if mc else "memcpy: no data"

width = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
fmt = lambda r: "  ".join(c.rjust(w) if i > 1 else c.ljust(w) for i, (c, w) in enumerate(zip(r, width)))
print(fmt(head))
for r in rows:
    print(fmt(r))
print(memline)

note = ("Medians over %s interleaved repetitions (Open MPI run, then commbench, per config) on %s CPUs (%s); "
        "%s, %s, MPI bench %s s/size, commbench ~%s s/size. All-reduce float sum, out-of-place; "
        "time = per-op median (slowest rank); busbw = 2(n-1)/n x bytes / time, GB/s = 1e9 B/s. "
        "shm2/shm4: 2/4 ranks over shared memory (Open MPI ob1+vader); tcp2: 2 ranks over loopback TCP "
        "(Open MPI btl self,tcp on lo, mpi_yield_when_idle 1; sncl SNCL_TRANSPORT=tcp)." +
        (" Gloo: torch's ProcessGroupGloo under torchrun, loopback TCP in every config (it has no "
         "shared-memory transport), run after commbench in each repetition." if gloo else "")) % (
            reps, ncpu, cpu or "unknown CPU", mpiver or "Open MPI", bind, mpisec, snclsec)
if int(busy):
    note += " WARNING: %s config runs were kept although other processes kept the CPUs busy." % busy
    print("WARNING: %s config runs ran on a busy machine" % busy, file=sys.stderr)
with open(out, "w") as f:
    f.write("<!-- generated by scripts/bench-vs-mpi.sh on %s -->\n\n" % time.strftime("%Y-%m-%d %H:%M"))
    f.write("| " + " | ".join(head) + " |\n")
    f.write("|" + "|".join(["---"] * 2 + ["---:"] * (len(head) - 2)) + "|\n")
    for r in rows:
        f.write("| " + " | ".join(r) + " |\n")
    f.write("\n" + memline + "\n\n" + note + "\n")
if fails:
    print("WARNING: verification failures: %s" % ", ".join("%s %s %s B x%d" % (k + (v,)) for k, v in sorted(fails.items())),
          file=sys.stderr)
PY
log "markdown table: $OUT; raw per-rep data: $RAW; logs: $WORK/logs/"
