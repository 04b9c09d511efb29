"""Gloo's all-reduce timed the way bench/mpi_allreduce.c times Open MPI's,
for scripts/bench-vs-mpi.sh: torch's ProcessGroupGloo, float32 sum,
out-of-place (a copy into the output, then the in-place all-reduce Gloo
offers), per-op times, the slowest rank's time per op, its median.

    torchrun --standalone --nproc_per_node 2 bench/gloo_allreduce.py \
        [-s SECONDS] [-w WARMUP] SIZE_BYTES...

Prints the same lines as mpi_allreduce: `# ...` headers, then per size
`size_bytes iters median_us min_us busbw_GBps ok`, where ok means every
element of the result equals the sum of the ranks' inputs.
"""

import argparse
import datetime
import statistics
import time

import torch
import torch.distributed as dist

CAL_OPS = 5
MIN_ITERS = 5
MAX_ITERS = 200000


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-s", "--seconds", type=float, default=0.5)
    ap.add_argument("-w", "--warmup", type=int, default=5)
    ap.add_argument("sizes", type=int, nargs="+")
    args = ap.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        print(f"# library: torch {torch.__version__} ProcessGroupGloo")
        print(f"# ranks {n}, warmup {args.warmup}, seconds/size {args.seconds:.3f}, "
              "op all_reduce float sum out-of-place (copy + in-place)")
        print("# size_bytes iters median_us min_us busbw_GBps ok", flush=True)
    for nbytes in args.sizes:
        count = nbytes // 4
        # rank r holds r + 1 + (i % 7): the sum is known exactly in float32
        src = (torch.arange(count, dtype=torch.float32) % 7) + (rank + 1)
        out = torch.empty_like(src)

        def op():
            out.copy_(src)
            dist.all_reduce(out)

        for _ in range(args.warmup):
            op()
        dist.barrier()
        cal = []
        for _ in range(CAL_OPS):
            t0 = time.perf_counter()
            op()
            cal.append(time.perf_counter() - t0)
        slowest = torch.tensor([statistics.median(cal)], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        want = args.seconds / slowest.item() if slowest.item() > 0 else MAX_ITERS
        iters = int(min(max(want, MIN_ITERS), MAX_ITERS))
        times = torch.empty(iters, dtype=torch.float64)
        dist.barrier()
        for i in range(iters):
            t0 = time.perf_counter()
            op()
            times[i] = time.perf_counter() - t0
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
        expect = (torch.arange(count, dtype=torch.float32) % 7) * n + n * (n + 1) / 2
        good = torch.tensor([1 if torch.equal(out, expect) else 0])
        dist.all_reduce(good, op=dist.ReduceOp.MIN)
        if rank == 0:
            t = sorted(times.tolist())
            med = statistics.median(t)
            busbw = 2 * (n - 1) / n * nbytes / med / 1e9
            ok = "ok" if good.item() else "FAIL"
            print(f"{nbytes} {iters} {med * 1e6:.3f} {t[0] * 1e6:.3f} {busbw:.4f} {ok}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
