"""Clean exit without destroy_process_group: operations done or in flight,
several groups alive; every process must exit 0 promptly (the test script
runs this under a timeout).

    torchrun --nproc_per_node 4 python/tests/test_exit.py
"""

import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sncl_torch  # noqa: E402,F401
from common import TIMEOUT  # noqa: E402

dist.init_process_group("sncl", timeout=TIMEOUT)
sub = dist.new_group(list(range(dist.get_world_size())), backend="sncl", timeout=TIMEOUT)
t = torch.ones(1 << 16)
dist.all_reduce(t)
dist.all_reduce(t, group=sub)
works = [dist.all_reduce(torch.ones(1000), async_op=True) for _ in range(4)]
works[-1].wait()  # the others may still be completing at exit
if dist.get_rank() == 0:
    print("test_exit: leaving without destroy_process_group", flush=True)
sys.exit(0)
