#!/usr/bin/env bash
# Coverage-guided fuzzing of every decoder of outside bytes: libFuzzer through
# `cargo fuzz -s none` (stable Rust: no sanitizer, so no -Z flag), one
# instrumented build (fuzz/libfuzzer/) for all the targets of sncl-fuzz
# (fuzz/src/lib.rs), each started from its seeds. See docs/FUZZING.md.
#
#   scripts/fuzz.sh                      every target, 60 s each
#   scripts/fuzz.sh --seconds 600 topofile settings_file
#   JOBS=2 scripts/fuzz.sh               libFuzzer workers per target
#   SNCL_FUZZ=target/debug/sncl-fuzz scripts/fuzz.sh   a seed tool already built
#
# Installs cargo-fuzz (cargo install) and a C++ compiler (apt-get) when they
# are missing. Corpora grow in target/fuzz-corpus/<target>/ and are reused by
# later runs; a crashing input is saved as fuzz/crashes/<target>-crash-<hash>
# and the script exits 1 (keep it in fuzz/regressions/ once fixed: the
# property tests replay that directory).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=60
TARGETS=()
while [[ $# -gt 0 ]]; do
    case $1 in
        --seconds) SECONDS_EACH=$2; shift 2 ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        -*) echo "fuzz.sh: unknown flag $1" >&2; exit 2 ;;
        *) TARGETS+=("$1"); shift ;;
    esac
done
JOBS=${JOBS:-1}

if ! command -v c++ >/dev/null 2>&1; then
    echo "fuzz.sh: installing a C++ compiler (libFuzzer's runtime is C++)"
    if [[ $(id -u) == 0 ]]; then
        { apt-get update -qq && apt-get install -y -qq g++; } >/dev/null
    else
        echo "fuzz.sh: no C++ compiler and not root: install g++" >&2
        exit 1
    fi
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: installing cargo-fuzz"
    cargo install --locked cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz
fi

# The seed tool: $SNCL_FUZZ where the caller built it (scripts/reliability.sh
# takes the test suite's), else a dev build of its own.
if [[ -z ${SNCL_FUZZ:-} ]]; then
    cargo build -q -p sncl-fuzz
    SNCL_FUZZ=target/debug/sncl-fuzz
fi
if [[ ${#TARGETS[@]} == 0 ]]; then
    mapfile -t TARGETS < <("$SNCL_FUZZ" list)
fi
ROOT=$PWD
CORPUS=$ROOT/target/fuzz-corpus
FUZZ=(cargo fuzz run -s none -a --fuzz-dir "$ROOT/fuzz/libfuzzer" decoder)
cargo fuzz build -s none -a --fuzz-dir fuzz/libfuzzer decoder
mkdir -p fuzz/crashes

failed=()
for t in "${TARGETS[@]}"; do
    "$SNCL_FUZZ" seeds "$CORPUS" "$t" 2>/dev/null
    log=$(mktemp "${TMPDIR:-/tmp}/sncl-fuzz-$t.XXXXXX")
    parallel=()
    if [[ $JOBS -gt 1 ]]; then
        # Workers log to fuzz-<n>.log in the working directory: keep them in target/.
        parallel=(-jobs="$JOBS" -workers="$JOBS")
    fi
    if (cd target && SNCL_FUZZ_TARGET=$t "${FUZZ[@]}" "$CORPUS/$t" -- \
        -max_total_time="$SECONDS_EACH" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
        "${parallel[@]}" -print_final_stats=1 -artifact_prefix="$ROOT/fuzz/crashes/$t-") \
        >"$log" 2>&1; then
        runs=$(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)
        cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 || true)
        echo "fuzz: $t: ${runs:-?} inputs in ${SECONDS_EACH} s, ${cov:-cov: ?}, corpus $(ls "$CORPUS/$t" | wc -l), no crash"
        rm -f "$log"
    else
        echo "fuzz: $t: FAILED (log: $log)"
        grep -E "panicked|ERROR|SUMMARY|artifact" "$log" | head -8 | sed 's/^/  | /'
        failed+=("$t")
    fi
done
if [[ ${#failed[@]} -gt 0 ]]; then
    echo "fuzz: crashes in ${failed[*]} (inputs in fuzz/crashes/)"
    exit 1
fi
echo "fuzz: ${#TARGETS[@]} target(s), no crash"
