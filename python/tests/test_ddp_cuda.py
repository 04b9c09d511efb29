"""DDP parity on CUDA tensors: the same 20 training steps of a small MLP on
the GPU with "sncl" and with "gloo" (both on CUDA tensors), from the same
seed, end with the same parameters (max relative difference <= 1e-5,
printed). Ranks share a device when there are fewer GPUs than ranks.
Without CUDA it prints why and exits 0.

    torchrun --nproc_per_node 2 python/tests/test_ddp_cuda.py
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sncl_torch  # noqa: E402
from common import TIMEOUT, Results  # noqa: E402
from test_ddp import STEPS, TOL, max_rel_diff, mlp  # noqa: E402


def train(group, rank, dev, *, bucket_cap_mb=0.01, **ddp_kwargs):
    torch.manual_seed(0)
    model = mlp().to(dev)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * rank)  # DDP must broadcast rank 0's weights
    ddp = DDP(model, device_ids=[dev], process_group=group, bucket_cap_mb=bucket_cap_mb,
              **ddp_kwargs)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    teacher = (torch.randn(32, 8, generator=torch.Generator().manual_seed(42)) / 4).to(dev)
    losses = []
    for step in range(STEPS):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(16, 32, generator=g).to(dev)
        y = torch.tanh(x @ teacher)
        loss = nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return [p.detach().cpu() for p in model.parameters()], losses


def main():
    if not torch.cuda.is_available():
        print("test_ddp_cuda: SKIP: torch.cuda.is_available() is false (no GPU or no CUDA "
              "driver)", file=sys.stderr, flush=True)
        return 0
    if not sncl_torch.cuda_built():
        print("test_ddp_cuda: SKIP: this sncl_torch was built without CUDA support",
              file=sys.stderr, flush=True)
        return 0
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    dist.init_process_group("sncl", timeout=TIMEOUT, device_id=dev)
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo", timeout=TIMEOUT)
    res = Results(f"test_ddp_cuda (world size {world}, {dev})")

    def parity(**kw):
        ps, ls = train(dist.group.WORLD, rank, dev, **kw)
        pg, lg = train(gloo, rank, dev, **kw)
        d = max_rel_diff(ps, pg)
        print(f"[rank {rank}] DDP on {dev}: sncl vs gloo max relative difference {d:.3e} "
              f"(limit {TOL})", flush=True)
        assert d <= TOL, f"max relative difference {d:.3g} > {TOL}"
        for p in ps:
            ref = p.clone()
            dist.broadcast(ref, src=0, group=gloo)
            assert torch.equal(p, ref), "ranks disagree"
        assert ls[-1] < ls[0], f"loss did not decrease: {ls[0]:.4f} -> {ls[-1]:.4f}"
        return f"max rel diff {d:.2e}, loss {ls[0]:.4f} -> {ls[-1]:.4f}"

    res.run("DDP on CUDA sncl vs gloo, 20 steps, small buckets", parity)
    res.run("DDP on CUDA sncl vs gloo, gradient_as_bucket_view, one bucket", parity,
            bucket_cap_mb=25, gradient_as_bucket_view=True)
    rc = res.finish(group=gloo)
    dist.destroy_process_group()
    return rc


if __name__ == "__main__":
    sys.exit(main())
