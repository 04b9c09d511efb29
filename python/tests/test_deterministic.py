"""Deterministic mode through PyTorch: ``pg_options=sncl_torch.Options(deterministic=True)``.

    torchrun --nproc_per_node 5 python/tests/test_deterministic.py

Every rank rebuilds every rank's input from its seed and reduces them in
sncl's canonical order (a binary tree over the ranks in rank order, left
child the largest power of two below the range; fp16 / bf16 combine in
float32 and round once per node; avg divides once at the end), then checks
the backend's result bit for bit: all_reduce, reduce_scatter_tensor and
reduce, fused and unfused buckets, a subgroup, and run to run.
"""

import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sncl_torch  # noqa: E402
from common import TIMEOUT, Results  # noqa: E402


def split(lo, hi):
    """The canonical tree's split of ranks [lo, hi)."""
    s = hi - lo
    return lo + (1 << ((s - 1).bit_length() - 1))


def canonical(xs, lo, hi):
    if hi - lo == 1:
        return xs[lo]
    mid = split(lo, hi)
    a, b = canonical(xs, lo, mid), canonical(xs, mid, hi)
    return (a.float() + b.float()).to(a.dtype)


def reference(xs, average=False):
    out = canonical(xs, 0, len(xs))
    if average:
        out = (out.float() / len(xs)).to(out.dtype)
    return out


def data(rank, n, dtype, seed):
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    # Random signs and mantissas over a few binades: any other association
    # rounds differently.
    return (torch.randn(n, generator=g) * 2 ** torch.randint(-3, 4, (n,), generator=g)).to(dtype)


def bits(t):
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


def main():
    dist.init_process_group(
        "sncl", timeout=TIMEOUT, pg_options=sncl_torch.Options(deterministic=True)
    )
    rank, world = dist.get_rank(), dist.get_world_size()
    res = Results("test_deterministic")

    def all_reduce_bits():
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            for seed, n in enumerate([1, 7, 1000, 65_537, 400_000]):
                xs = [data(r, n, dtype, seed) for r in range(world)]
                for average in (False, True):
                    want = reference(xs, average)
                    got = xs[rank].clone()
                    dist.all_reduce(got, op=dist.ReduceOp.AVG if average else dist.ReduceOp.SUM)
                    assert torch.equal(bits(got), bits(want)), (dtype, n, average)

    res.run("all_reduce: the canonical bits (f32, f16, bf16; sum, avg)", all_reduce_bits)

    def fusion_boundaries():
        # One fused bucket or three pieces, the same bits per element.
        n = 300_001
        x = data(rank, n, torch.float32, 7)
        fused = x.clone()
        dist.all_reduce(fused)
        pieces = [x[:1000].clone(), x[1000:123_457].clone(), x[123_457:].clone()]
        for p in pieces:
            dist.all_reduce(p)
        assert torch.equal(bits(fused), bits(torch.cat(pieces)))
        again = x.clone()
        dist.all_reduce(again)
        assert torch.equal(bits(fused), bits(again)), "run to run"

    res.run("fused and unfused buckets, run to run", fusion_boundaries)

    def reduce_scatter_and_reduce():
        per = 20_011
        xs = [data(r, per * world, torch.bfloat16, 11) for r in range(world)]
        want = reference(xs)
        out = torch.empty(per, dtype=torch.bfloat16)
        dist.reduce_scatter_tensor(out, xs[rank])
        assert torch.equal(bits(out), bits(want[rank * per:(rank + 1) * per]))
        root = world - 1
        y = xs[rank].clone()
        dist.reduce(y, dst=root)
        if rank == root:
            assert torch.equal(bits(y), bits(want))

    res.run("reduce_scatter_tensor and reduce", reduce_scatter_and_reduce)

    def subgroup():
        members = [r for r in range(world) if r != 1]
        g = dist.new_group(members, backend="sncl", pg_options=sncl_torch.Options(deterministic=True))
        if rank in members:
            xs = [data(r, 5000, torch.float32, 13) for r in members]
            got = xs[members.index(rank)].clone()
            dist.all_reduce(got, group=g)
            assert torch.equal(bits(got), bits(reference(xs)))
        dist.barrier()

    res.run("a subgroup of world - 1 ranks", subgroup)

    def bad_options():
        try:
            sncl_torch.Options(deterministic="yes")
        except ValueError as e:
            assert "deterministic" in str(e)
            return
        raise AssertionError("Options(deterministic='yes') was accepted")

    res.run("Options refuses a non-boolean", bad_options)
    rc = res.finish()
    dist.destroy_process_group()
    return rc


if __name__ == "__main__":
    sys.exit(main())
