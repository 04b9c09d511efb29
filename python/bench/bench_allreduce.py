"""Times dist.all_reduce (float32, SUM) through torch with "sncl" and with
"gloo" in the same job: the default group is sncl, a gloo group spans the
same ranks, and samples alternate between the two at every size.

    torchrun --standalone --nproc_per_node 4 python/bench/bench_allreduce.py \
        [--min-size 1K] [--max-size 64M] [--factor 4] [--out results.md] [--json results.json]

A sample is a barrier on the group under test, then k back-to-back
all-reduces (k grows as sizes shrink); its time is the slowest rank's
elapsed time / k. Reported: medians over the samples, bus bandwidth
2 (n - 1) / n x bytes / time (as nccl-tests), and sncl / gloo ratios.
"""

import argparse
import datetime
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

import sncl_torch  # noqa: F401


def parse_size(s):
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if s[-1] in mult:
        return int(float(s[:-1]) * mult[s[-1]])
    return int(s)


def human(n):
    for unit, v in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= v:
            return f"{n / v:g} {unit}"
    return f"{n} B"


def plan(nbytes):
    """(ops per sample, samples) for a size."""
    if nbytes <= 64 << 10:
        return 20, 15
    if nbytes <= 1 << 20:
        return 5, 11
    if nbytes <= 4 << 20:
        return 2, 9
    if nbytes <= 16 << 20:
        return 1, 9
    return 1, 7


def sample(t, group, k):
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(k):
        dist.all_reduce(t, group=group)
    return (time.perf_counter() - t0) / k


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--min-size", default="1K")
    ap.add_argument("--max-size", default="64M")
    ap.add_argument("--factor", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", default=None, help="write the markdown table here (rank 0)")
    ap.add_argument("--json", default=None, help="write the rows as JSON here (rank 0)")
    ap.add_argument("--no-gloo", dest="gloo", action="store_false",
                    help="time sncl alone: on a 2-core machine Gloo's threads, interleaved with "
                         "sncl's samples, slow sncl's large sizes 2-7x (docs/perf-notes/NOTEBOOK.md §28)")
    args = ap.parse_args()

    timeout = datetime.timedelta(seconds=600)
    dist.init_process_group("sncl", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo", timeout=timeout)
    groups = {"sncl": dist.group.WORLD, "gloo": gloo} if args.gloo else {"sncl": dist.group.WORLD}

    sizes = []
    n = parse_size(args.min_size)
    while n <= parse_size(args.max_size):
        sizes.append(n)
        n *= args.factor

    rows = []
    for nbytes in sizes:
        count = max(1, nbytes // 4)
        t = torch.ones(count, dtype=torch.float32)
        k, samples = plan(nbytes)
        for name, g in groups.items():
            for _ in range(args.warmup):
                sample(t, g, 1)
        times = {name: [] for name in groups}
        for i in range(samples):
            order = list(groups) if i % 2 == 0 else list(reversed(groups))
            for name in order:
                times[name].append(sample(t, groups[name], k))
        # slowest rank per sample
        row = {"bytes": nbytes, "world": world}
        for name in groups:
            v = torch.tensor(times[name], dtype=torch.float64)
            dist.all_reduce(v, op=dist.ReduceOp.MAX, group=gloo)
            med = statistics.median(v.tolist())
            row[f"{name}_us"] = med * 1e6
            row[f"{name}_busbw"] = 2 * (world - 1) / world * nbytes / med / 1e9
        row["ratio"] = row["sncl_busbw"] / row["gloo_busbw"] if args.gloo else float("nan")
        rows.append(row)
        if rank == 0:
            gloo_part = (f" | gloo {row['gloo_us']:10.1f} us {row['gloo_busbw']:7.3f} GB/s | x{row['ratio']:.2f}"
                         if args.gloo else "")
            print(f"{human(nbytes):>9}: sncl {row['sncl_us']:10.1f} us {row['sncl_busbw']:7.3f} GB/s{gloo_part}",
                  flush=True)

    if rank == 0:
        lines = [
            f"`dist.all_reduce` (float32, SUM), {world} processes on one host, torch "
            f"{torch.__version__}, medians (slowest rank per sample); busbw = 2(n-1)/n x bytes / time.",
            "",
            "| size | sncl time (us) | sncl busbw (GB/s) | gloo time (us) | gloo busbw (GB/s) | sncl / gloo busbw |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        for r in rows:
            lines.append(f"| {human(r['bytes'])} | {r['sncl_us']:.1f} | {r['sncl_busbw']:.3f} | "
                         f"{r.get('gloo_us', float('nan')):.1f} | {r.get('gloo_busbw', float('nan')):.3f} | "
                         f"{r['ratio']:.2f} |")
        big = [r for r in rows if r["bytes"] >= 1 << 20]
        ok_big = all(r["ratio"] >= 1.5 for r in big) or not args.gloo
        ok_all = all(r["ratio"] >= 1.0 for r in rows) or not args.gloo
        lines += [] if not args.gloo else [
            "",
            f"Targets: sncl >= 1.5x gloo busbw at every size >= 1 MiB: "
            f"{'met' if ok_big else 'NOT met'} (min {min((r['ratio'] for r in big), default=float('nan')):.2f}x); "
            f"not slower at any size: {'met' if ok_all else 'NOT met'} "
            f"(min {min(r['ratio'] for r in rows):.2f}x).",
        ]
        table = "\n".join(lines) + "\n"
        print()
        print(table, flush=True)
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as f:
                f.write(table)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
        status = 0 if (ok_big and ok_all) else 3
    else:
        status = 0
    st = torch.tensor([status])
    dist.broadcast(st, src=0, group=gloo)
    dist.destroy_process_group()
    return int(st.item()) if os.environ.get("BENCH_CHECK") == "1" else 0


if __name__ == "__main__":
    sys.exit(main())
