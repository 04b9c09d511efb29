#!/usr/bin/env bash
# The reliability suite: every attack of the adversarial retest (docs/FAULTS.md,
# docs/SECURITY.md) as one named check with its expected result asserted.
# The short form runs in CI (the test command calls it) in about two minutes;
# the long form is for manual runs (tens of minutes).
#
#   scripts/reliability.sh                 # short form, every attack
#   scripts/reliability.sh --long          # long form, every attack
#   scripts/reliability.sh shrink-flood huge-count   # some attacks
#   scripts/reliability.sh --list          # what each attack does
#
# Each attack prints one line `reliability: PASS|FAIL <attack> (<s> s)`; the
# exit status is 0 only when every attack passed. A failed attack's output is
# kept in $OUT (printed).
set -uo pipefail
cd "$(dirname "$0")/.."

LONG=0
ATTACKS=()
for a in "$@"; do
    case $a in
        --long) LONG=1 ;;
        --short) LONG=0 ;;
        --list) LIST=1 ;;
        -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
        -*) echo "reliability: unknown flag $a" >&2; exit 2 ;;
        *) ATTACKS+=("$a") ;;
    esac
done

# short | long knobs
pick() { if [[ $LONG == 1 ]]; then echo "$2"; else echo "$1"; fi; }

# name | what it attacks and what must happen | command
declare -A WHAT CMD
ORDER=()
attack() {
    ORDER+=("$1")
    WHAT[$1]=$2
    CMD[$1]=$3
}
# Whole-workspace selections, filtered by target and test name: a `-p`
# selection resolves features for that package alone and compiles its
# dependency tree again (10-40 s each after the suite's build); these reuse it.
T="cargo test --workspace --profile test -q"
B="cargo build --workspace --all-targets --profile test -q"
attack shrink-flood \
    "idle connections held on every survivor's standby store, one rank of 8 SIGKILLed (rank 0 in a quarter of the trials), shm and TCP alternating: every survivor agrees on the same failed set and shrinks" \
    "SNCL_TEST_TRIALS=$(pick 3 20) SNCL_TEST_FLOOD=$(pick 128 4096) $T --test fault_tolerance killed_rank_then_shrink_under_a_connection_flood"
attack shrink-slow-coordinator \
    "the coordinator SIGSTOPped for 1 s (under the timeout) right after the kill: slow is not dead, the survivors agree" \
    "SNCL_TEST_TRIALS=$(pick 2 20) $T --test fault_tolerance killed_rank_then_shrink_with_a_slow_coordinator"
attack second-failure \
    "a second rank (the coordinator in half the trials) killed 0-300 ms into the agreement: one answer or an error on every survivor, never two answers" \
    "SNCL_TEST_TRIALS=$(pick 4 30) $T --test fault_tolerance a_second_failure_during_agreement_gives_one_answer"
attack grow-back \
    "one rank of 4 SIGKILLed mid all-reduce (rank 0 in a quarter of the trials), shm and TCP alternating: the survivors agree, shrink to 3, a new process joins with rank 0's grow id, grow to 4; five training steps give the weights of a fresh 4-process job, bit for bit" \
    "SNCL_TEST_TRIALS=$(pick 2 20) $T --test fault_tolerance killed_rank_then_shrink_then_grow_back_trains_like_a_fresh_job"
attack setup-flood \
    "idle connections on every port rank 0 listens on (store, standby store, TCP data) plus a junk sender: a 4-rank TCP job completes in at most 2x its quiet time (+0.25 s)" \
    "SNCL_TEST_FLOOD=$(pick 500 5000) $T --test flood"
attack store-strangers \
    "idle, trickling and flooding strangers on the store, 1,000 authenticated ranks waiting on it, a reply in flight when rank 0 leaves: ranks join within 1 s, no thread per connection, the reply arrives" \
    "$T --lib tcpstore::tests"
attack tcp-strangers \
    "4,608 idle connections on a TCP data listener before the rank it waits for: the rank joins" \
    "$T --test handshake"
attack init-strangers \
    "stray and wrong-secret connections during a real init: init completes" \
    "$T --test failures stray_and_wrong_secret_connections_do_not_disturb_init"
attack root-mismatch \
    "broadcast/reduce/gather/scatter where ranks name different roots, or every rank itself: an error on every rank in the same operation, buffers untouched" \
    "$T --test failures mismatched_roots_fail_every_rank_in_the_same_operation"
attack secrets \
    "a 0644 settings file with SNCL_SECRET, a FIFO, another user's and an all-zero secret file: each refused with a clear error" \
    "$T --test conf_file a_settings_file_with_the_secret_must_be_private && $T --lib -- env::tests::secret_sources env::tests::weak_or_odd_secrets_are_refused"
attack huge-count \
    "int8 all-reduces of 2^40, 2^44 and 2^62 elements through the C ABI under 'ulimit -v 4G': refused in under 1 s each, RSS growth under 10 MB" \
    "$B && (ulimit -v 4194304 && $T --lib huge_counts_are_refused_before_anything_is_planned)"
attack fuzz \
    "every decoder of outside bytes under libFuzzer (coverage-guided), from its seeds and its corpus so far: no panic, hang or unbounded allocation" \
    "$B && SNCL_FUZZ=target/debug/sncl-fuzz scripts/fuzz.sh --seconds $(pick 1 60)"
attack soak \
    "many all-reduces on local ranks over shm and TCP: RSS flat within 5 %, descriptors and threads constant" \
    "$(pick "$B && COMMBENCH=target/debug/commbench NP=2 SMALL=4000 LARGE=8 EVERY=1000" "") scripts/soak.sh"

if [[ ${LIST:-0} == 1 ]]; then
    for a in "${ORDER[@]}"; do printf '%-24s %s\n' "$a" "${WHAT[$a]}"; done
    exit 0
fi
if [[ ${#ATTACKS[@]} == 0 ]]; then
    ATTACKS=("${ORDER[@]}")
fi
for a in "${ATTACKS[@]}"; do
    if [[ -z ${CMD[$a]+x} ]]; then
        echo "reliability: unknown attack '$a' (see --list)" >&2
        exit 2
    fi
done

OUT=$(mktemp -d "${TMPDIR:-/tmp}/sncl-reliability.XXXXXX")
form=$(pick short long)
echo "reliability: ${#ATTACKS[@]} attack(s), $form form; load $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"
failed=()
for a in "${ATTACKS[@]}"; do
    t0=$(date +%s%N)
    if bash -c "${CMD[$a]}" >"$OUT/$a.log" 2>&1; then
        verdict=PASS
    else
        verdict=FAIL
        failed+=("$a")
    fi
    ms=$((($(date +%s%N) - t0) / 1000000))
    printf 'reliability: %s %s (%d.%d s)\n' "$verdict" "$a" $((ms / 1000)) $((ms % 1000 / 100))
    if [[ $verdict == FAIL ]]; then
        echo "  expected: ${WHAT[$a]}"
        echo "  command:  ${CMD[$a]}"
        tail -n 30 "$OUT/$a.log" | sed 's/^/  | /'
    fi
done
if [[ ${#failed[@]} -gt 0 ]]; then
    echo "reliability: FAILED ${failed[*]} (logs in $OUT)"
    exit 1
fi
rm -rf "$OUT"
echo "reliability: all ${#ATTACKS[@]} passed ($form form)"
