#!/usr/bin/env bash
# The PyTorch backend's device checks, for the lent GPU machine (torch with
# CUDA, no Rust toolchain, no network). Two steps:
#
#   scripts/gpu-check-torch.sh --prepare   here: builds libsncl (release) and
#                                          puts a debug-stripped copy in
#                                          target/gpu-check/lib/libsncl.a
#   scripts/gpu-check-torch.sh             there (carry target/gpu-check):
#                                          builds sncl_torch against that
#                                          machine's torch and runs the checks
#
# Sections (each prints PASS / FAIL / SKIP with its numbers as it finishes):
#   build   pip install --no-build-isolation --no-deps --no-index python/ into
#           a temporary --target directory (on PYTHONPATH), linking
#           target/gpu-check/lib/libsncl.a with the header from include/
#   cuda    torchrun, 2 processes on the one GPU (cuda:0 when there is one):
#           all_reduce / all_gather / reduce_scatter / broadcast and the
#           rest of python/tests/test_cuda.py on CUDA tensors, under
#           "sncl" (device_id=) and "cpu:gloo,cuda:sncl"
#   ddp     torchrun, 2 processes: DDP on CUDA tensors with sncl vs gloo
#           (python/tests/test_ddp_cuda.py), max relative difference of the
#           final parameters <= 1e-5 (printed)
# Without CUDA (torch.cuda.is_available() false) it prints why and exits 0
# before building anything.
#
# Environment: PYTHON (default python3), TOTAL_LIMIT (seconds for the whole
# run, default 280; each section's limit is cut to what is left),
# BUILD_LIMIT (seconds for the build, default 200),
# NPROC (processes per torchrun, default 2), KEEP (1: keep the build dir),
# BUILD_ONLY (1: only the build section, run even without CUDA: checks the
# install path on a machine without a GPU; SNCL_TORCH_CUDA=0 then builds
# the CPU-only variant).
# Exit status: 0 all sections passed (or the skip), 1 a section failed,
# 2 the inputs are missing.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT_DIR=$ROOT/target/gpu-check
LIB_DIR=$OUT_DIR/lib
PYTHON=${PYTHON:-python3}
NPROC=${NPROC:-2}
TOTAL_LIMIT=${TOTAL_LIMIT:-280}
START=$(date +%s)

say() { printf '[gpu-check-torch] %s\n' "$*"; }

prepare() {
    set -e
    command -v cargo >/dev/null 2>&1 || { say "error: cargo is missing"; exit 2; }
    cargo build --release -p sncl-capi
    local target=${CARGO_TARGET_DIR:-$ROOT/target}
    mkdir -p "$LIB_DIR"
    cp "$target/release/libsncl.a" "$LIB_DIR/libsncl.a"
    # Debug sections are most of the archive; the link needs none of them.
    strip --strip-debug "$LIB_DIR/libsncl.a"
    du -sh "$LIB_DIR/libsncl.a"
}

if [[ ${1:-} == --prepare ]]; then
    prepare
    exit
fi

# What is left of TOTAL_LIMIT, at most $1 seconds.
limit() {
    local left=$((TOTAL_LIMIT - ($(date +%s) - START)))
    ((left < $1)) && echo $((left > 1 ? left : 1)) || echo "$1"
}

# ------------------------------------------------------------------ skip?
if ! probe=$("$PYTHON" - 2>&1 <<'EOF'
import torch
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"cuda available: {torch.cuda.is_available()}, devices: {torch.cuda.device_count()}")
if torch.cuda.is_available():
    print("device 0:", torch.cuda.get_device_name(0))
EOF
); then
    say "FAIL probe: $PYTHON cannot import torch:"
    printf '%s\n' "$probe" | tail -5
    exit 1
fi
printf '%s\n' "$probe" | sed 's/^/[gpu-check-torch] /'
BUILD_ONLY=${BUILD_ONLY:-0}
if [[ $BUILD_ONLY != 1 ]] && ! grep -q "cuda available: True" <<<"$probe"; then
    say "SKIP: torch.cuda.is_available() is false on this machine (no GPU or no CUDA driver): nothing to check"
    exit 0
fi

for f in "$LIB_DIR/libsncl.a" "$ROOT/include/sncl.h"; do
    [[ -f $f ]] || { say "error: $f is missing; run scripts/gpu-check-torch.sh --prepare first"; exit 2; }
done

failed=0
BUILD=$(mktemp -d "${TMPDIR:-/tmp}/sncl-torch.XXXXXX")
cleanup() { [[ ${KEEP:-0} == 1 ]] || rm -rf "$BUILD"; }
trap cleanup EXIT

# ------------------------------------------------------------------ build
t0=$(date +%s)
# A copy of python/: pip builds in the source tree (build/, *.egg-info).
cp -r "$ROOT/python" "$BUILD/src"
rm -rf "$BUILD/src/build" "$BUILD"/src/*.egg-info
# pip when it can build a wheel without the network (pip, and wheel or
# setuptools >= 70.1); else setup.py build_ext straight into the target
# (then no entry point: the tests import sncl_torch themselves).
if "$PYTHON" -m pip --version >/dev/null 2>&1 && "$PYTHON" - 2>/dev/null <<'EOF'
import importlib.util, sys
import setuptools
v = tuple(int(x) for x in setuptools.__version__.split(".")[:2] if x.isdigit())
sys.exit(0 if importlib.util.find_spec("wheel") or v >= (70, 1) else 1)
EOF
then
    how=pip
    install=("$PYTHON" -m pip install --no-build-isolation --no-deps --no-index
        --disable-pip-version-check --target "$BUILD/site" "$BUILD/src")
else
    how="setup.py build_ext (pip cannot build a wheel here)"
    mkdir -p "$BUILD/site/sncl_torch"
    cp "$BUILD/src/sncl_torch/__init__.py" "$BUILD/site/sncl_torch/"
    install=(bash -c 'cd "$1/src" && "$2" setup.py build_ext --build-lib "$1/site" --build-temp "$1/tmp"'
        _ "$BUILD" "$PYTHON")
fi
if SNCL_LIB_DIR=$LIB_DIR SNCL_INCLUDE_DIR=$ROOT/include MAX_JOBS=${MAX_JOBS:-16} \
    timeout --kill-after=10 "$(limit "${BUILD_LIMIT:-200}")" "${install[@]}" >"$BUILD/build.log" 2>&1; then
    cuda_line=$(grep -ao 'sncl_torch: CUDA tensor support[^"]*' "$BUILD/build.log" | head -1)
    built=$(PYTHONPATH=$BUILD/site "$PYTHON" -c 'import sncl_torch; print(sncl_torch.cuda_built())' 2>/dev/null | tail -1)
    if [[ $built == True || ($BUILD_ONLY == 1 && $built == False && ${SNCL_TORCH_CUDA:-1} == 0) ]]; then
        say "PASS build ($how): sncl_torch built in $(($(date +%s) - t0)) s, CUDA support: $built${cuda_line:+ (${cuda_line#sncl_torch: })}"
    else
        say "FAIL build: sncl_torch built in $(($(date +%s) - t0)) s but without CUDA support (cuda_built: $built):"
        grep -a "sncl_torch:" "$BUILD/build.log" | head -5
        [[ -n $built ]] || PYTHONPATH=$BUILD/site "$PYTHON" -c 'import sncl_torch' 2>&1 | tail -5
        failed=1
    fi
else
    say "FAIL build ($how) of python/ failed after $(($(date +%s) - t0)) s; the end of its log:"
    tail -n 40 "$BUILD/build.log"
    exit 1
fi

if [[ $BUILD_ONLY == 1 ]]; then
    exit $failed
fi

# ------------------------------------------------------------------ tests
# run_test SECTION SCRIPT LIMIT: torchrun with NPROC processes; prints the
# Results table and PASS/FAIL with the case counts.
run_test() {
    local section=$1 script=$2 lim
    lim=$(limit "$3")
    local log=$BUILD/$section.log s rc
    s=$(date +%s)
    OMP_NUM_THREADS=1 PYTHONWARNINGS=ignore::FutureWarning PYTHONPATH=$BUILD/site \
        timeout --kill-after=10 "$lim" \
        "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node "$NPROC" \
        "$ROOT/python/tests/$script" >"$log" 2>&1
    rc=$?
    grep -aE '^(==|  (pass|FAIL))|max relative difference|SKIP' "$log" | sed 's/^/    /'
    local counts
    counts=$(grep -aE '^== .*passed' "$log" | sed -E 's/^== [^:]*: //' | paste -sd ';' -)
    if ((rc == 0)); then
        say "PASS $section: ${counts:-no table} ($(($(date +%s) - s)) s)"
    else
        local why="exit status $rc"
        ((rc == 124 || rc == 137)) && why="timed out after $lim s"
        say "FAIL $section: $why, ${counts:-no table} ($(($(date +%s) - s)) s); the end of its log:"
        tail -n 40 "$log"
        failed=1
    fi
}

run_test cuda test_cuda.py 150
run_test ddp test_ddp_cuda.py 90

say "done in $(($(date +%s) - START)) s: $([[ $failed == 0 ]] && echo PASS || echo FAIL)"
exit $failed
