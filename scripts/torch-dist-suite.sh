#!/usr/bin/env bash
# PyTorch's own distributed test suite (_DistTestBase, from the torch wheel:
# torch.testing._internal.distributed.distributed_test) at world size 2, on
# gloo and on sncl, and the comparison: every test that passes on gloo and
# runs on sncl must pass there. Not part of scripts/test.sh (about 15 minutes
# per backend on a 2-core machine); run it after changing the backend.
#
#   scripts/torch-dist-suite.sh                 the whole suite, both backends
#   scripts/torch-dist-suite.sh -k all_reduce   only tests matching (unittest -k)
#   BACKENDS=sncl scripts/torch-dist-suite.sh   one backend (no comparison)
#   SUMMARY_ONLY=1 BACKENDS="..." ...           compare the results of earlier runs
#   BACKENDS="gloo sncl sncl-as-gloo" ...       also the suite's gloo-only tests on
#                                               sncl (it believes it tests gloo; every
#                                               "gloo" group it makes is sncl)
#
# Results: target/torch-dist-suite/{gloo,sncl}.tsv (test, pass|skip|fail|
# error, detail), their logs, and summary.txt. Exit status: 0 when nothing
# that passes on gloo fails on sncl; 1 otherwise; 77 when torch or the
# suite's dependency (expecttest) cannot be installed (no package index).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${CARGO_TARGET_DIR:-$ROOT/target}/torch-dist-suite
BACKENDS=${BACKENDS:-gloo sncl}
mkdir -p "$OUT"

set +e
scripts/test-torch.sh --setup-only >"$OUT/setup.log" 2>&1
rc=$?
set -e
if [ $rc -eq 77 ]; then
    echo "[torch-dist-suite] SKIP: $(grep SKIP "$OUT/setup.log" | tail -1)" >&2
    exit 77
fi
[ $rc -eq 0 ] || { tail -20 "$OUT/setup.log" >&2; echo "[torch-dist-suite] setup failed" >&2; exit 1; }
VPY=${TORCH_VENV:-$ROOT/target/torch-venv}/bin/python
if ! "$VPY" -c 'import expecttest' 2>/dev/null; then
    "$VPY" -m pip install --quiet --retries 2 --timeout 30 expecttest >"$OUT/pip.log" 2>&1 || {
        echo "[torch-dist-suite] SKIP: cannot install expecttest (the suite imports it): see $OUT/pip.log" >&2
        exit 77
    }
fi

for b in $BACKENDS; do
    # SUMMARY_ONLY=1: compare the results already in $OUT, run nothing.
    [ "${SUMMARY_ONLY:-0}" = 1 ] && continue
    rm -f "$OUT/$b.tsv"
    tmp=$(mktemp -d)
    echo "[torch-dist-suite] $b: log $OUT/$b.log"
    start=$(date +%s)
    set +e
    BACKEND=$b WORLD_SIZE=2 TEMP_DIR=$tmp SUITE_RESULTS=$OUT/$b.tsv OMP_NUM_THREADS=1 \
        PYTHONWARNINGS=ignore timeout --kill-after=10 7200 \
        "$VPY" python/torch_suite/dist_suite.py "$@" >"$OUT/$b.log" 2>&1
    set -e
    rm -rf "$tmp"
    echo "[torch-dist-suite] $b: $(( $(date +%s) - start )) s, $(cut -f2 "$OUT/$b.tsv" 2>/dev/null | sort | uniq -c | tr '\n' ' ')"
done

"$VPY" - "$OUT" $BACKENDS <<'PY'
import os, sys
out, backends = sys.argv[1], sys.argv[2:]
def load(b):
    p = os.path.join(out, f"{b}.tsv")
    rows = {}
    if os.path.exists(p):
        for line in open(p):
            name, status, detail = (line.rstrip("\n").split("\t") + ["", ""])[:3]
            rows[name] = (status, detail)
    return rows
res = {b: load(b) for b in backends}
lines = []
for b in backends:
    counts = {}
    for s, _ in res[b].values():
        counts[s] = counts.get(s, 0) + 1
    lines.append(f"{b}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
bad = []
if "gloo" in res and "sncl" in res:
    g, s = res["gloo"], res["sncl"]
    gloo_pass = [t for t, (st, _) in g.items() if st == "pass"]
    both = [t for t in gloo_pass if s.get(t, ("missing",))[0] == "pass"]
    not_run = [t for t in gloo_pass if s.get(t, ("missing",))[0] == "skip"]
    bad = [t for t in gloo_pass if s.get(t, ("missing",))[0] not in ("pass", "skip")]
    only_sncl = [t for t, (st, _) in s.items() if st == "pass" and g.get(t, ("",))[0] != "pass"]
    lines.append(f"passing on gloo: {len(gloo_pass)}; of those on sncl: pass {len(both)}, "
                 f"skipped {len(not_run)}, failed {len(bad)}; passing on sncl only: {len(only_sncl)}")
    for t in bad:
        lines.append(f"  FAIL on sncl (passes on gloo): {t}: {s.get(t, ('missing', ''))[1][:200]}")
    a = res.get("sncl-as-gloo", {})
    for t in not_run:
        also = ""
        if t in a:
            also = f" -> as gloo on sncl: {a[t][0]}" + (f" ({a[t][1][:160]})" if a[t][0] != "pass" else "")
        lines.append(f"  skipped on sncl (passes on gloo): {t}: {s[t][1][:120]}{also}")
    if a:
        as_bad = [t for t in not_run if a.get(t, ("missing",))[0] not in ("pass", "skip", "missing")]
        lines.append(f"gloo-only tests run on sncl as gloo: pass "
                     f"{sum(1 for t in not_run if a.get(t, ('',))[0] == 'pass')}, "
                     f"fail {len(as_bad)}, not run {sum(1 for t in not_run if t not in a)}")
    lines.append("passing on both: " + " ".join(sorted(both)))
text = "\n".join(lines) + "\n"
open(os.path.join(out, "summary.txt"), "w").write(text)
print(text, end="")
sys.exit(1 if bad else 0)
PY
