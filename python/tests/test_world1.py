"""World size 1: the default "sncl" group of a single process.

    torchrun --nproc_per_node 1 python/tests/test_world1.py
"""

import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sncl_torch  # noqa: E402,F401
from common import TIMEOUT, Results  # noqa: E402


def main():
    dist.init_process_group("sncl", timeout=TIMEOUT)
    assert dist.get_world_size() == 1
    res = Results("test_world1")

    def ops():
        x = torch.arange(10, dtype=torch.float32)
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MAX, dist.ReduceOp.PRODUCT):
            y = x.clone()
            dist.all_reduce(y, op=op)
            assert torch.equal(y, x), (op, y)
        i = torch.arange(10, dtype=torch.int64)
        dist.all_reduce(i, op=dist.ReduceOp.BXOR)
        assert torch.equal(i, torch.arange(10))
        y = x.clone()
        dist.all_reduce(y, op=dist._make_nccl_premul_sum(3.0))
        assert torch.equal(y, 3 * x)
        dist.broadcast(y, src=0)
        dist.reduce(y, dst=0)
        out = [torch.empty(10)]
        dist.all_gather(out, x)
        assert torch.equal(out[0], x)
        o = torch.empty(10)
        dist.all_gather_into_tensor(o, x)
        assert torch.equal(o, x)
        dist.reduce_scatter_tensor(o, x)
        assert torch.equal(o, x)
        dist.all_to_all_single(o, x)
        assert torch.equal(o, x)
        dist.all_to_all_single(o, x, output_split_sizes=[10], input_split_sizes=[10])
        g = [torch.empty(10)]
        dist.gather(x, g, dst=0)
        assert torch.equal(g[0], x)
        s = torch.empty(10)
        dist.scatter(s, [x], src=0)
        assert torch.equal(s, x)
        dist.barrier()
        w = dist.all_reduce(torch.ones(3), async_op=True)
        w.wait()
        assert w.get_future().value()[0].sum() == 3

    res.run("every collective on one rank", ops)

    def ddp():
        from torch.nn.parallel import DistributedDataParallel as DDP
        m = DDP(torch.nn.Linear(4, 2))
        m(torch.randn(3, 4)).sum().backward()

    res.run("DDP on one rank", ddp)
    rc = res.finish()
    dist.destroy_process_group()
    return rc


if __name__ == "__main__":
    sys.exit(main())
