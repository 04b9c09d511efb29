"""FSDP2 (fully_shard) on CPU with the "sncl" backend: a few training steps
match a local, unsharded run on the union of every rank's batch.

    torchrun --nproc_per_node 4 python/tests/test_fsdp.py
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sncl_torch  # noqa: E402,F401
from common import TIMEOUT, Results  # noqa: E402

STEPS = 5
TOL = 1e-5


def model():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(24, 48), nn.ReLU(),
        nn.Linear(48, 48), nn.ReLU(),
        nn.Linear(48, 6),  # 6 x 48 weights: uneven shards over 4 ranks
    )


def batch(step, r):
    g = torch.Generator().manual_seed(100 * step + r)
    x = torch.randn(8, 24, generator=g)
    return x, torch.sin(x[:, :6])


def main():
    dist.init_process_group("sncl", timeout=TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo", timeout=TIMEOUT)
    res = Results(f"test_fsdp (world size {world})")

    def fsdp(reshard_after_forward):
        mesh = init_device_mesh("cpu", (world,))
        assert dist.get_backend(mesh.get_group()) == "sncl"
        m = model()
        for layer in m:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
        fully_shard(m, mesh=mesh, reshard_after_forward=reshard_after_forward)
        opt = torch.optim.Adam(m.parameters(), lr=1e-2)

        ref = model()  # unsharded, local: the mean loss over every rank's batch
        ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
        for step in range(STEPS):
            x, y = batch(step, rank)
            loss = nn.functional.mse_loss(m(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()

            ref_opt.zero_grad()
            ref_loss = sum(nn.functional.mse_loss(ref(bx), by) for bx, by in
                           (batch(step, r) for r in range(world))) / world
            ref_loss.backward()
            ref_opt.step()

        worst = 0.0
        for (name, p), q in zip(m.named_parameters(), ref.parameters()):
            full = p.full_tensor()  # all-gather of the shards, through sncl
            d = ((full - q).abs().max() / q.abs().max()).item()
            worst = max(worst, d)
            assert d <= TOL, f"{name}: relative difference {d:.3g} > {TOL}"
        return f"{STEPS} steps, max rel diff vs unsharded {worst:.2e}"

    res.run("fully_shard, reshard_after_forward=True", fsdp, True)
    res.run("fully_shard, reshard_after_forward=False", fsdp, False)
    rc = res.finish(group=gloo)
    dist.destroy_process_group()
    return rc


if __name__ == "__main__":
    sys.exit(main())
