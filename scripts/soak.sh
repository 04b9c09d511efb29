#!/usr/bin/env bash
# Soak test: on 4 local ranks, over shared memory and then TCP, 100,000
# all-reduces of random sizes (8 B .. 4 KiB) and 1,000 of 16 MiB spread among
# them; every rank samples its RSS, open fds and threads every 10,000
# operations (SAMPLE lines) and passes when RSS stays within 5 % from the
# first sample (10,000th operation) to the last and fds / threads do not
# change. Exit status 0 only when every rank passes on both transports.
#
#   scripts/soak.sh                 # release build, 4 ranks, full counts
#   NP=2 SMALL=20000 LARGE=100 scripts/soak.sh   # shorter
#   TRANSPORTS=tcp scripts/soak.sh
set -euo pipefail
cd "$(dirname "$0")/.."
NP=${NP:-4}
SMALL=${SMALL:-100000}
LARGE=${LARGE:-1000}
EVERY=${EVERY:-10000}
TRANSPORTS=${TRANSPORTS:-"shm tcp"}
PROFILE=${PROFILE:-release}
if [[ -z "${COMMBENCH:-}" ]]; then
    cargo build --profile "$PROFILE" -p commbench
    COMMBENCH=target/$PROFILE/commbench
fi
OUT=$(mktemp -d "${TMPDIR:-/tmp}/sncl-soak.XXXXXX")
trap 'rm -rf "$OUT"' EXIT

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

status=0
echo "soak: $NP ranks, $SMALL small + $LARGE large all-reduces, sample every $EVERY; load: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"
for t in $TRANSPORTS; do
    case $t in
        shm) transport=auto ;;
        tcp) transport=tcp ;;
        *) echo "soak: unknown transport $t (shm or tcp)" >&2; exit 2 ;;
    esac
    port=$(free_port)
    secret=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
    pids=()
    start=$(date +%s)
    for ((r = 0; r < NP; r++)); do
        SNCL_RANK=$r SNCL_WORLD_SIZE=$NP SNCL_ROOT=127.0.0.1:$port SNCL_SECRET=$secret \
            SNCL_TRANSPORT=$transport SNCL_TIMEOUT_MS=${SNCL_TIMEOUT_MS:-120000} \
            "$COMMBENCH" soak --small "$SMALL" --large "$LARGE" --sample-every "$EVERY" \
            >"$OUT/$t.$r.out" 2>"$OUT/$t.$r.err" &
        pids+=($!)
    done
    failed=0
    for ((r = 0; r < NP; r++)); do
        if ! wait "${pids[$r]}"; then failed=1; fi
    done
    end=$(date +%s)
    echo "== $t ($((end - start)) s; load after: $(cut -d' ' -f1-3 /proc/loadavg))"
    for ((r = 0; r < NP; r++)); do
        grep -h '^SAMPLE' "$OUT/$t.$r.out" || true
    done
    for ((r = 0; r < NP; r++)); do
        grep -h '^SOAK' "$OUT/$t.$r.out" "$OUT/$t.$r.err" || { echo "SOAK FAIL rank $r: no verdict"; failed=1; }
        if [[ -s "$OUT/$t.$r.err" ]]; then
            sed "s/^/  rank $r stderr: /" "$OUT/$t.$r.err" | head -5
        fi
    done
    if ((failed)); then
        echo "== $t: FAIL"
        status=1
    else
        echo "== $t: PASS"
    fi
done
exit $status
