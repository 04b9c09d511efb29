"""DDP communication hooks over "sncl": compression hooks train.

The hooks are torch's fp16 and bf16 compression hooks (all-reduce of a
compressed copy through the backend, future-chained decompression), one of
our own (an AVG all-reduce in bf16 issued directly, exercising
Work.get_future), and sncl_torch.int8_compress_hook / compress_hook("mxfp8"), ("mxfp4") (sncl's
compressed all-reduce with those codecs), whose losses must stay close to an
uncompressed run's. With an even world size of 4 or more, each pair of
ranks claims a node of its own (SNCL_NODE_ID), so the compressed all-reduce
takes its hierarchical path (exact within a node, int8 across nodes).

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
    env_world = int(os.environ.get("WORLD_SIZE", "1"))
    if env_world >= 4 and env_world % 2 == 0 and "SNCL_NODE_ID" not in os.environ:
        # two ranks per "node": the compressed all-reduce then runs its
        # hierarchical path, the codec on the cross-node tier
        os.environ["SNCL_NODE_ID"] = f"hook-node-{int(os.environ['RANK']) // 2}"
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
        res_losses[hook] = [l.item() for l in losses]
        return f"loss {both[0]:.6f} -> {both[1]:.6f}, {calls[0]} hook calls"

    res_losses = {}

    def allreduce_hook(group, bucket):
        """Uncompressed reference: AVG all-reduce of the bucket."""
        fut = dist.all_reduce(
            bucket.buffer(), op=dist.ReduceOp.AVG, group=group, async_op=True
        ).get_future()
        return fut.then(lambda f: f.value()[0])

    def close_to_exact(hook, limit):
        exact = res_losses.get(allreduce_hook)
        got = res_losses.get(hook)
        assert exact and got, "a training run failed"
        worst = max(abs(a - b) / abs(b) for a, b in zip(got, exact))
        assert worst < limit, f"losses differ from exact by up to {worst:.2%}"
        return f"max relative loss difference {worst:.3%} over {STEPS} steps"

    mxfp8_hook = sncl_torch.compress_hook("mxfp8")
    mxfp4_hook = sncl_torch.compress_hook("mxfp4")
    # Error feedback, kept per bucket (several buckets here: bucket_cap_mb).
    mxfp4_ef_hook = sncl_torch.compress_hook("mxfp4", error_feedback=True)
    topk_ef_hook = sncl_torch.compress_hook("topk:0.05", error_feedback=True)

    def compressed_op():
        # sum and average of known values, int8 and fp16, vs the exact result
        n = 3000
        x = torch.linspace(-1, 1, n) * (rank + 1)
        want = torch.linspace(-1, 1, n) * (world * (world + 1) / 2)
        # Relative to the largest value: int8 and fp16 lose under 1 % a hop;
        # mxfp8 (E4M3, 3 mantissa bits) up to 2^-4 of its block's top a hop.
        for codec, tol in (("int8", 0.05), ("fp16", 0.05), ("mxfp8", 0.15)):
            t = x.clone()
            fut = sncl_torch.all_reduce_compressed(t, codec, average=False)
            assert fut.wait() is t or torch.equal(fut.wait(), t)
            err = (t - want).abs().max().item()
            assert err < tol * want.abs().max().item(), f"{codec} sum off by {err}"
            t = x.clone()
            sncl_torch.all_reduce_compressed(t, codec).wait()
            err = (t - want / world).abs().max().item()
            assert err < tol * (want / world).abs().max().item(), f"{codec} avg off by {err}"
        try:
            sncl_torch.all_reduce_compressed(torch.ones(4, dtype=torch.float64)).wait()
        except RuntimeError:
            pass
        else:
            raise AssertionError("float64 was accepted")
        return f"int8, fp16 and mxfp8, sum and avg, {n} elements"

    res.run("fp16_compress_hook", train, default_hooks.fp16_compress_hook, None)
    res.run("bf16_compress_hook", train, default_hooks.bf16_compress_hook, None)
    res.run("own bf16 AVG hook", train, bf16_avg_hook, dist.group.WORLD)
    res.run("all_reduce_compressed", compressed_op)
    res.run("uncompressed AVG hook", train, allreduce_hook, dist.group.WORLD)
    res.run("sncl int8_compress_hook", train, sncl_torch.int8_compress_hook, None)
    res.run("int8 losses close to uncompressed", close_to_exact,
            sncl_torch.int8_compress_hook, 0.05)
    res.run("sncl compress_hook('mxfp8')", train, mxfp8_hook, None)
    res.run("mxfp8 losses close to uncompressed", close_to_exact, mxfp8_hook, 0.05)
    res.run("sncl compress_hook('mxfp4')", train, mxfp4_hook, None)
    res.run("mxfp4 losses close to uncompressed", close_to_exact, mxfp4_hook, 0.25)
    res.run("compress_hook('mxfp4', error_feedback=True)", train, mxfp4_ef_hook, None)
    res.run("mxfp4 with feedback close to uncompressed", close_to_exact, mxfp4_ef_hook, 0.25)
    res.run("compress_hook('topk:0.05', error_feedback=True)", train, topk_ef_hook, None)

    def register_directly():
        # DDP checks a hook's return annotation (Future[Tensor]); the
        # training runs above wrap the hooks, so register them unwrapped.
        for hook in (sncl_torch.int8_compress_hook, mxfp8_hook, mxfp4_ef_hook):
            DDP(nn.Linear(4, 2)).register_comm_hook(None, hook)

    res.run("sncl hooks register with DDP as they are", register_directly)
    rc = res.finish(group=gloo)
    dist.destroy_process_group()
    return rc


if __name__ == "__main__":
    sys.exit(main())
