"""What gloo users rely on, on the sncl backend (run under torchrun, 4 ranks):
profiler events, monitored barrier, sparse all-reduce, receive from any
source with tags, and timeouts torch recognises. Compared with gloo where
gloo has the feature."""

import datetime
import os
import random
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
import sncl_torch  # noqa: E402,F401
from common import TIMEOUT, Results, assert_close  # noqa: E402


def main():
    dist.init_process_group("sncl", timeout=TIMEOUT)
    R, W = dist.get_rank(), dist.get_world_size()
    assert W >= 3, "needs at least 3 ranks"
    G = dist.new_group(backend="gloo", timeout=TIMEOUT)
    res = Results("gloo parity")

    def case_profiler():
        from torch.profiler import ProfilerActivity, profile

        x = torch.arange(1000, dtype=torch.float32)
        out = [torch.empty(1000) for _ in range(W)]
        big = torch.empty(1000 * W)
        rs = torch.empty(250)
        ops = {
            "sncl:all_reduce": (lambda: dist.all_reduce(x), [1000]),
            "sncl:broadcast": (lambda: dist.broadcast(x, 0), [1000]),
            "sncl:all_gather": (lambda: dist.all_gather(out, x), None),
            "sncl:_allgather_base": (lambda: dist.all_gather_into_tensor(big, x), None),
            "sncl:_reduce_scatter_base": (lambda: dist.reduce_scatter_tensor(rs, x[: 250 * W]), None),
            "sncl:reduce": (lambda: dist.reduce(x, 0), [1000]),
            "sncl:all_to_all_single": (lambda: dist.all_to_all_single(torch.empty(1000 - 1000 % W), x[: 1000 - 1000 % W]), None),
            "sncl:barrier": (lambda: dist.barrier(), None),
        }
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            for name, (fn, _) in ops.items():
                fn()
            # send / recv between ranks 0 and 1
            if R == 0:
                dist.send(x[:100].clone(), 1)
            elif R == 1:
                dist.recv(torch.empty(100), 0)
        events = [e for e in prof.events() if e.name.startswith("sncl:")]
        names = [e.name for e in events]
        for name, (_, shape) in ops.items():
            got = [e for e in events if e.name == name]
            assert len(got) == 1, f"{name}: {len(got)} events (all: {names})"
            if shape is not None:
                assert got[0].input_shapes and list(got[0].input_shapes[0]) == shape, \
                    f"{name}: input shapes {got[0].input_shapes}"
        if R in (0, 1):
            want = "sncl:send" if R == 0 else "sncl:recv"
            got = [e for e in events if e.name == want]
            assert len(got) == 1, f"{want}: {len(got)} events"
            assert list(got[0].input_shapes[0]) == [100], got[0].input_shapes
        trace = f"/tmp/sncl-trace-{os.getpid()}.json"
        prof.export_chrome_trace(trace)
        with open(trace) as f:
            text = f.read()
        os.unlink(trace)
        assert '"sncl:all_reduce"' in text, "sncl:all_reduce missing from the Chrome trace"
        return f"{len(events)} sncl events"

    res.run("profiler: one sncl:<op> event per operation, with shapes", case_profiler)

    def case_monitored_barrier():
        sub = dist.new_group(list(range(W)), backend="sncl", timeout=TIMEOUT)
        dist.monitored_barrier(sub, timeout=datetime.timedelta(seconds=10))
        # Rank W-1 arrives late: rank 0 names it, within timeout + 1 s.
        timeout = 2.0
        if R == W - 1:
            time.sleep(timeout + 1.5)
        t0 = time.monotonic()
        err = None
        try:
            dist.monitored_barrier(sub, timeout=datetime.timedelta(seconds=timeout),
                                   wait_all_ranks=True)
        except RuntimeError as e:
            err = str(e)
        took = time.monotonic() - t0
        if R == 0:
            assert err is not None, "rank 0 passed although a rank slept past the timeout"
            assert f"Ranks {W - 1} failed to pass monitoredBarrier" in err, err
            assert "Timed out" in err, err
            assert took < timeout + 1.0, f"took {took:.2f} s"
        dist.barrier()
        # Sub-group of ranks 1..W-1 (rank 1 is its rank 0): everyone arrives.
        sub2 = dist.new_group(list(range(1, W)), backend="sncl", timeout=TIMEOUT)
        if R >= 1:
            dist.monitored_barrier(sub2, timeout=datetime.timedelta(seconds=10))
        return f"rank 0 raised after {took:.2f} s" if R == 0 else ""

    res.run("monitored_barrier names the late rank (also on a sub-group)", case_monitored_barrier)

    def case_sparse():
        rows, dim = 100_000, 64
        g = torch.Generator().manual_seed(1234 + R)
        k = rows // 100
        idx = torch.randperm(rows, generator=g)[:k].unsqueeze(0)
        val = torch.randn(k, dim, generator=g)
        a = torch.sparse_coo_tensor(idx, val, (rows, dim))
        b = a.clone()
        dist.all_reduce(a)
        dist.all_reduce(b, group=G)
        assert a.is_sparse, "the result is not sparse"
        a, b = a.coalesce(), b.coalesce()
        assert torch.equal(a.indices(), b.indices()), "indices differ from gloo's"
        assert torch.equal(a.values(), b.values()), "values differ from gloo's"
        return f"nnz {a._nnz()}"

    res.run("sparse all_reduce (1e5 x 64, 1 % rows) equals gloo exactly", case_sparse)

    def case_any_source():
        total, tags = 1000, 8
        rng = random.Random(99)
        plan = [(1 + i % (W - 1), rng.randrange(tags)) for i in range(total)]  # (sender, tag)
        size_of = lambda tag: 4 + tag * 37  # noqa: E731
        t0 = time.monotonic()
        if R == 0:
            order = list(plan)
            random.Random(7).shuffle(order)
            seen = set()
            last = {}
            for _, tag in order:
                t = torch.empty(size_of(tag), dtype=torch.int64)
                w = dist.irecv(t, tag=tag)
                w.wait()
                src = w._source_rank()
                assert int(t[0]) == src, f"source_rank {src}, payload says {int(t[0])}"
                assert int(t[1]) == tag, f"tag {tag} received a message with tag {int(t[1])}"
                key = (src, int(t[2]))
                assert key not in seen, f"{key} received twice"
                seen.add(key)
                if (src, tag) in last:
                    assert int(t[2]) > last[(src, tag)], "messages overtook each other"
                last[(src, tag)] = int(t[2])
            assert len(seen) == total, len(seen)
        else:
            for i, (s, tag) in enumerate(plan):
                if s == R:
                    t = torch.full((size_of(tag),), 0, dtype=torch.int64)
                    t[0], t[1], t[2] = R, tag, i
                    dist.send(t, 0, tag=tag)
        dist.barrier()
        # Tags never cross: tag 2 is received before tag 1 although sent after.
        if R == 1:
            dist.send(torch.tensor([1.0]), 2, tag=1)
            dist.send(torch.tensor([2.0]), 2, tag=2)
        elif R == 2:
            b, a = torch.empty(1), torch.empty(1)
            dist.recv(b, 1, tag=2)
            dist.recv(a, None, tag=1)
            assert (float(a), float(b)) == (1.0, 2.0), (float(a), float(b))
        dist.barrier()
        return f"{total} messages in {time.monotonic() - t0:.2f} s" if R == 0 else ""

    res.run("recv / irecv from any source with tags (3 senders, 1000 messages)", case_any_source)

    def case_timeout():
        # A group of its own with a 2 s timeout: rank W-1 sleeps through a
        # barrier; the others raise DistBackendError saying "Timed out".
        sub = dist.new_group(list(range(W)), backend="sncl",
                             timeout=datetime.timedelta(seconds=2))
        dist.barrier(group=sub)
        err = None
        t0 = time.monotonic()
        if R == W - 1:
            time.sleep(4)
        try:
            dist.barrier(group=sub)
            x = torch.ones(10)
            dist.all_reduce(x, group=sub)
        except dist.DistBackendError as e:
            err = str(e)
        took = time.monotonic() - t0
        if R == 0:
            assert err is not None, "no error although a rank slept past the timeout"
            assert "Timed out" in err and "2000 ms" in err, err
            assert "barrier" in err, err
            assert took < 2 + 2, f"took {took:.2f} s"
        return f"rank 0: {err[:160]}" if R == 0 else ""

    res.run("timeouts raise DistBackendError saying Timed out", case_timeout)

    code = res.finish(group=G)
    dist.destroy_process_group()
    sys.exit(code)


if __name__ == "__main__":
    main()
