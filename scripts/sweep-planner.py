#!/usr/bin/env python3
"""Does the planner pick the fastest algorithm? (issue: host data path, point 4)

For every point of a sweep, runs commbench with the planner's default and
with every forced algorithm of the collective, interleaved (rep 1: default,
ring, tree, ...; rep 2: ring, tree, ..., default; the order rotates), and prints per point the default's median time,
the best forced algorithm's, their ratio and whether the gap lies within the
repetitions' spread (max - min of the faster variant's times); a point whose
default ran the best forced algorithm itself passes ("same algorithm"; on one
node ring and flat-ring are one schedule, the ranks in rank order).

    scripts/sweep-planner.py                       # the whole sweep (~20-30 min on 2 cores)
    scripts/sweep-planner.py --reps 3 --configs shm2 --ops all_reduce
    scripts/sweep-planner.py --testbed             # also 4 x 2 test bed all_reduce (root)
    scripts/sweep-planner.py --quick --fail-above 1.5   # CI's measured oracle (~1-2 min)

Local configurations: shm2, shm4, tcp2, tcp4 (SNCL_TRANSPORT=shm/tcp, --np 2/4);
sizes 8 B to 64 MiB by factors of 8; ops all_reduce, all_gather,
reduce_scatter, broadcast. The test bed (scripts/testbed.sh, 4 nodes x 2
ranks, --rate, default 1gbit) runs all_reduce at 64 KiB, 1 MiB and 16 MiB.
Before a configuration's runs, `commbench calibrate` measures its tier (on
one node: `--np N` over the configuration's transport; on the bed: across
nodes too) and every run of it gets SNCL_TOPO_FILE, so the planner prices
the algorithms with this machine's constants; --no-calibrate keeps the
built-in defaults. Output: a table on stdout, and --out FILE (markdown).
A point passes when the default is within --tolerance (5 %) of the best
forced algorithm, or the gap lies within the spread, or the default ran the
best algorithm itself. --quick: shm2 and tcp2, all_reduce and broadcast at
8 B, 512 B, 32 KiB and 2 MiB, 3 repetitions (the test suite's measured
oracle of the planner, commbench/tests/planner_oracle.rs).
Exit status 0; 1 when a run failed or reported wrong values, or (with
--fail-above R) when a point's default is more than R times slower than the
best forced algorithm beyond the spread.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMBENCH = os.path.join(ROOT, "target", "release", "commbench")

# Algorithms that can run on one node (hier needs >= 2 nodes).
FORCED = {
    "all_reduce": ["ring", "tree", "rd", "flat-ring"],
    "all_gather": ["ring", "flat-ring"],
    "reduce_scatter": ["ring", "flat-ring"],
    "broadcast": ["tree", "ring"],
}
FORCED_MULTINODE = {"all_reduce": ["ring", "tree", "rd", "hier", "flat-ring"]}
CONFIGS = {
    "shm2": ("shm", 2),
    "shm4": ("shm", 4),
    "tcp2": ("tcp", 2),
    "tcp4": ("tcp", 4),
}


def run_commbench(cmd, env, timeout):
    """Runs one commbench, returns {size: (algo, median_us)} or raises."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    try:
        r = subprocess.run(
            cmd + ["--json", path],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            timeout=timeout,
        )
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr[-600:]}")
        with open(path) as f:
            rows = json.load(f)
    finally:
        os.unlink(path)
    out = {}
    for row in rows:
        if row["oop"]["wrong"] or row["ip"]["wrong"]:
            raise RuntimeError(f"{' '.join(cmd)}: wrong values at {row['size']} B")
        out[row["size"]] = (row["algo"], row["oop"]["median_us"])
    return out


def calibrate(cmd, env, topo, timeout, failures, what):
    """Runs `commbench calibrate` (cmd) writing topo; returns the env for the
    runs (with SNCL_TOPO_FILE) or env unchanged when it failed."""
    try:
        r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, timeout=timeout)
        if r.returncode != 0 or not os.path.exists(topo):
            raise RuntimeError(f"exit {r.returncode}: {r.stderr[-600:]}")
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        failures.append(f"{what} calibrate: {e}")
        return env
    tiers = [ln for ln in r.stdout.splitlines() if ln.startswith(("intra.", "inter."))]
    print(f"# {what} calibrated: {' '.join(tiers)}", file=sys.stderr, flush=True)
    return dict(env, SNCL_TOPO_FILE=topo)


def sweep_local(args, failures):
    results = []  # (config, op, size, default_algo, {variant: [times]})
    sizes = args.sizes.split()
    for cfg in args.configs:
        transport, np_ = CONFIGS[cfg]
        env = dict(os.environ, SNCL_TRANSPORT=transport)
        if args.calibrate:
            topo = os.path.join(args.workdir, f"topo-{cfg}.txt")
            cmd = [COMMBENCH, "calibrate", "--np", str(np_), "-o", topo, "--size", "8M", "-n", "5"]
            env = calibrate(cmd, env, topo, args.timeout, failures, cfg)
        for op in args.ops:
            variants = ["default"] + FORCED[op]
            times = {}
            default_algo = {}
            for rep in range(args.reps):
                # Rotated per repetition: a variant that always ran first
                # (after a switch of op) measured up to 1.5x slower than the
                # same algorithm forced (rd at 64 B on shm2).
                k = rep % len(variants)
                for v in variants[k:] + variants[:k]:
                    cmd = [COMMBENCH, op, *sizes, "-n", str(args.iters), "-w", str(args.warmup), "--np", str(np_)]
                    if v != "default":
                        cmd += ["--algo", v]
                    try:
                        got = run_commbench(cmd, env, args.timeout)
                    except (RuntimeError, subprocess.TimeoutExpired) as e:
                        failures.append(f"{cfg} {op} {v}: {e}")
                        continue
                    for size, (algo, t) in got.items():
                        times.setdefault(size, {}).setdefault(v, []).append(t)
                        if v == "default":
                            default_algo[size] = algo
                print(f"# {cfg} {op} rep {rep + 1}/{args.reps} done", file=sys.stderr, flush=True)
            for size in sorted(times):
                results.append((cfg, op, size, default_algo.get(size, "?"), times[size]))
    return results


def sweep_testbed(args, failures):
    results = []
    variants = ["default"] + FORCED_MULTINODE["all_reduce"]
    times = {}
    default_algo = {}
    bed = [os.path.join(ROOT, "scripts", "testbed.sh"),
           "--nodes", "4", "--ranks-per-node", "2", "--rate", args.rate, "--"]
    env = dict(os.environ)
    if args.calibrate:
        topo = os.path.join(args.workdir, "topo-bed.txt")
        env = calibrate(bed + ["commbench", "calibrate", "-o", topo, "--size", "8M", "-n", "3"],
                        env, topo, args.timeout, failures, "test bed")
    for rep in range(args.reps):
        k = rep % len(variants)
        for v in variants[k:] + variants[:k]:
            with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
                path = f.name
            cmd = bed + [
                "commbench", "all_reduce", "-b", "64K", "-e", "16M", "-f", "16",
                "-n", str(args.iters), "-w", str(args.warmup), "--json", path,
            ]
            if v != "default":
                cmd += ["--algo", v]
            try:
                r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   text=True, timeout=args.timeout)
                if r.returncode != 0:
                    raise RuntimeError(f"exit {r.returncode}: {r.stderr[-600:]}")
                with open(path) as f:
                    rows = json.load(f)
                for row in rows:
                    if row["oop"]["wrong"]:
                        raise RuntimeError(f"wrong values at {row['size']} B")
                    times.setdefault(row["size"], {}).setdefault(v, []).append(row["oop"]["median_us"])
                    if v == "default":
                        default_algo[row["size"]] = row["algo"]
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                failures.append(f"testbed all_reduce {v}: {e}")
            finally:
                if os.path.exists(path):
                    os.unlink(path)
        print(f"# testbed rep {rep + 1}/{args.reps} done", file=sys.stderr, flush=True)
    for size in sorted(times):
        results.append((f"bed4x2@{args.rate}", "all_reduce", size, default_algo.get(size, "?"), times[size]))
    return results


def same_schedule(a, b, one_node):
    """Whether two algorithm names run one schedule: on one node the
    topology's ring visits the ranks in rank order, as flat-ring does
    (comm_core::algo::table, `ring` and `identity`)."""
    canon = lambda x: "ring" if one_node and x == "flat-ring" else x
    return canon(a) == canon(b)


def verdict(default_algo, times, one_node, tolerance):
    """(default median, best forced name, its median, ratio, ok, same schedule)."""
    if "default" not in times:
        return None
    d = statistics.median(times["default"])
    forced = {v: statistics.median(t) for v, t in times.items() if v != "default" and t}
    if not forced:
        return None
    best = min(forced, key=forced.get)
    b = forced[best]
    ratio = d / b if b > 0 else float("inf")
    # Within the spread: the gap is no larger than the faster variant's spread.
    spread = max(times[best]) - min(times[best])
    # The default ran the best algorithm itself: the planner chose right, and
    # the gap is between two runs of one schedule (noise, e.g. 4 ranks on 2
    # cores), whatever its size.
    same = same_schedule(default_algo, best, one_node)
    within_spread = (d - b) <= spread
    ok = ratio <= 1.0 + tolerance or within_spread or same
    return d, best, b, ratio, ok, same, within_spread


def main():
    global COMMBENCH
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=10,
                    help="warm-up operations per size (the sweep judges steady state; until "
                         "shm segments were mapped in whole at setup, a size's first pass "
                         "through the slots ran 3-4x slower, docs/perf-notes/NOTEBOOK.md §16)")
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--ops", nargs="+", default=list(FORCED), choices=list(FORCED))
    ap.add_argument("--testbed", action="store_true", help="also the 4 x 2 test bed (root)")
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per commbench run")
    ap.add_argument("--out", help="markdown table to this file")
    ap.add_argument("--no-calibrate", dest="calibrate", action="store_false",
                    help="price algorithms with the built-in constants (no commbench calibrate)")
    ap.add_argument("--sizes", default="-b 8 -e 64M -f 8", help="commbench's size arguments")
    ap.add_argument("--tolerance", type=float, default=0.05,
                    help="a default this much slower than the best forced algorithm still passes")
    ap.add_argument("--fail-above", type=float,
                    help="exit 1 when a point's default/best exceeds this beyond the spread")
    ap.add_argument("--quick", action="store_true",
                    help="shm2 tcp2, all_reduce broadcast, 8 B to 2 MiB by 64, 3 repetitions")
    ap.add_argument("--commbench", default=COMMBENCH, help="the commbench binary (default: the release build)")
    args = ap.parse_args()
    if args.quick:
        args.configs, args.ops, args.reps = ["shm2", "tcp2"], ["all_reduce", "broadcast"], 3
        args.sizes = "-b 8 -e 2M -f 64"
    args.workdir = tempfile.mkdtemp(prefix="sweep-planner-")
    COMMBENCH = args.commbench
    if not os.access(COMMBENCH, os.X_OK):
        subprocess.run(["cargo", "build", "--release", "-p", "commbench"], cwd=ROOT, check=True)
    start = time.time()
    failures = []
    rows = sweep_local(args, failures)
    if args.testbed:
        rows += sweep_testbed(args, failures)
    lines = [
        f"# planner sweep: {args.reps} interleaved repetitions, medians of commbench's per-size median time (out of place)",
        "| config | op | bytes | default | default us | best forced | best us | default/best | ok |",
        "|---|---|---:|---|---:|---|---:|---:|---|",
    ]
    misses = 0
    gross = []
    for cfg, op, size, dalgo, times in rows:
        v = verdict(dalgo, times, cfg in CONFIGS, args.tolerance)
        if v is None:
            continue
        d, best, b, ratio, ok, same, within_spread = v
        misses += not ok
        if args.fail_above and not same and not within_spread and ratio > args.fail_above:
            gross.append(f"{cfg} {op} {size} B: default {dalgo} {d:.1f} us, {best} {b:.1f} us ({ratio:.2f}x)")
        mark = ("yes (same algorithm)" if same and ratio > 1.0 + args.tolerance else "yes") if ok else "NO"
        lines.append(f"| {cfg} | {op} | {size} | {dalgo} | {d:.1f} | {best} | {b:.1f} | {ratio:.2f} | {mark} |")
    if args.calibrate:
        lines.append(f"\nCalibrated topology files (SNCL_TOPO_FILE of each configuration's runs): {args.workdir}")
    lines.append(f"\n{misses} point(s) where the default is more than {args.tolerance * 100:.0f} % slower than the best forced algorithm beyond the spread; {time.time() - start:.0f} s")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    for f in failures:
        print(f"FAILED: {f}", file=sys.stderr)
    for g in gross:
        print(f"PLANNER MISS above {args.fail_above}x: {g}", file=sys.stderr)
    return 1 if failures or gross else 0


if __name__ == "__main__":
    sys.exit(main())
