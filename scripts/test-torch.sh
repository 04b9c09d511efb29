#!/usr/bin/env bash
# The PyTorch backend's tests: builds libsncl, installs torch into a cached
# virtualenv, builds and installs the "sncl" c10d backend (python/) against
# it, then runs the torchrun tests (python/tests). Safe to run repeatedly:
# each step is skipped when already done.
#
#   scripts/test-torch.sh            # everything
#   scripts/test-torch.sh ops ddp    # only these tests (ops ddp fsdp hook world1 exit gloo_parity groups deterministic
#                                    #   cuda ddp_cuda)
#   scripts/test-torch.sh --setup-only   # stop once the backend is installed
#   scripts/test-torch.sh --venv-only    # only the virtualenv with torch (no libsncl, no
#                                        #   backend): .ci/run starts it early, in the background
#
# Environment:
#   TORCH_VENV     the virtualenv (default: target/torch-venv; target/ is
#                  git-ignored, so a fresh clone recreates it: ~2 minutes and
#                  5 GB for the default Linux torch wheel)
#   TORCH_VERSION  the torch to install (default: 2.15.0, the version this
#                  backend was written and tested against)
#   PYTHON         the interpreter for a new virtualenv (default: python3.11,
#                  else python3)
#   NPROC          processes per torchrun test (default: 4; the CUDA tests
#                  use 2: they share the GPUs there are)
#   SNCL_LIB_DIR   a directory holding a prebuilt libsncl.a: used as it is
#                  (no cargo build)
#
# The CUDA tests (cuda, ddp_cuda: CUDA tensors, DDP on CUDA vs gloo) are
# reported as skipped, with the reason, when torch sees no GPU or the
# backend was built without CUDA support.
#
# Exit status: 0 when every test passed; 77 when torch is not installed and
# cannot be (pip cannot reach the package index, or no Python 3.10+ with
# venv): the Rust test harness then skips; 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

TORCH_VENV=${TORCH_VENV:-$ROOT/target/torch-venv}
TORCH_VERSION=${TORCH_VERSION:-2.15.0}
NPROC=${NPROC:-4}
SETUP_ONLY=0
VENV_ONLY=0
if [ "${1:-}" = "--setup-only" ]; then
    SETUP_ONLY=1
    shift
elif [ "${1:-}" = "--venv-only" ]; then
    VENV_ONLY=1
    shift
fi
TESTS=("$@")
if [ ${#TESTS[@]} -eq 0 ]; then
    TESTS=(ops ddp fsdp hook world1 exit gloo_parity groups deterministic cuda ddp_cuda)
fi
SKIP=77

step() { printf '\n[test-torch] %s\n' "$*"; }
die() { printf '[test-torch] error: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------- libsncl
TARGET_DIR=${CARGO_TARGET_DIR:-${CARGO_BUILD_TARGET_DIR:-$ROOT/target}}
if [ $VENV_ONLY -eq 1 ]; then
    :
elif [ -n "${SNCL_LIB_DIR:-}" ] && [ -f "$SNCL_LIB_DIR/libsncl.a" ]; then
    step "using the prebuilt $SNCL_LIB_DIR/libsncl.a"
else
    command -v cargo >/dev/null 2>&1 || die "cargo is missing: install the Rust toolchain first"
    step "building libsncl (cargo build --release -p sncl-capi)"
    cargo build --release -p sncl-capi
    SNCL_LIB_DIR=$TARGET_DIR/release
fi
if [ $VENV_ONLY -eq 0 ]; then
    export SNCL_LIB_DIR
    [ -f "$SNCL_LIB_DIR/libsncl.a" ] || die "$SNCL_LIB_DIR/libsncl.a is missing after the build"
fi

# ---------------------------------------------------------------- virtualenv
# One installer at a time (.ci/run may have started one in the background):
# the lock is held until this script exits; a second run waits for it, then
# finds torch installed.
mkdir -p "$(dirname "$TORCH_VENV")"
exec 9>"$TORCH_VENV.lock"
if command -v flock >/dev/null 2>&1; then
    flock -w 1800 9 || die "waited 30 minutes for $TORCH_VENV.lock (another installer still running?)"
fi
if [ ! -x "$TORCH_VENV/bin/python" ]; then
    PY=${PYTHON:-}
    if [ -z "$PY" ]; then
        if command -v python3.11 >/dev/null 2>&1; then PY=python3.11; else PY=python3; fi
    fi
    skip() { printf '[test-torch] SKIP: %s\n' "$*" >&2; exit $SKIP; }
    command -v "$PY" >/dev/null 2>&1 || skip "no Python interpreter ($PY) to install torch with"
    "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' \
        || skip "$PY is older than 3.10 (torch $TORCH_VERSION needs 3.10+)"
    step "creating the virtualenv $TORCH_VENV ($("$PY" --version 2>&1))"
    "$PY" -m venv "$TORCH_VENV" || { rm -rf "$TORCH_VENV"; skip "$PY cannot create a virtualenv (python3-venv missing?)"; }
fi
VPY=$TORCH_VENV/bin/python
PIP=("$VPY" -m pip)

have_torch() {
    "$VPY" - "$TORCH_VERSION" <<'EOF' >/dev/null 2>&1
import sys
import torch, numpy, setuptools, ninja  # noqa: F401
want = sys.argv[1]
sys.exit(0 if torch.__version__.split("+")[0] == want else 1)
EOF
}

if ! have_torch; then
    step "installing torch==$TORCH_VERSION, numpy, setuptools, wheel, ninja into $TORCH_VENV (about 2 minutes and 5 GB)"
    # Is the index reachable? Without it there is nothing to test with.
    if ! "${PIP[@]}" index versions torch --retries 1 --timeout 20 >/dev/null 2>&1; then
        printf '[test-torch] SKIP: torch is not installed in %s and pip cannot reach the package index (no network?)\n' \
            "$TORCH_VENV" >&2
        exit $SKIP
    fi
    "${PIP[@]}" install --quiet --upgrade pip || true
    set +e
    "${PIP[@]}" install --no-cache-dir --retries 3 "torch==$TORCH_VERSION" numpy setuptools wheel ninja 2>&1 \
        | tee "$TORCH_VENV/.install.log"
    rc=${PIPESTATUS[0]}
    set -e
    if [ "$rc" -ne 0 ]; then
        if grep -qiE 'NewConnectionError|Failed to establish a new connection|Temporary failure in name resolution|Network is unreachable|ConnectTimeout|ReadTimeout|Max retries exceeded' \
            "$TORCH_VENV/.install.log"; then
            printf '[test-torch] SKIP: installing torch failed for lack of network (see above)\n' >&2
            exit $SKIP
        fi
        if grep -qiE 'No matching distribution|Could not find a version that satisfies' \
            "$TORCH_VENV/.install.log"; then
            printf '[test-torch] SKIP: the package index has no torch==%s for this Python and platform (set TORCH_VERSION to one it has)\n' \
                "$TORCH_VERSION" >&2
            exit $SKIP
        fi
        die "pip install torch==$TORCH_VERSION failed (see above)"
    fi
    have_torch || die "torch==$TORCH_VERSION does not import after installing it"
fi
step "torch $("$VPY" -c 'import torch; print(torch.__version__)') in $TORCH_VENV"
if [ $VENV_ONLY -eq 1 ]; then
    exit 0
fi

# ---------------------------------------------------------------- the backend
step "building and installing the sncl backend (pip install --no-build-isolation ./python)"
"${PIP[@]}" install --no-build-isolation --no-deps --quiet "$ROOT/python"
"$VPY" - <<'EOF'
from importlib.metadata import entry_points
import torch.distributed as dist
eps = [e for e in entry_points(group="torch.distributed.backends") if e.name == "sncl"]
assert eps, "the torch.distributed.backends entry point 'sncl' is missing"
if hasattr(dist.Backend, "_ensure_backend_registered"):
    dist.Backend._ensure_backend_registered("sncl")  # loads it through the entry point
    assert "SNCL" in dist.Backend._plugins, "the entry point did not register sncl"
import sncl_torch
print(f"[test-torch] sncl_torch imports (libsncl version code {sncl_torch.version()}), entry point {eps[0].value}")
EOF

if [ $SETUP_ONLY -eq 1 ]; then
    exit 0
fi

# ---------------------------------------------------------------- the tests
# torchrun through the venv's interpreter (a copied venv's bin/torchrun may
# name another interpreter in its shebang).
TORCHRUN=("$VPY" -m torch.distributed.run)
LOGDIR=$TARGET_DIR/test-torch
mkdir -p "$LOGDIR"
declare -A NP=([ops]=$NPROC [ddp]=$NPROC [fsdp]=$NPROC [hook]=$NPROC [world1]=1 [exit]=$NPROC [gloo_parity]=4 [groups]=4 [deterministic]=5
    [cuda]=2 [ddp_cuda]=2)
declare -A LIMIT=([ops]=300 [ddp]=240 [fsdp]=240 [hook]=240 [world1]=120 [exit]=120 [gloo_parity]=240 [groups]=240 [deterministic]=240
    [cuda]=240 [ddp_cuda]=240)
# Why the CUDA tests cannot run here (empty: they can).
# (stdout only: warnings on stderr must not read as a reason)
CUDA_SKIP=$("$VPY" - <<'EOF' 2>/dev/null || echo "the CUDA probe (import torch, sncl_torch) failed"
import torch, sncl_torch
if not torch.cuda.is_available():
    print("torch.cuda.is_available() is false (no GPU or no CUDA driver)")
elif not sncl_torch.cuda_built():
    print("sncl_torch was built without CUDA support (no CUDA headers at install time)")
EOF
)
declare -a SUMMARY=()
failed=0
for t in "${TESTS[@]}"; do
    [ -n "${NP[$t]:-}" ] || die "unknown test '$t' (ops ddp fsdp hook world1 exit gloo_parity groups deterministic cuda ddp_cuda)"
    if [[ $t == cuda || $t == ddp_cuda ]] && [ -n "$CUDA_SKIP" ]; then
        step "test_$t: SKIP: $CUDA_SKIP"
        SUMMARY+=("skip  test_$t ($CUDA_SKIP)")
        continue
    fi
    script=$ROOT/python/tests/test_$t.py
    log=$LOGDIR/$t.log
    step "test_$t: torchrun --standalone --nproc_per_node ${NP[$t]} (log: $log)"
    start=$(date +%s)
    set +e
    # OMP_NUM_THREADS: torchrun's default, stated to keep it quiet.
    OMP_NUM_THREADS=1 PYTHONWARNINGS=ignore::FutureWarning \
        timeout --kill-after=10 "${LIMIT[$t]}" \
        "${TORCHRUN[@]}" --standalone --nproc_per_node "${NP[$t]}" "$script" >"$log" 2>&1
    rc=$?
    set -e
    secs=$(( $(date +%s) - start ))
    grep -E '^(==|  (pass|FAIL))|test_exit' "$log" || true
    if [ $rc -eq 0 ]; then
        SUMMARY+=("pass  test_$t (${secs} s)")
    else
        failed=1
        why="exit status $rc"
        [ $rc -eq 124 ] || [ $rc -eq 137 ] && why="timed out after ${LIMIT[$t]} s"
        SUMMARY+=("FAIL  test_$t ($why, ${secs} s)")
        echo "[test-torch] test_$t failed ($why); the end of its log:" >&2
        tail -n 60 "$log" >&2
    fi
done

step "summary"
for line in "${SUMMARY[@]}"; do echo "  $line"; done
exit $failed
