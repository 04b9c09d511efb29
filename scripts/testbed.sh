#!/usr/bin/env bash
# testbed.sh - a two-tier network test bed of Linux network namespaces (needs root).
#
#   scripts/testbed.sh --nodes 4 --ranks-per-node 2 --rate 1gbit [options] -- COMMAND [ARGS...]
#   scripts/testbed.sh --nodes 2 --rate 1gbit --measure          # link goodput only
#   scripts/testbed.sh --cleanup-stale                           # remove leftovers of crashed runs
#
# The bed: N node namespaces sncl-<pid>-<rand>-n<i> and one switch namespace
# sncl-<pid>-<rand>-sw holding a bridge br0. Node i has one veth link: eth0 inside
# the node (198.18.<hi>.<lo>/16, node 0 = 198.18.0.1, node 1 = 198.18.0.2, ...),
# v<i> in the switch, enslaved to br0. Both ends of every link carry a tc tbf rate
# limit (egress of eth0 = node upload, egress of v<i> = node download).
#
# COMMAND runs once per rank (N x R ranks) inside its node's namespace with
#   SNCL_RANK, SNCL_WORLD_SIZE, SNCL_LOCAL_RANK, SNCL_NODE_ID=n<i>,
#   SNCL_ROOT=<node of rank 0>:<port>, SNCL_SECRET (random, shared by all ranks),
#   SNCL_TESTBED_RATE_BPS (configured rate, bytes/s; 0 = unlimited),
#   SNCL_TESTBED_LINK_BPS (measured goodput, bytes/s; only with --measure)
# plus every variable of the caller's environment. A first word `commbench` means
# this repository's target/release/commbench (built with cargo if missing).
# Namespaces share /dev/shm, the hostname and the PID space: node identity comes
# from SNCL_NODE_ID, so ranks of one node use shm and ranks of different nodes TCP.
#
# Output: every rank writes stdout+stderr to <logdir>/rank<r>.log; rank 0's output
# also goes to this script's stdout (its stderr to stderr). The header and summary
# go to stderr. Exit status: the worst (largest) exit status of the ranks (a rank
# killed by signal S counts as 128+S; a time-out gives at least 124); 2 for a usage
# or set-up error of this script; 130/143 when interrupted by SIGINT/SIGTERM.
# Everything created is removed on exit, also after a failure, Ctrl-C or SIGTERM.
#
# Options:
#   -N, --nodes N               node namespaces (default 2)
#   -R, --ranks-per-node R      ranks per node (default 1)
#   --placement P               node-major (rank r on node r/R, default) or
#                               round-robin (rank r on node r%N)
#   --rate RATE                 tbf rate in tc units: 1gbit, 100mbit, 2.5gbit, 125mbps... (default 1gbit)
#   --burst SIZE                tbf burst in tc units (default: 2*rate/HZ rounded up to a
#                               power of two, at least 64kb: 1gbit -> 1mb, 100mbit -> 128kb)
#   --latency TIME              tbf latency (queue limit) (default 20ms)
#   --host-latency TIME         tbf latency of each node's own upload (eth0) only
#                               (default: --latency). A host queues about 1,000
#                               packets and is pushed back by its NIC; a shallow
#                               queue there drops the sender's own bursts
#                               (docs/perf-notes/NOTEBOOK.md section 3, fourth and fifth runs)
#   --no-limit                  no tc qdiscs (plain veth speed)
#   --measure                   measure TCP goodput of one node link (node 1 -> node 0,
#                               through the switch and both tbf limits) before COMMAND;
#                               prints "# link goodput: ..." (stderr) and exports
#                               SNCL_TESTBED_LINK_BPS; without COMMAND it prints the
#                               goodput in bytes/s on stdout and exits
#   --measure-seconds S         duration of the measurement (default 2)
#   --port P                    SNCL_ROOT port (default 29500 + random 0..499)
#   --timeout SECS              kill the ranks after SECS seconds (default 600; 0 = never)
#   --fail-grace SECS           after a rank fails, kill the others after SECS (default 30)
#   --keep-logs DIR             write the per-rank logs to DIR and keep them (default: a
#                               temporary directory, kept and printed only on failure)
#   --fault KIND:NODE@SECS[+DUR] a link fault while COMMAND runs: SECS seconds after the
#                               ranks start, the switch side (v<NODE>) of node NODE's link
#                               goes down; KIND down keeps it down, KIND flap brings it
#                               back up after DUR seconds (e.g. down:1@3, flap:1@3+2);
#                               notes "# fault: ..." with the times on stderr
#   --cleanup-stale             first remove sncl-* namespaces whose runner process is gone
#                               (alone: just that)
#   -q, --quiet                 no header
#   -h, --help                  this text
#
# Environment: TESTBED_HZ overrides the kernel HZ used for the default burst
# (read from /proc/config.gz or /boot/config-*, else 250).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PROG=testbed.sh

die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 2; }
note() { printf '%s\n' "$*" >&2; }
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }

# ---------------------------------------------------------------- arguments
NODES=2
RPN=1
PLACEMENT=node-major
RATE=1gbit
BURST=
LATENCY=20ms
HOST_LATENCY=
LIMIT=1
MEASURE=0
MEASURE_SECS=2
PORT=
TIMEOUT=600
FAIL_GRACE=30
KEEP_LOGS=
CLEANUP_STALE=0
FAULT=
FAULT_PID=
QUIET=0
CMD=()

need_arg() { [[ $# -ge 2 ]] || die "$1 needs a value"; }
while [[ $# -gt 0 ]]; do
    case $1 in
        -N | --nodes) need_arg "$@"; NODES=$2; shift 2 ;;
        -R | --ranks-per-node) need_arg "$@"; RPN=$2; shift 2 ;;
        --placement) need_arg "$@"; PLACEMENT=$2; shift 2 ;;
        --rate) need_arg "$@"; RATE=$2; shift 2 ;;
        --burst) need_arg "$@"; BURST=$2; shift 2 ;;
        --latency) need_arg "$@"; LATENCY=$2; shift 2 ;;
        --host-latency) need_arg "$@"; HOST_LATENCY=$2; shift 2 ;;
        --no-limit) LIMIT=0; shift ;;
        --measure) MEASURE=1; shift ;;
        --measure-seconds) need_arg "$@"; MEASURE_SECS=$2; shift 2 ;;
        --port) need_arg "$@"; PORT=$2; shift 2 ;;
        --timeout) need_arg "$@"; TIMEOUT=$2; shift 2 ;;
        --fail-grace) need_arg "$@"; FAIL_GRACE=$2; shift 2 ;;
        --keep-logs) need_arg "$@"; KEEP_LOGS=$2; shift 2 ;;
        --fault) need_arg "$@"; FAULT=$2; shift 2 ;;
        --cleanup-stale) CLEANUP_STALE=1; shift ;;
        -q | --quiet) QUIET=1; shift ;;
        -h | --help) usage; exit 0 ;;
        --nodes=* | --ranks-per-node=* | --placement=* | --rate=* | --burst=* | --latency=* | --host-latency=* | \
            --measure-seconds=* | --port=* | --timeout=* | --fail-grace=* | --keep-logs=* | --fault=*)
            set -- "${1%%=*}" "${1#*=}" "${@:2}" ;;
        --) shift; CMD=("$@"); break ;;
        *) die "unknown argument '$1' (the command goes after --; see --help)" ;;
    esac
done

is_uint() { [[ $1 =~ ^[0-9]+$ ]]; }
if ! is_uint "$NODES" || ((NODES < 1 || NODES > 1000)); then die "--nodes must be 1..1000"; fi
if ! is_uint "$RPN" || ((RPN < 1)); then die "--ranks-per-node must be >= 1"; fi
is_uint "$TIMEOUT" || die "--timeout must be a whole number of seconds"
is_uint "$FAIL_GRACE" || die "--fail-grace must be a whole number of seconds"
[[ $MEASURE_SECS =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "--measure-seconds must be a number"
[[ -z $PORT ]] || { is_uint "$PORT" && ((PORT >= 1 && PORT <= 65535)); } || die "--port must be 1..65535"
case $PLACEMENT in
    node-major | round-robin) ;;
    *) die "--placement must be node-major or round-robin" ;;
esac
if ((MEASURE && NODES < 2)); then die "--measure needs --nodes >= 2"; fi
FAULT_KIND= FAULT_NODE= FAULT_AT= FAULT_DUR=0
if [[ -n $FAULT ]]; then
    [[ $FAULT =~ ^(down|flap):([0-9]+)@([0-9]+(\.[0-9]+)?)(\+([0-9]+(\.[0-9]+)?))?$ ]] ||
        die "--fault must be down:NODE@SECS or flap:NODE@SECS+DUR (got '$FAULT')"
    FAULT_KIND=${BASH_REMATCH[1]} FAULT_NODE=${BASH_REMATCH[2]} FAULT_AT=${BASH_REMATCH[3]}
    FAULT_DUR=${BASH_REMATCH[6]:-0}
    ((FAULT_NODE < NODES)) || die "--fault: node $FAULT_NODE does not exist (--nodes $NODES)"
    [[ $FAULT_KIND == down || -n ${BASH_REMATCH[6]} ]] || die "--fault flap needs +DUR"
fi

# ---------------------------------------------------------------- stale runs
# Namespaces are named sncl-<runner pid>-<4 hex>-{n<i>,sw}; a run is stale when
# its runner is gone (or the pid now belongs to something that is not a testbed).
runner_alive() {
    local cmdline
    cmdline=$(tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null) || return 1
    [[ $cmdline == *testbed* ]]
}

kill_netns_procs() { # NS SIGNAL
    local p
    for p in $(ip netns pids "$1" 2>/dev/null); do
        kill "-$2" "$p" 2>/dev/null || true
    done
}

cleanup_stale() {
    local ns pid n=0
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
        [[ $ns =~ ^sncl-([0-9]+)-[0-9a-f]+-(n[0-9]+|sw)$ ]] || continue
        pid=${BASH_REMATCH[1]}
        if ((pid != $$)) && runner_alive "$pid"; then continue; fi
        kill_netns_procs "$ns" KILL
        ip netns del "$ns" 2>/dev/null && n=$((n + 1))
    done
    note "# cleanup-stale: removed $n stale namespace(s)"
}

[[ $(id -u) -eq 0 ]] || die "needs root (network namespaces, veth, tc)"
for t in ip tc; do command -v "$t" >/dev/null || die "'$t' is missing (apt-get install iproute2)"; done

if ((CLEANUP_STALE)); then
    cleanup_stale
    if ((${#CMD[@]} == 0 && !MEASURE)); then exit 0; fi
fi
if ((${#CMD[@]} == 0 && !MEASURE)); then die "nothing to do: give -- COMMAND and/or --measure"; fi

# ---------------------------------------------------------------- rate and burst
# tc rate -> bytes/s (tc: bit/kbit/mbit/gbit/tbit are powers of 1000, kibit... of 1024,
# bps/kbps/... are bytes per second, a bare number is bit/s).
rate_bytes() {
    awk -v s="$1" 'BEGIN {
        s = tolower(s)
        if (!match(s, /^[0-9]+(\.[0-9]+)?/)) exit 1
        v = substr(s, 1, RLENGTH); u = substr(s, RLENGTH + 1)
        m["bit"] = 1; m[""] = 1
        m["kbit"] = 1e3; m["mbit"] = 1e6; m["gbit"] = 1e9; m["tbit"] = 1e12
        m["kibit"] = 1024; m["mibit"] = 1024^2; m["gibit"] = 1024^3; m["tibit"] = 1024^4
        m["bps"] = 8; m["kbps"] = 8e3; m["mbps"] = 8e6; m["gbps"] = 8e9; m["tbps"] = 8e12
        m["kibps"] = 8 * 1024; m["mibps"] = 8 * 1024^2; m["gibps"] = 8 * 1024^3; m["tibps"] = 8 * 1024^4
        if (!(u in m)) exit 1
        b = v * m[u] / 8
        if (b < 1) exit 1
        printf "%.0f\n", b
    }'
}

kernel_hz() {
    local hz=${TESTBED_HZ:-}
    if [[ -z $hz && -r /proc/config.gz ]]; then
        hz=$(zcat /proc/config.gz 2>/dev/null | sed -n 's/^CONFIG_HZ=//p' || true)
    fi
    if [[ -z $hz && -r /boot/config-$(uname -r) ]]; then
        hz=$(sed -n 's/^CONFIG_HZ=//p' "/boot/config-$(uname -r)" || true)
    fi
    is_uint "${hz:-x}" && ((hz > 0)) || hz=250
    echo "$hz"
}

human_size() { # bytes -> tc size (kb = KiB, mb = MiB)
    local b=$1
    if ((b % 1048576 == 0)); then echo "$((b / 1048576))mb"
    elif ((b % 1024 == 0)); then echo "$((b / 1024))kb"
    else echo "${b}b"; fi
}

RATE_BPS=0
if ((LIMIT)); then
    RATE_BPS=$(rate_bytes "$RATE") || die "cannot parse --rate '$RATE' (use tc units: 1gbit, 100mbit, 125mbps)"
    HZ=$(kernel_hz)
    if [[ -z $BURST ]]; then
        # tbf refills its bucket about once a jiffy: a burst below rate/HZ caps the
        # goodput far below the rate. Take twice that, a power of two, >= 64 KiB.
        want=$(((2 * RATE_BPS + HZ - 1) / HZ))
        b=65536
        while ((b < want)); do b=$((b * 2)); done
        BURST=$(human_size "$b")
    fi
fi

# ---------------------------------------------------------------- command
if ((${#CMD[@]} > 0)) && [[ ${CMD[0]} == commbench ]]; then
    CMD[0]=$ROOT/target/release/commbench
    if [[ ! -x ${CMD[0]} ]]; then
        command -v cargo >/dev/null || die "target/release/commbench is missing and cargo is not installed"
        note "# building commbench (cargo build --release -p commbench)"
        (cd "$ROOT" && cargo build --release -p commbench) >&2 || die "cargo build failed"
    fi
fi
PYTHON=
if ((MEASURE)); then
    PYTHON=$(command -v python3) || die "--measure needs python3"
fi

# ---------------------------------------------------------------- names
RUNID=$$-$(printf '%04x' $((RANDOM % 65536)))
PREFIX=sncl-$RUNID
SW=$PREFIX-sw
node_ns() { echo "$PREFIX-n$1"; }
node_ip() { local h=$(($1 + 1)); echo "198.18.$((h / 256)).$((h % 256))"; }
NRANKS=$((NODES * RPN))
[[ -n $PORT ]] || PORT=$((29500 + RANDOM % 500))
MPORT=$((PORT + 1000))
SECRET=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')

# ---------------------------------------------------------------- cleanup
MAINPID=$$
CREATED_NS=()
WRAPPERS=() # our direct children: one wrapper subshell per rank, the measurement receiver
LOGDIR=
LOGDIR_TEMP=0
FAILED=1 # cleared on success
CLEANED=0

# a pipe nobody writes to: `read -t` on it is a sleep without a fork that a trapped
# signal interrupts at once
exec {TICK_FD}<> <(:)
tick() { read -r -t "$1" -u "$TICK_FD" _ || true; }
now_ms() { # sets NOW_MS (no fork)
    local t=${EPOCHREALTIME//[!0-9]/}
    NOW_MS=$((10#$t / 1000))
}

bed_procs() { # the processes inside our namespaces
    local ns
    for ns in "${CREATED_NS[@]}"; do ip netns pids "$ns" 2>/dev/null; done
}
# shellcheck disable=SC2317 # used by cleanup
any_alive() { # PID... -> 0 if one of them still runs
    local p
    for p in "$@"; do kill -0 "$p" 2>/dev/null && return 0; done
    return 1
}

# shellcheck disable=SC2317 # invoked by the traps
cleanup() {
    # a forked child that has not exec'd yet still carries our traps: not its business
    [[ $BASHPID == "$MAINPID" ]] || return 0
    set +e
    ((CLEANED)) && return
    CLEANED=1
    trap '' INT TERM HUP
    local p i procs
    [[ -z $FAULT_PID ]] || kill -KILL "$FAULT_PID" 2>/dev/null
    # TERM everything in the bed, give it 2 s, then KILL; the wrappers end by themselves
    # once their commands are gone (a last-resort KILL after 1 s more)
    procs=$(bed_procs)
    if [[ -n $procs ]]; then
        # shellcheck disable=SC2086
        kill -TERM $procs 2>/dev/null
        for ((i = 0; i < 20; i++)); do
            [[ -n $(bed_procs) ]] || break
            sleep 0.1
        done
    fi
    for ((i = 0; i < 10; i++)); do
        procs=$(bed_procs)
        # shellcheck disable=SC2086
        [[ -z $procs ]] || kill -KILL $procs 2>/dev/null
        any_alive "${WRAPPERS[@]}" || break
        sleep 0.1
    done
    for p in "${WRAPPERS[@]}"; do kill -KILL "$p" 2>/dev/null; done
    wait 2>/dev/null
    # deleting a namespace destroys its veth ends (and with them the peers and qdiscs)
    for ns in "${CREATED_NS[@]}"; do ip netns del "$ns" 2>/dev/null; done
    if [[ -n $LOGDIR ]]; then
        if ((LOGDIR_TEMP && !FAILED)); then
            rm -rf "$LOGDIR"
        elif ((FAILED)) || [[ -n $KEEP_LOGS ]]; then
            note "# logs: $LOGDIR"
        fi
    fi
}
# shellcheck disable=SC2317 # invoked by the traps
on_signal() {
    local code=129
    case $1 in INT) code=130 ;; TERM) code=143 ;; esac
    [[ $BASHPID == "$MAINPID" ]] || exit "$code"
    note "# $PROG: caught SIG$1, cleaning up"
    # While the ranks run, the wait loop exits (bash 5.2 can crash when the EXIT trap
    # runs right inside the trap that interrupted its `read -t`).
    if ((WAITING)); then
        SIGNALED=$code
        return
    fi
    exit "$code"
}
WAITING=0
SIGNALED=0
trap cleanup EXIT
trap 'on_signal INT' INT
trap 'on_signal TERM' TERM
trap 'on_signal HUP' HUP

if [[ -n $KEEP_LOGS ]]; then
    mkdir -p "$KEEP_LOGS"
    LOGDIR=$(cd "$KEEP_LOGS" && pwd)
else
    LOGDIR=$(mktemp -d "${TMPDIR:-/tmp}/sncl-testbed.XXXXXX")
    LOGDIR_TEMP=1
fi

# ---------------------------------------------------------------- the bed
add_ns() {
    ip netns add "$1" || die "cannot create namespace $1"
    CREATED_NS+=("$1")
    ip -n "$1" link set lo up
    # Collectives leave sockets idle between steps; do not fall back to slow
    # start after each pause (a common setting on training clusters).
    ip netns exec "$1" sysctl -qw net.ipv4.tcp_slow_start_after_idle=0 || true
}
add_ns "$SW"
ip -n "$SW" link add br0 type bridge
ip -n "$SW" link set br0 up
for ((i = 0; i < NODES; i++)); do
    ns=$(node_ns "$i")
    add_ns "$ns"
    ip -n "$ns" link add eth0 type veth peer name "v$i" netns "$SW"
    ip -n "$ns" addr add "$(node_ip "$i")/16" dev eth0
    ip -n "$SW" link set "v$i" master br0
    if ((LIMIT)); then
        tc -n "$ns" qdisc add dev eth0 root tbf rate "$RATE" burst "$BURST" latency "${HOST_LATENCY:-$LATENCY}"
        tc -n "$SW" qdisc add dev "v$i" root tbf rate "$RATE" burst "$BURST" latency "$LATENCY"
    fi
    ip -n "$SW" link set "v$i" up
    ip -n "$ns" link set eth0 up
done

# placement
RANK_NODE=()
RANK_LOCAL=()
declare -A NODE_RANKS=()
for ((r = 0; r < NRANKS; r++)); do
    if [[ $PLACEMENT == node-major ]]; then n=$((r / RPN)); else n=$((r % NODES)); fi
    RANK_NODE[r]=$n
    RANK_LOCAL[r]=$(wc -w <<<"${NODE_RANKS[$n]:-}")
    NODE_RANKS[$n]="${NODE_RANKS[$n]:-} $r"
done
ROOT_ADDR=$(node_ip "${RANK_NODE[0]}"):$PORT

if ((!QUIET)); then
    if ((LIMIT)); then
        shape="rate $RATE ($(awk -v b="$RATE_BPS" 'BEGIN{printf "%.1f MB/s", b/1e6}')), burst $BURST, latency $LATENCY (node upload ${HOST_LATENCY:-$LATENCY}), on both ends of every link"
    else
        shape="no rate limit"
    fi
    note "# testbed $PREFIX: $NODES nodes x $RPN ranks per node = $NRANKS ranks, placement $PLACEMENT"
    note "# links: $shape; switch $SW (bridge br0)"
    for ((i = 0; i < NODES; i++)); do
        note "#   n$i  $(node_ip "$i")/16  ns $(node_ns "$i")  ranks${NODE_RANKS[$i]:- (none)}"
    done
    if ((${#CMD[@]} > 0)); then
        note "# SNCL_ROOT=$ROOT_ADDR; logs in $LOGDIR"
        note "# command: ${CMD[*]@Q}"
    fi
fi

# ---------------------------------------------------------------- measure
# TCP goodput of node 1's link to node 0: sender in n1, receiver in n0; the
# receiver skips the first quarter (at most 0.5 s: slow start) and times the rest.
MEASURE_RECV='
import socket, sys, time
host, port, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((host, port)); s.listen(1); s.settimeout(30)
c, _ = s.accept(); c.settimeout(30)
buf = bytearray(1 << 20)
n = 0; t0 = None; mark = None; skip = min(0.5, secs / 4)
while True:
    k = c.recv_into(buf)
    if not k:
        break
    now = time.monotonic()
    if t0 is None:
        t0 = now
    n += k
    if mark is None and now - t0 >= skip:
        mark = (now, n)
t1 = time.monotonic()
c.close()
if mark is not None and t1 > mark[0]:
    print("%.0f" % ((n - mark[1]) / (t1 - mark[0])))
elif t0 is not None and t1 > t0:
    print("%.0f" % (n / (t1 - t0)))
else:
    print(0)
'
MEASURE_SEND='
import socket, sys, time
host, port, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
end = time.monotonic() + 10
while True:
    try:
        s = socket.create_connection((host, port), timeout=30)
        break
    except OSError:
        if time.monotonic() > end:
            raise
        time.sleep(0.05)
buf = b"\0" * (1 << 20)
stop = time.monotonic() + secs
while time.monotonic() < stop:
    s.sendall(buf)
s.shutdown(socket.SHUT_WR)
s.recv(1)
s.close()
'
LINK_BPS=
if ((MEASURE)); then
    rx=$LOGDIR/measure.out
    ip netns exec "$(node_ns 0)" "$PYTHON" -c "$MEASURE_RECV" "$(node_ip 0)" "$MPORT" "$MEASURE_SECS" \
        >"$rx" 2>"$LOGDIR/measure-recv.err" &
    rpid=$!
    WRAPPERS+=("$rpid")
    ip netns exec "$(node_ns 1)" "$PYTHON" -c "$MEASURE_SEND" "$(node_ip 0)" "$MPORT" "$MEASURE_SECS" \
        2>"$LOGDIR/measure-send.err" &
    spid=$!
    WRAPPERS+=("$spid")
    # (waiting in the background lets a signal interrupt at once)
    wait "$spid" || { cat "$LOGDIR/measure-send.err" >&2; die "goodput measurement: the sender failed"; }
    wait "$rpid" || { cat "$LOGDIR/measure-recv.err" >&2; die "goodput measurement: the receiver failed"; }
    LINK_BPS=$(<"$rx")
    is_uint "$LINK_BPS" || die "goodput measurement: bad result '$LINK_BPS'"
    note "$(awk -v b="$LINK_BPS" -v r="$RATE_BPS" -v n1="$(node_ip 1)" -v n0="$(node_ip 0)" 'BEGIN {
        s = sprintf("# link goodput: %.2f Gbit/s (%.1f MB/s", b * 8 / 1e9, b / 1e6)
        if (b * 8 < 1e9) s = s sprintf(", %.1f Mbit/s", b * 8 / 1e6)
        s = s sprintf("), TCP n1 %s -> n0 %s", n1, n0)
        if (r > 0) s = s sprintf(", %.1f%% of the rate", 100 * b / r)
        print s }')"
    if ((${#CMD[@]} == 0)); then
        echo "$LINK_BPS"
        FAILED=0
        exit 0
    fi
fi

# ---------------------------------------------------------------- ranks
ENV_COMMON=(SNCL_WORLD_SIZE="$NRANKS" SNCL_ROOT="$ROOT_ADDR" SNCL_SECRET="$SECRET"
    SNCL_TESTBED_RATE_BPS="$RATE_BPS")
[[ -z $LINK_BPS ]] || ENV_COMMON+=(SNCL_TESTBED_LINK_BPS="$LINK_BPS")

declare -A PID_RANK=()
for ((r = 0; r < NRANKS; r++)); do
    n=${RANK_NODE[r]}
    log=$LOGDIR/rank$r.log
    envs=("${ENV_COMMON[@]}" SNCL_RANK="$r" SNCL_LOCAL_RANK="${RANK_LOCAL[r]}" SNCL_NODE_ID="n$n")
    # Each rank runs under a wrapper subshell whose own stderr is muted (fd 3 keeps the
    # real one): it reports the rank's status as its exit code, and bash's "Killed" /
    # "Terminated" notes about a stopped rank go nowhere.
    if ((r == 0)); then
        : >"$log"
        {
            exec 3>&2 2>/dev/null
            ip netns exec "$(node_ns "$n")" env "${envs[@]}" "${CMD[@]}" \
                2> >(tee -a "$log" >&3) 3>&- </dev/null | tee -a "$log" 3>&-
            exit "${PIPESTATUS[0]}"
        } &
    else
        {
            exec 2>/dev/null
            ip netns exec "$(node_ns "$n")" env "${envs[@]}" "${CMD[@]}" >"$log" 2>&1 </dev/null
            exit "$?"
        } &
    fi
    WRAPPERS+=("$!")
    PID_RANK[$!]=$r
done

# The fault, if any: the switch side of the node's link goes down (the node loses
# carrier), and for a flap comes back up.
if [[ -n $FAULT ]]; then
    {
        exec 2>&3 3>&-
        sleep "$FAULT_AT"
        ip -n "$SW" link set "v$FAULT_NODE" down
        note "# fault: $(date +%s.%N) link of node $FAULT_NODE (v$FAULT_NODE) down"
        if [[ $FAULT_KIND == flap ]]; then
            sleep "$FAULT_DUR"
            ip -n "$SW" link set "v$FAULT_NODE" up
            note "# fault: $(date +%s.%N) link of node $FAULT_NODE (v$FAULT_NODE) up"
        fi
    } 3>&2 2>/dev/null &
    FAULT_PID=$!
fi

# Wait for the ranks, polling every 0.1 s. Deadlines: the time-out; after a rank
# failed, the fail grace; after TERM, 5 s before KILL. Signals go to the processes
# inside the namespaces only (they are exec'd for sure; the wrappers follow them).
stop_ranks() { # SIGNAL
    local procs
    procs=$(bed_procs)
    # shellcheck disable=SC2086
    [[ -z $procs ]] || kill "-$1" $procs 2>/dev/null || true
}
RC=()
phase=run # run -> grace (a rank failed) -> term (TERM sent) -> kill (KILL sent)
TIMED_OUT=0
deadline=0
now_ms
((TIMEOUT == 0)) || deadline=$((NOW_MS + TIMEOUT * 1000))
WAITING=1
while ((${#PID_RANK[@]} > 0)); do
    tick 0.1
    ((!SIGNALED)) || exit "$SIGNALED"
    for p in "${!PID_RANK[@]}"; do
        kill -0 "$p" 2>/dev/null && continue
        st=0
        wait "$p" || st=$?
        r=${PID_RANK[$p]}
        unset "PID_RANK[$p]"
        RC[r]=$st
        if ((st != 0)); then
            note "# $PROG: rank $r (node n${RANK_NODE[r]}) exited with status $st"
            if [[ $phase == run ]] && ((${#PID_RANK[@]} > 0)); then
                phase=grace
                now_ms
                deadline=$((NOW_MS + FAIL_GRACE * 1000))
            fi
        fi
    done
    ((${#PID_RANK[@]} > 0 && deadline > 0)) || continue
    now_ms
    ((NOW_MS >= deadline)) || continue
    case $phase in
        run | grace)
            if [[ $phase == run ]]; then
                TIMED_OUT=1
                note "# $PROG: time-out after ${TIMEOUT}s, stopping the ranks"
            else
                note "# $PROG: a rank failed ${FAIL_GRACE}s ago, stopping the others"
            fi
            stop_ranks TERM
            phase=term
            deadline=$((NOW_MS + 5000))
            ;;
        *)
            [[ $phase == term ]] && note "# $PROG: ranks still running 5s after SIGTERM, sending SIGKILL"
            stop_ranks KILL
            phase="kill"
            deadline=$((NOW_MS + 1000))
            ;;
    esac
done

WORST=0
for ((r = 0; r < NRANKS; r++)); do
    st=${RC[r]:-255}
    ((st > WORST)) && WORST=$st
done
((TIMED_OUT && WORST < 124)) && WORST=124
if ((WORST == 0)); then
    FAILED=0
else
    codes=
    for ((r = 0; r < NRANKS; r++)); do codes+=" ${RC[r]:-?}"; done
    note "# $PROG: exit statuses of ranks 0..$((NRANKS - 1)):$codes"
fi
exit "$WORST"
