"""DDP parity: the same 20 training steps of a small MLP with "sncl" and
with "gloo", from the same seed, end with the same parameters (max relative
difference <= 1e-5).

    torchrun --nproc_per_node 4 python/tests/test_ddp.py
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sncl_torch  # noqa: E402,F401
from common import TIMEOUT, Results  # noqa: E402

STEPS = 20
TOL = 1e-5


def mlp():
    return nn.Sequential(
        nn.Linear(32, 64), nn.ReLU(),
        nn.Linear(64, 64), nn.Tanh(),
        nn.Linear(64, 8),
    )


def train(group, rank, *, bucket_cap_mb=0.01, **ddp_kwargs):
    torch.manual_seed(0)
    model = mlp()
    # Rank-dependent initial weights: DDP must broadcast rank 0's.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * rank)
    ddp = DDP(model, process_group=group, bucket_cap_mb=bucket_cap_mb, **ddp_kwargs)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    teacher = torch.randn(32, 8, generator=torch.Generator().manual_seed(42)) / 4
    losses = []
    for step in range(STEPS):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(16, 32, generator=g)
        y = torch.tanh(x @ teacher)
        loss = nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return [p.detach().clone() for p in model.parameters()], losses


def max_rel_diff(a, b):
    """max over tensors of max|a - b| / max|b|."""
    return max(((x - y).abs().max() / y.abs().max().clamp_min(1e-12)).item() for x, y in zip(a, b))


def main():
    dist.init_process_group("sncl", timeout=TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo", timeout=TIMEOUT)
    res = Results(f"test_ddp (world size {world})")

    def parity(**kw):
        ps, ls = train(dist.group.WORLD, rank, **kw)
        pg, lg = train(gloo, rank, **kw)
        d = max_rel_diff(ps, pg)
        assert d <= TOL, f"max relative difference {d:.3g} > {TOL}"
        # every rank holds the same parameters
        for p in ps:
            ref = p.clone()
            dist.broadcast(ref, src=0, group=gloo)
            assert torch.equal(p, ref), "ranks disagree"
        assert ls[-1] < ls[0], f"loss did not decrease: {ls[0]:.4f} -> {ls[-1]:.4f}"
        return f"max rel diff {d:.2e}, loss {ls[0]:.4f} -> {ls[-1]:.4f}"

    res.run("DDP sncl vs gloo, 20 steps, small buckets", parity)
    res.run("DDP sncl vs gloo, gradient_as_bucket_view, one bucket", parity,
            bucket_cap_mb=25, gradient_as_bucket_view=True)
    rc = res.finish(group=gloo)
    dist.destroy_process_group()
    return rc


if __name__ == "__main__":
    sys.exit(main())
