"""DDP communication hooks over "sncl": compression hooks train.

sncl's int8 codec is not reachable through the C ABI yet, so the hooks are
torch's fp16 and bf16 compression hooks (all-reduce of a compressed copy
through the backend, future-chained decompression) and one of our own (an
AVG all-reduce in bf16 issued directly, exercising Work.get_future).

    torchrun --nproc_per_node 4 python/tests/test_hook.py
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sncl_torch  # noqa: E402,F401
from common import TIMEOUT, Results  # noqa: E402

STEPS = 15


def bf16_avg_hook(group, bucket):
    """Our own hook: all-reduce (AVG) the bucket in bf16, then decompress."""
    buf = bucket.buffer()
    compressed = buf.to(torch.bfloat16)
    fut = dist.all_reduce(compressed, op=dist.ReduceOp.AVG, group=group, async_op=True).get_future()

    def decompress(f):
        buf.copy_(f.value()[0])
        return buf

    return fut.then(decompress)


def main():
    dist.init_process_group("sncl", timeout=TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo", timeout=TIMEOUT)
    res = Results(f"test_hook (world size {world})")
    teacher = torch.randn(32, 8, generator=torch.Generator().manual_seed(42)) / 4

    def train(hook, state):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
        ddp = DDP(model, bucket_cap_mb=0.005)
        calls = [0]

        def counting(st, bucket):
            calls[0] += 1
            return hook(st, bucket)

        ddp.register_comm_hook(state, counting)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        losses = []
        for step in range(STEPS):
            g = torch.Generator().manual_seed(1000 * step + rank)
            x = torch.randn(32, 32, generator=g)
            loss = nn.functional.mse_loss(ddp(x), torch.tanh(x @ teacher))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        # mean loss over ranks, first vs last 3 steps
        first = torch.stack(losses[:3]).mean()
        last = torch.stack(losses[-3:]).mean()
        both = torch.stack([first, last])
        dist.all_reduce(both, op=dist.ReduceOp.AVG)
        assert both[1] < 0.8 * both[0], f"did not train: {both[0]:.4f} -> {both[1]:.4f}"
        for p in model.parameters():  # replicas stay identical
            ref = p.detach().clone()
            dist.broadcast(ref, src=0, group=gloo)
            assert torch.equal(p.detach(), ref), "replicas diverged"
        assert calls[0] >= STEPS, f"the hook ran {calls[0]} times"
        return f"loss {both[0]:.6f} -> {both[1]:.6f}, {calls[0]} hook calls"

    res.run("fp16_compress_hook", train, default_hooks.fp16_compress_hook, None)
    res.run("bf16_compress_hook", train, default_hooks.bf16_compress_hook, None)
    res.run("own bf16 AVG hook", train, bf16_avg_hook, dist.group.WORLD)
    rc = res.finish(group=gloo)
    dist.destroy_process_group()
    return rc


if __name__ == "__main__":
    sys.exit(main())
