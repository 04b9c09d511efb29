"""Group management as torch.distributed users reach it (run under torchrun,
4 ranks): dist.split_group, dist.shrink_group, Backend.suspend / resume /
memory_stats, sncl_torch.tag and dump_flight_recorder, monitored_barrier's wording
when rank 0's own time is spent, and _abort_process_group of the world
(which ends a coalescing region on aborted backends)."""

import datetime
import json
import os
import shutil
import sys
import tempfile

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
import sncl_torch  # noqa: E402,F401
from common import TIMEOUT, Results  # noqa: E402


def main():
    dist.init_process_group("sncl", timeout=TIMEOUT)
    R, W = dist.get_rank(), dist.get_world_size()
    assert W == 4, "needs 4 ranks"
    G = dist.new_group(backend="gloo", timeout=TIMEOUT)
    res = Results("groups")

    def case_split():
        world = dist.group.WORLD
        backend = world._get_backend(torch.device("cpu"))
        assert backend.supports_splitting, "supports_splitting is false"
        halves = dist.split_group(split_ranks=[[0, 1], [2, 3]], timeout=TIMEOUT)
        assert halves is not None and halves != dist.GroupMember.NON_GROUP_MEMBER
        assert dist.get_world_size(halves) == 2, dist.get_world_size(halves)
        x = torch.full((1000,), float(R + 1))
        dist.all_reduce(x, group=halves)
        want = 3.0 if R < 2 else 7.0
        assert torch.all(x == want), f"split all_reduce: {x[:4].tolist()}, want {want}"
        # A split that leaves ranks 2 and 3 out: they get no group.
        pair = dist.split_group(split_ranks=[[0, 1]], timeout=TIMEOUT)
        if R < 2:
            y = torch.ones(10)
            dist.all_reduce(y, group=pair)
            assert torch.all(y == 2.0), y.tolist()
        else:
            assert pair is None or pair == dist.GroupMember.NON_GROUP_MEMBER, pair
        dist.barrier()
        return "2 + 2 and 2 + none"

    res.run("dist.split_group: halves all-reduce apart; ranks in no split get none", case_split)

    def case_monitored_rank0_timeout():
        sub = dist.new_group(list(range(W)), backend="sncl", timeout=TIMEOUT)
        err = None
        if R == 0:
            try:
                sub.monitored_barrier(datetime.timedelta(seconds=0))
            except RuntimeError as e:
                err = str(e)
            assert err is not None, "rank 0 passed a monitored barrier with no time at all"
            assert "Rank 0 timed out in monitoredBarrier" in err, err
        dist.barrier(group=G)
        return err[:120] if err else ""

    res.run("monitored_barrier: rank 0 out of time says 'Rank 0 timed out'",
            case_monitored_rank0_timeout)

    def case_suspend():
        sub = dist.new_group(list(range(W)), backend="sncl", timeout=TIMEOUT)
        x = torch.full((100_000,), float(R + 1))
        dist.all_reduce(x, group=sub)
        want = x.clone()
        before = sncl_torch.memory_stats(sub)
        assert before["suspend"] > 0 and before["suspended"] == 0, before
        assert before["connected_peers"] == W - 1, before
        sncl_torch.suspend(sub)
        during = sncl_torch.memory_stats(sub)
        assert during["suspended"] == before["suspend"], (before, during)
        assert during["suspend"] == 0 and during["fifo"] == 0, during
        assert during["total"] == before["total"] - before["suspend"], (before, during)
        err = None
        try:
            dist.all_reduce(torch.ones(4), group=sub)
        except Exception as e:  # noqa: BLE001
            err = str(e)
        assert err is not None and "suspended" in err, err
        sub._get_backend(torch.device("cpu")).resume()
        y = torch.full((100_000,), float(R + 1))
        dist.all_reduce(y, group=sub)
        assert torch.equal(y, want), "the all-reduce after resume differs"
        after = sncl_torch.memory_stats(sub)
        assert after["fifo"] == before["fifo"] and after["suspended"] == 0, (before, after)
        dist.barrier(group=G)
        return f"{before['suspend']} B released and restored"

    res.run("Backend.suspend / resume / memory_stats: buffers go and come back", case_suspend)

    def case_tag():
        dump_dir = tempfile.mkdtemp(prefix=f"sncl-tag-{R}-")
        os.environ["SNCL_DEBUG_DUMP_DIR"] = dump_dir
        try:
            sub = dist.new_group(list(range(W)), backend="sncl", timeout=TIMEOUT)
        finally:
            del os.environ["SNCL_DEBUG_DUMP_DIR"]
        x = torch.ones(8)
        with torch.profiler.profile() as prof:
            with sncl_torch.tag("backward/bucket 3") as tag:
                dist.all_reduce(x, group=sub)
                dist.all_reduce(x, group=sub, async_op=True).wait()
        dist.all_reduce(x, group=sub)
        path = sncl_torch.dump_flight_recorder(sub)
        with open(path) as f:
            ops = [json.loads(line) for line in f][1:]
        got = [(e["op"], e.get("tag"), e.get("tag_name")) for e in ops][-3:]
        named = ("all_reduce", tag, "backward/bucket 3")
        assert got == [named, named, ("all_reduce", None, None)], got
        names = {e.name for e in prof.events()}
        assert "backward/bucket 3" in names and "sncl:all_reduce" in names, sorted(names)[:30]
        shutil.rmtree(dump_dir, ignore_errors=True)
        dist.barrier(group=G)
        return f"tag {tag:#x} in the flight recorder and the profiler"

    res.run("sncl_torch.tag names the operations in the flight recorder and profiler", case_tag)

    def case_shrink():
        sub = dist.new_group(list(range(W)), backend="sncl", timeout=TIMEOUT)
        x = torch.ones(100)
        dist.all_reduce(x, group=sub)
        assert sub._get_backend(torch.device("cpu")).supports_shrinking
        if R != W - 1:
            # Rank W-1 is excluded and does not call shrink_group.
            small = dist.shrink_group([W - 1], group=sub)
            assert dist.get_world_size(small) == W - 1, dist.get_world_size(small)
            y = torch.full((1000,), float(R + 1))
            dist.all_reduce(y, group=small)
            want = float(sum(range(1, W)))
            assert torch.all(y == want), f"shrunk all_reduce: {y[:4].tolist()}, want {want}"
        dist.barrier(group=G)
        # Last group made: the excluded rank did not call shrink_group, so
        # torch's group counter (which names later groups) differs there.
        return f"{W} -> {W - 1} ranks"

    res.run("dist.shrink_group excludes a rank; the survivors all-reduce", case_shrink)

    code = res.finish(group=G)
    # Last: aborting the world ends every group; torch ends a coalescing
    # region around the aborts, on backends already aborted.
    try:
        dist.distributed_c10d._abort_process_group()
        if R == 0:
            print("  pass  _abort_process_group() of the world returns quietly", flush=True)
    except Exception as e:  # noqa: BLE001
        print(f"  FAIL  _abort_process_group() raised on rank {R}: {type(e).__name__}: {e}",
              flush=True)
        code = 1
    sys.exit(code)


if __name__ == "__main__":
    main()
