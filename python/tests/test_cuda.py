"""Collectives on CUDA tensors: correctness against values computed locally,
stream and Work semantics, in two set-ups one after the other:

  * init_process_group("sncl", device_id=cuda:<local rank % devices>)
    (one sncl backend serves both CPU and CUDA tensors);
  * init_process_group("cpu:gloo,cuda:sncl") (gloo for CPU, sncl for CUDA).

Ranks share a device when there are fewer GPUs than ranks (the lent machine
has one: both ranks on cuda:0). Without CUDA it prints why and exits 0.

    torchrun --nproc_per_node 2 python/tests/test_cuda.py
"""

import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sncl_torch  # noqa: E402
from common import TIMEOUT, Results, assert_close  # noqa: E402

SIZES = [1, 1000, 1 << 20]  # elements (the last: 4 MiB of float32)


def skip_reason():
    if not torch.cuda.is_available():
        return "torch.cuda.is_available() is false (no GPU or no CUDA driver)"
    if not sncl_torch.cuda_built():
        return "this sncl_torch was built without CUDA support (see python/README.md)"
    return None


def pattern(n, rank, dtype, dev):
    """Rank-specific values, exact in every dtype used here."""
    return ((torch.arange(n, device=dev) % 13) + rank + 1).to(dtype)


def cases(res, dev, rank, world, label):
    """Runs the CUDA cases on the default group; `label` names the set-up."""

    def all_reduce_sum(n, dtype):
        t = pattern(n, rank, dtype, dev)
        dist.all_reduce(t)
        want = sum(pattern(n, r, torch.float64, dev) for r in range(world)).to(dtype)
        assert_close(t, want, f"all_reduce sum {dtype} x{n}")

    for n in SIZES:
        res.run(f"{label}: all_reduce sum float32 x{n}", all_reduce_sum, n, torch.float32)
    res.run(f"{label}: all_reduce sum bfloat16 x1000", all_reduce_sum, 1000, torch.bfloat16)
    res.run(f"{label}: all_reduce sum int64 x1000", all_reduce_sum, 1000, torch.int64)

    def all_reduce_op(op, dtype, ref):
        t = pattern(1000, rank, dtype, dev)
        dist.all_reduce(t, op=op)
        rows = torch.stack([pattern(1000, r, dtype, dev) for r in range(world)])
        assert_close(t, ref(rows), f"all_reduce {op} {dtype}")

    res.run(f"{label}: all_reduce max int32", all_reduce_op, dist.ReduceOp.MAX, torch.int32,
            lambda rows: rows.max(0).values)
    res.run(f"{label}: all_reduce min float16", all_reduce_op, dist.ReduceOp.MIN, torch.float16,
            lambda rows: rows.min(0).values)
    res.run(f"{label}: all_reduce avg float32", all_reduce_op, dist.ReduceOp.AVG, torch.float32,
            lambda rows: rows.mean(0))

    def non_contiguous():
        base = pattern(64 * 64, rank, torch.float32, dev).view(64, 64)
        t = base.t()  # a transposed view: staged through a contiguous copy
        dist.all_reduce(t)
        want = sum(pattern(64 * 64, r, torch.float32, dev).view(64, 64) for r in range(world)).t()
        assert_close(t, want, "all_reduce of a transposed view")
        assert_close(base, want.t(), "the view's base")

    res.run(f"{label}: all_reduce non-contiguous", non_contiguous)

    def all_gather(n):
        t = pattern(n, rank, torch.float32, dev)
        outs = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(outs, t)
        assert_close(outs, [pattern(n, r, torch.float32, dev) for r in range(world)], "all_gather")
        flat = torch.empty(n * world, device=dev)
        dist.all_gather_into_tensor(flat, t)
        assert_close(flat, torch.cat([pattern(n, r, torch.float32, dev) for r in range(world)]),
                     "all_gather_into_tensor")

    for n in SIZES:
        res.run(f"{label}: all_gather x{n}", all_gather, n)

    def reduce_scatter(n):
        full = [pattern(n * world, r, torch.float32, dev) for r in range(world)]
        want = sum(f.double() for f in full).float().view(world, n)[rank]
        out = torch.empty(n, device=dev)
        dist.reduce_scatter_tensor(out, full[rank])
        assert_close(out, want, "reduce_scatter_tensor")
        out2 = torch.empty(n, device=dev)
        dist.reduce_scatter(out2, list(full[rank].view(world, n).unbind(0)))
        assert_close(out2, want, "reduce_scatter (list)")

    for n in SIZES:
        res.run(f"{label}: reduce_scatter x{n}", reduce_scatter, n)

    def broadcast(n, root):
        t = pattern(n, rank, torch.float32, dev)
        dist.broadcast(t, src=root)
        assert_close(t, pattern(n, root, torch.float32, dev), f"broadcast from {root}")

    for n in SIZES:
        res.run(f"{label}: broadcast x{n} from {world - 1}", broadcast, n, world - 1)

    def async_work():
        t = pattern(1 << 20, rank, torch.float32, dev)
        work = dist.all_reduce(t, async_op=True)
        work.wait()  # the current stream waits; the host does not
        want = sum(pattern(1 << 20, r, torch.float64, dev) for r in range(world)).float()
        assert_close(t, want, "async all_reduce after wait()")
        torch.cuda.current_stream(dev).synchronize()
        assert work.is_completed(), "is_completed() false after the stream synchronised"
        assert work.is_success()

    res.run(f"{label}: async_op work.wait / is_completed", async_work)

    def future():
        t = pattern(1000, rank, torch.float32, dev)
        fut = dist.all_reduce(t, async_op=True).get_future()
        doubled = fut.then(lambda f: f.value()[0] * 2)
        want = sum(pattern(1000, r, torch.float64, dev) for r in range(world)).float()
        assert_close(fut.wait()[0], want, "future value")
        assert_close(doubled.wait(), want * 2, "future.then value")

    res.run(f"{label}: get_future / then", future)

    def side_stream():
        # The op runs on the current stream: here a side stream, after a
        # kernel on it that writes the input.
        s = torch.cuda.Stream(device=dev)
        with torch.cuda.stream(s):
            t = torch.zeros(1 << 20, device=dev)
            torch.cuda._sleep(10_000_000)  # keep the stream busy (~ms)
            t.add_(rank + 1)
            work = dist.all_reduce(t, async_op=True)
        work.wait()  # the (default) current stream waits for the side stream's op
        got = t.sum().item()
        want = float(sum(r + 1 for r in range(world)) * (1 << 20))
        assert got == want, f"sum {got}, want {want}"

    res.run(f"{label}: op on a side stream, wait() orders the caller's stream", side_stream)

    def freed_early():
        # Tensors dropped right after an async op: recordStream keeps their
        # memory from being reused before the op has run.
        for _ in range(5):
            t = pattern(1 << 20, rank, torch.float32, dev)
            dist.all_reduce(t, async_op=True)
            del t
        t = pattern(1000, rank, torch.float32, dev)
        dist.all_reduce(t)
        want = sum(pattern(1000, r, torch.float64, dev) for r in range(world)).float()
        assert_close(t, want, "all_reduce after dropped async ops")

    res.run(f"{label}: tensors dropped before the op completes", freed_early)

    def all_to_all():
        n = 256
        t = pattern(n * world, rank, torch.float32, dev)
        out = torch.empty_like(t)
        dist.all_to_all_single(out, t)
        want = torch.cat([pattern(n * world, r, torch.float32, dev).view(world, n)[rank]
                          for r in range(world)])
        assert_close(out, want, "all_to_all_single")

    res.run(f"{label}: all_to_all_single", all_to_all)

    def p2p_ring():
        n = 4096
        send = pattern(n, rank, torch.float32, dev)
        recv = torch.empty(n, device=dev)
        ops = [dist.P2POp(dist.isend, send, (rank + 1) % world),
               dist.P2POp(dist.irecv, recv, (rank - 1) % world)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        assert_close(recv, pattern(n, (rank - 1) % world, torch.float32, dev), "ring receive")

    if world > 1:
        res.run(f"{label}: batch_isend_irecv ring (coalesced)", p2p_ring)

    def mixed_devices():
        try:
            dist.all_gather_into_tensor(torch.empty(8 * world), torch.ones(8, device=dev))
        except Exception as e:  # noqa: BLE001 - torch or sncl may raise it
            msg = str(e)
            assert "cpu" in msg.lower() and "cuda" in msg.lower(), f"unclear error: {msg}"
            return "refused: " + msg.splitlines()[0][:100]
        raise AssertionError("a CPU output with a CUDA input was accepted")

    res.run(f"{label}: CPU and CUDA tensors in one op are refused", mixed_devices)

    def timing():
        t = torch.ones(16 << 20, device=dev)  # 64 MiB
        dist.all_reduce(t)
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        for _ in range(5):
            dist.all_reduce(t)
        torch.cuda.synchronize(dev)
        dt = (time.perf_counter() - t0) / 5
        busbw = 2 * (world - 1) / world * t.numel() * 4 / dt / 1e9
        return f"64 MiB all_reduce {dt * 1e3:.2f} ms, busbw {busbw:.1f} GB/s"

    res.run(f"{label}: 64 MiB all_reduce time", timing)


def main():
    why = skip_reason()
    if why:
        print(f"test_cuda: SKIP: {why}", file=sys.stderr, flush=True)
        return 0
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    rc = 0

    dist.init_process_group("sncl", timeout=TIMEOUT, device_id=dev)
    rank, world = dist.get_rank(), dist.get_world_size()
    res = Results(f"test_cuda sncl (world size {world}, {dev})")
    res.run("bound device", lambda: str(dist.group.WORLD.bound_device_id))
    cases(res, dev, rank, world, "sncl")
    rc |= res.finish()
    dist.destroy_process_group()

    dist.init_process_group("cpu:gloo,cuda:sncl", timeout=TIMEOUT)
    res = Results(f"test_cuda cpu:gloo,cuda:sncl (world size {world}, {dev})")

    def split_backends():
        cuda_be = dist.group.WORLD._get_backend(dev)
        cpu_be = dist.group.WORLD._get_backend(torch.device("cpu"))
        assert cuda_be.name() == "sncl", f"CUDA backend {cuda_be.name()}"
        assert cpu_be.name() == "gloo", f"CPU backend {cpu_be.name()}"
        t = torch.full((4,), float(rank + 1))
        dist.all_reduce(t)  # gloo
        assert t[0].item() == world * (world + 1) / 2

    res.run("cpu:gloo,cuda:sncl: backends per device", split_backends)
    cases(res, dev, rank, world, "cuda:sncl")
    rc |= res.finish()
    dist.destroy_process_group()
    return rc


if __name__ == "__main__":
    sys.exit(main())
