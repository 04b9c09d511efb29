"""Every collective of the "sncl" backend against gloo on the same inputs.

Run with torchrun (4 processes in CI):

    torchrun --nproc_per_node 4 python/tests/test_ops.py

The default group is "sncl"; a gloo group over the same ranks gives the
reference. Where gloo lacks an operation (AVG, PREMUL_SUM, some dtypes or
layouts) the reference is gloo's SUM scaled accordingly, or gloo run on a
wider dtype, or gloo's nearest operation (noted per case).
"""

import os
import sys
import time
import warnings

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sncl_torch  # noqa: E402,F401  (registers "sncl"; the entry point would too)
from common import TIMEOUT, Results, assert_close  # noqa: E402

RO = dist.ReduceOp
CPU = torch.device("cpu")


def gen(dtype, shape, seed, rank, kind="any"):
    """Deterministic per-rank data."""
    g = torch.Generator().manual_seed(10007 * seed + rank)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    if dtype.is_complex:
        return torch.randn(shape, generator=g, dtype=dtype)
    if kind == "small":  # products that do not overflow
        return torch.randint(1, 4, shape, generator=g).to(dtype)
    lo, hi = (0, 256) if dtype == torch.uint8 else (-100, 100)
    return torch.randint(lo, hi, shape, generator=g).to(dtype)


def main():
    warnings.filterwarnings("ignore", category=FutureWarning)  # deprecated coalesced APIs
    dist.init_process_group("sncl", timeout=TIMEOUT)
    R, W = dist.get_rank(), dist.get_world_size()
    S = dist.group.WORLD
    G = dist.new_group(backend="gloo", timeout=TIMEOUT)
    assert dist.get_backend(S) == "sncl", dist.get_backend(S)
    res = Results(f"test_ops (world size {W})")
    seed = iter(range(1, 1_000_000))

    def gloo_or(fn_gloo, fn_fallback):
        """gloo's answer, or the fallback's when gloo rejects the op."""
        try:
            return fn_gloo(), ""
        except (RuntimeError, ValueError, NotImplementedError) as e:
            return fn_fallback(), f"ref: fallback ({str(e).splitlines()[0][:60]})"

    # ------------------------------------------------------------ allreduce
    def allreduce_ref(x, op):
        """gloo's allreduce of x with op (or its equivalent)."""
        if x.dtype == torch.bool:
            u = x.to(torch.uint8)
            gop = {RO.SUM: RO.MAX, RO.PRODUCT: RO.MIN}.get(op, op)
            dist.all_reduce(u, op=gop, group=G)
            return u.bool()

        def direct():
            y = x.clone()
            dist.all_reduce(y, op=op, group=G)
            return y

        def wide():
            wd = torch.float64 if x.is_floating_point() else torch.int64
            y = x.to(wd)
            dist.all_reduce(y, op=op, group=G)
            return y.to(x.dtype)

        return gloo_or(direct, wide)[0]

    def case_allreduce(op, dtype, n=1000):
        kind = "small" if op == RO.PRODUCT else "any"
        x = gen(dtype, (n,), next(seed), R, kind)
        y = x.clone()
        dist.all_reduce(y, op=op)
        assert_close(y, allreduce_ref(x, op), f"all_reduce {op} {dtype}")

    for op in (RO.SUM, RO.PRODUCT, RO.MIN, RO.MAX):
        for dt in (torch.float32, torch.float64, torch.float16, torch.bfloat16,
                   torch.int32, torch.int64, torch.int8, torch.uint8, torch.bool):
            res.run(f"all_reduce {str(op).split('.')[-1]} {str(dt)[6:]}", case_allreduce, op, dt)
    for op in (RO.BAND, RO.BOR, RO.BXOR):
        for dt in (torch.int32, torch.int64, torch.int8, torch.uint8, torch.bool):
            res.run(f"all_reduce {str(op).split('.')[-1]} {str(dt)[6:]}", case_allreduce, op, dt)

    def case_fp8(dtype, op):
        # -1/0/1 per rank: sums and maxima are exact in both fp8 formats.
        g = torch.Generator().manual_seed(next(seed))
        base = torch.randint(-1, 2, (W, 301), generator=g).to(torch.float32)
        y = base[R].to(dtype)
        dist.all_reduce(y, op=op)
        want = base.sum(0) if op == RO.SUM else base.max(0).values
        got = y.to(torch.float32)
        assert torch.equal(got, want), f"all_reduce {op} {dtype}: {got[:8]} vs {want[:8]}"
        return "ref: exact sums of -1/0/1"

    for dt in (torch.float8_e4m3fn, torch.float8_e5m2):
        for op in (RO.SUM, RO.MAX):
            res.run(f"all_reduce {str(op).split('.')[-1]} {str(dt)[6:]}", case_fp8, dt, op)

    def case_avg(dtype):
        x = gen(dtype, (777,), next(seed), R)
        y = x.clone()
        dist.all_reduce(y, op=RO.AVG)
        wide = torch.float64 if dtype.is_floating_point else torch.int64
        s = x.to(wide)
        dist.all_reduce(s, group=G)  # gloo has no AVG: its SUM / W
        if dtype.is_floating_point:
            want = (s / W).to(dtype)
        else:
            want = torch.div(s, W, rounding_mode="trunc").to(dtype)
        assert_close(y, want, f"all_reduce AVG {dtype}")
        return "ref: gloo SUM / world size"

    for dt in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64):
        res.run(f"all_reduce AVG {str(dt)[6:]}", case_avg, dt)

    def case_premul(dtype, factor):
        x = gen(dtype, (513,), next(seed), R)
        y = x.clone()
        dist.all_reduce(y, op=dist._make_nccl_premul_sum(factor))
        f = factor.item() if torch.is_tensor(factor) else factor
        s = x.to(torch.float64) * f
        dist.all_reduce(s, group=G)  # gloo has no PREMUL_SUM: SUM of scaled inputs
        assert_close(y, s.to(dtype), f"all_reduce PREMUL_SUM {dtype}")
        return "ref: gloo SUM of inputs x factor"

    for dt in (torch.float32, torch.float64, torch.bfloat16):
        res.run(f"all_reduce PREMUL_SUM(0.25) {str(dt)[6:]}", case_premul, dt, 0.25)
    res.run("all_reduce PREMUL_SUM(tensor 1.5) float32", case_premul, torch.float32,
            torch.tensor([1.5]))

    def case_allreduce_layouts():
        base = gen(torch.float32, (64, 33), next(seed), R)
        nc = base.clone()[:, ::2]  # non-contiguous
        assert not nc.is_contiguous()
        ref = nc.clone()
        dist.all_reduce(nc)
        dist.all_reduce(ref, group=G)
        assert_close(nc, ref, "non-contiguous")
        sc = torch.tensor(float(R + 1))  # 0-dim
        dist.all_reduce(sc)
        assert sc.item() == W * (W + 1) / 2, sc
        e = torch.empty(0)
        dist.all_reduce(e)
        c = gen(torch.complex64, (100,), next(seed), R)
        cref = c.clone()
        dist.all_reduce(c)
        dist.all_reduce(cref, group=G)
        assert_close(c, cref, "complex64")
        big = gen(torch.float32, (3 << 20,), next(seed), R)  # 12 MiB
        bref = big.clone()
        dist.all_reduce(big)
        dist.all_reduce(bref, group=G)
        assert_close(big, bref, "12 MiB")

    res.run("all_reduce non-contiguous / 0-dim / empty / complex / 12 MiB", case_allreduce_layouts)

    def case_allreduce_coalesced():
        xs = [gen(torch.float32, (n,), next(seed), R) for n in (10, 1000, 3)]
        ys = [x.clone() for x in xs]
        dist.all_reduce_coalesced(ys, op=RO.SUM)
        refs = [x.clone() for x in xs]
        for t in refs:
            dist.all_reduce(t, group=G)
        assert_close(ys, refs, "all_reduce_coalesced")
        # Through the coalescing manager (backend startCoalescing/endCoalescing).
        zs = [x.clone() for x in xs]
        with dist._coalescing_manager(group=S, device=CPU, async_ops=True) as cm:
            for z in zs:
                dist.all_reduce(z)
        cm.wait()
        assert_close(zs, refs, "coalescing manager all_reduce")

    res.run("all_reduce_coalesced (+ coalescing manager)", case_allreduce_coalesced)

    # ------------------------------------------------------------ broadcast / reduce
    def case_broadcast(dtype, root, noncontig=False):
        x = gen(dtype, (300, 4), next(seed), R)
        if noncontig:
            x = x.t()
        y = x.clone() if not noncontig else x.clone().t().contiguous().t()
        ref = x.clone()
        dist.broadcast(y, src=root)
        dist.broadcast(ref, src=root, group=G)
        assert_close(y, ref, f"broadcast {dtype} root {root}")

    for dt in (torch.float32, torch.int64, torch.bool, torch.bfloat16):
        res.run(f"broadcast {str(dt)[6:]} root 0", case_broadcast, dt, 0)
    res.run(f"broadcast float32 root {W - 1} non-contiguous", case_broadcast, torch.float32, W - 1, True)

    def case_reduce(op, dtype, root):
        x = gen(dtype, (500,), next(seed), R)
        y = x.clone()
        dist.reduce(y, dst=root, op=op)
        if op == RO.AVG:
            s = x.to(torch.float64)
            dist.reduce(s, dst=root, group=G)
            want, note = (s / W).to(dtype), "ref: gloo SUM / world size"
        else:
            ref = x.clone()
            dist.reduce(ref, dst=root, op=op, group=G)
            want, note = ref, ""
        if R == root:
            assert_close(y, want, f"reduce {op} {dtype} root {root}")
        else:
            assert_close(y, x, "reduce leaves non-root tensors alone")
        return note

    for op, dt in ((RO.SUM, torch.float32), (RO.MAX, torch.int32), (RO.PRODUCT, torch.float64),
                   (RO.MIN, torch.float32), (RO.BXOR, torch.int64), (RO.BAND, torch.uint8),
                   (RO.AVG, torch.float32)):
        for root in (0, W - 1):
            res.run(f"reduce {str(op).split('.')[-1]} {str(dt)[6:]} root {root}", case_reduce, op, dt, root)

    def case_reduce_premul():
        x = gen(torch.float32, (200,), next(seed), R)
        y = x.clone()
        dist.reduce(y, dst=1 % W, op=dist._make_nccl_premul_sum(2.0))
        s = x * 2.0
        dist.reduce(s, dst=1 % W, group=G)
        if R == 1 % W:
            assert_close(y, s, "reduce PREMUL_SUM")
        return "ref: gloo SUM of inputs x factor"

    res.run("reduce PREMUL_SUM float32", case_reduce_premul)

    # ------------------------------------------------------------ gathers
    def case_allgather(dtype):
        x = gen(dtype, (37, 3), next(seed), R)
        outs = [torch.empty_like(x) for _ in range(W)]
        refs = [torch.empty_like(x) for _ in range(W)]
        dist.all_gather(outs, x)
        dist.all_gather(refs, x, group=G)
        assert_close(outs, refs, f"all_gather {dtype}")

    for dt in (torch.float32, torch.int32, torch.bool, torch.float16):
        res.run(f"all_gather {str(dt)[6:]}", case_allgather, dt)

    def case_allgather_uneven():
        n = lambda r: 3 * r + 1  # noqa: E731
        x = gen(torch.float32, (n(R),), next(seed), R)
        outs = [torch.empty(n(r)) for r in range(W)]
        dist.all_gather(outs, x)
        # gloo wants equal sizes: gather padded, then trim.
        m = n(W - 1)
        pad = torch.zeros(m)
        pad[: n(R)] = x
        refs = [torch.empty(m) for _ in range(W)]
        dist.all_gather(refs, pad, group=G)
        assert_close(outs, [refs[r][: n(r)] for r in range(W)], "uneven all_gather")
        return "ref: gloo all_gather of padded inputs"

    res.run("all_gather uneven sizes", case_allgather_uneven)

    def case_allgather_into_tensor(dtype, inplace):
        n = 1001
        x = gen(dtype, (n,), next(seed), R)
        out = torch.empty(W * n, dtype=dtype)
        if inplace:
            out[R * n:(R + 1) * n] = x
            dist.all_gather_into_tensor(out, out[R * n:(R + 1) * n])
        else:
            dist.all_gather_into_tensor(out, x)
        ref = torch.empty(W * n, dtype=dtype)
        dist.all_gather_into_tensor(ref, x, group=G)
        assert_close(out, ref, "all_gather_into_tensor")
        # 2-D output (stacked)
        out2 = torch.empty(W, n, dtype=dtype)
        dist.all_gather_into_tensor(out2, x)
        assert_close(out2.flatten(), ref, "all_gather_into_tensor stacked")

    res.run("all_gather_into_tensor float32", case_allgather_into_tensor, torch.float32, False)
    res.run("all_gather_into_tensor bfloat16 in place", case_allgather_into_tensor, torch.bfloat16, True)

    def case_allgather_into_tensor_coalesced():
        xs = [gen(torch.float32, (n,), next(seed), R) for n in (5, 700)]
        outs = [torch.empty(W * x.numel()) for x in xs]
        with dist._coalescing_manager(group=S, device=CPU, async_ops=True) as cm:
            for o, x in zip(outs, xs):
                dist.all_gather_into_tensor(o, x)
        cm.wait()
        refs = [torch.empty(W * x.numel()) for x in xs]
        for o, x in zip(refs, xs):
            dist.all_gather_into_tensor(o, x, group=G)
        assert_close(outs, refs, "allgather_into_tensor_coalesced")
        return "ref: gloo all_gather_into_tensor per tensor"

    res.run("allgather_into_tensor_coalesced", case_allgather_into_tensor_coalesced)

    def case_all_gather_coalesced():
        xs = [gen(torch.float32, (n,), next(seed), R) for n in (4, 9)]
        outs = [[torch.empty_like(x) for x in xs] for _ in range(W)]
        dist.all_gather_coalesced(outs, xs)
        for j, x in enumerate(xs):
            refs = [torch.empty_like(x) for _ in range(W)]
            dist.all_gather(refs, x, group=G)
            assert_close([outs[r][j] for r in range(W)], refs, f"all_gather_coalesced[{j}]")

    res.run("all_gather_coalesced (deprecated list form)", case_all_gather_coalesced)

    def case_gather(root):
        x = gen(torch.float64, (20, 2), next(seed), R)
        outs = [torch.empty_like(x) for _ in range(W)] if R == root else None
        refs = [torch.empty_like(x) for _ in range(W)] if R == root else None
        dist.gather(x, outs, dst=root)
        dist.gather(x, refs, dst=root, group=G)
        if R == root:
            assert_close(outs, refs, "gather")

    res.run("gather root 0", case_gather, 0)
    res.run(f"gather root {W - 1}", case_gather, W - 1)

    def case_scatter(root):
        ins = [gen(torch.int64, (33,), next(seed), r) for r in range(W)] if R == root else None
        out = torch.empty(33, dtype=torch.int64)
        ref = torch.empty(33, dtype=torch.int64)
        dist.scatter(out, ins, src=root)
        dist.scatter(ref, [t.clone() for t in ins] if ins else None, src=root, group=G)
        assert_close(out, ref, "scatter")

    res.run("scatter root 0", case_scatter, 0)
    res.run(f"scatter root {W - 1}", case_scatter, W - 1)

    # ------------------------------------------------------------ reduce-scatter
    def rs_ref(blocks, op, dtype):
        """gloo reference for reduce-scatter of `blocks` (this rank's list)."""
        if op == RO.AVG:
            flat = torch.cat([b.flatten() for b in blocks]).to(torch.float64)
            dist.all_reduce(flat, group=G)
            flat = flat / W
            note = "ref: gloo SUM / world size"
        elif op == RO.PREMUL_SUM:
            flat = torch.cat([b.flatten() for b in blocks]).to(torch.float64) * 0.5
            dist.all_reduce(flat, group=G)
            note = "ref: gloo SUM of inputs x factor"
        else:
            out = torch.empty_like(blocks[R])

            def direct():
                dist.reduce_scatter(out, [b.clone() for b in blocks], op=op, group=G)
                return out

            def via_allreduce():
                f = torch.cat([b.flatten() for b in blocks])
                dist.all_reduce(f, op=op, group=G)
                return f

            got, note = gloo_or(direct, via_allreduce)
            if got is out:
                return out, note
            flat = got
        offs = [0]
        for b in blocks:
            offs.append(offs[-1] + b.numel())
        return flat[offs[R]:offs[R + 1]].to(dtype).view(blocks[R].shape), note

    def case_reduce_scatter(op, dtype, uneven=False):
        sizes = [(2 * r + 1 if uneven else 50) for r in range(W)]
        blocks = [gen(dtype, (sizes[r],), next(seed), R) for r in range(W)]
        out = torch.empty(sizes[R], dtype=dtype)
        rop = dist._make_nccl_premul_sum(0.5) if op == RO.PREMUL_SUM else op
        dist.reduce_scatter(out, [b.clone() for b in blocks], op=rop)
        want, note = rs_ref(blocks, op, dtype)
        assert_close(out, want, f"reduce_scatter {op} {dtype}")
        return note

    for op, dt in ((RO.SUM, torch.float32), (RO.MAX, torch.int32), (RO.MIN, torch.float64),
                   (RO.PRODUCT, torch.float32), (RO.AVG, torch.float32),
                   (RO.PREMUL_SUM, torch.float32), (RO.BXOR, torch.int64), (RO.BOR, torch.uint8)):
        res.run(f"reduce_scatter {str(op).split('.')[-1]} {str(dt)[6:]}", case_reduce_scatter, op, dt)
    res.run("reduce_scatter uneven SUM float32", case_reduce_scatter, RO.SUM, torch.float32, True)
    res.run("reduce_scatter uneven BAND int32", case_reduce_scatter, RO.BAND, torch.int32, True)

    def case_reduce_scatter_tensor(op, dtype):
        n = 257
        x = gen(dtype, (W * n,), next(seed), R)
        out = torch.empty(n, dtype=dtype)
        rop = dist._make_nccl_premul_sum(0.5) if op == RO.PREMUL_SUM else op
        dist.reduce_scatter_tensor(out, x.clone(), op=rop)
        want, note = rs_ref(list(x.split(n)), op, dtype)
        assert_close(out, want, f"reduce_scatter_tensor {op} {dtype}")
        return note

    for op, dt in ((RO.SUM, torch.float32), (RO.AVG, torch.float32), (RO.PREMUL_SUM, torch.float64),
                   (RO.MIN, torch.int32), (RO.BAND, torch.int64), (RO.SUM, torch.bfloat16)):
        res.run(f"reduce_scatter_tensor {str(op).split('.')[-1]} {str(dt)[6:]}",
                case_reduce_scatter_tensor, op, dt)

    def case_reduce_scatter_tensor_coalesced():
        xs = [gen(torch.float32, (W * n,), next(seed), R) for n in (3, 400)]
        outs = [torch.empty(x.numel() // W) for x in xs]
        with dist._coalescing_manager(group=S, device=CPU, async_ops=True) as cm:
            for o, x in zip(outs, xs):
                dist.reduce_scatter_tensor(o, x)
        cm.wait()
        for o, x in zip(outs, xs):
            want, _ = rs_ref(list(x.split(x.numel() // W)), RO.SUM, torch.float32)
            assert_close(o, want, "reduce_scatter_tensor_coalesced")

    res.run("reduce_scatter_tensor_coalesced", case_reduce_scatter_tensor_coalesced)

    # ------------------------------------------------------------ all-to-all
    def rows(src, dst):
        return (src + 2 * dst) % 3  # 0, 1 or 2 rows: some pairs send nothing

    def case_all_to_all_single(splits):
        width = 5
        if splits:
            ins_split = [rows(R, j) for j in range(W)]
            outs_split = [rows(i, R) for i in range(W)]
        else:
            ins_split = outs_split = [2] * W
        x = gen(torch.float32, (sum(ins_split), width), next(seed), R)
        out = torch.empty(sum(outs_split), width)
        ref = torch.empty(sum(outs_split), width)
        kw = dict(output_split_sizes=outs_split, input_split_sizes=ins_split) if splits else {}
        dist.all_to_all_single(out, x, **kw)
        dist.all_to_all_single(ref, x, group=G, **kw)
        assert_close(out, ref, "all_to_all_single")

    res.run("all_to_all_single equal", case_all_to_all_single, False)
    res.run("all_to_all_single with splits", case_all_to_all_single, True)

    def case_all_to_all_list():
        ins = [gen(torch.int32, (rows(R, j) + 1, 3), next(seed), R) for j in range(W)]
        outs = [torch.empty(rows(i, R) + 1, 3, dtype=torch.int32) for i in range(W)]
        dist.all_to_all(outs, ins)

        def direct():
            refs = [torch.empty_like(o) for o in outs]
            dist.all_to_all(refs, ins, group=G)
            return refs

        def via_single():
            flat_out = torch.empty(sum(o.shape[0] for o in outs), 3, dtype=torch.int32)
            dist.all_to_all_single(flat_out, torch.cat(ins),
                                   output_split_sizes=[o.shape[0] for o in outs],
                                   input_split_sizes=[t.shape[0] for t in ins], group=G)
            return list(flat_out.split([o.shape[0] for o in outs]))

        refs, note = gloo_or(direct, via_single)
        assert_close(outs, refs, "all_to_all")
        return note

    res.run("all_to_all (tensor lists, uneven)", case_all_to_all_list)

    # ------------------------------------------------------------ point to point
    def case_send_recv():
        n = 1 << 20  # 4 MiB: beyond any eager buffering
        if W < 2:
            return "skipped: world size 1"
        for phase in (0, 1):
            for pair in range(W // 2):
                a, b = 2 * pair, 2 * pair + 1
                src, dst = (a, b) if phase == 0 else (b, a)
                if R == src:
                    dist.send(gen(torch.float32, (n,), 77 + phase, src), dst=dst)
                elif R == dst:
                    t = torch.empty(n)
                    dist.recv(t, src=src)
                    assert_close(t, gen(torch.float32, (n,), 77 + phase, src), "recv")
        # isend / irecv with waits, to the next rank and back
        if W % 2 == 0:
            peer = R ^ 1
            t = torch.empty(1000, dtype=torch.int64)
            if R % 2 == 0:
                w = dist.isend(torch.arange(1000) + R, dst=peer)
                w.wait()
                w2 = dist.irecv(t, src=peer)
            else:
                w2 = dist.irecv(t, src=peer)
                w2.wait()
                dist.isend(torch.arange(1000) + R, dst=peer).wait()
            w2.wait()
            assert torch.equal(t, torch.arange(1000) + peer)

    res.run("send / recv (4 MiB) and isend / irecv", case_send_recv)

    def case_batch_isend_irecv(group, n):
        nxt, prv = (R + 1) % W, (R - 1) % W
        x = gen(torch.float32, (n,), 5, R)
        y = torch.empty(n)
        ops = [dist.P2POp(dist.isend, x, nxt, group=group), dist.P2POp(dist.irecv, y, prv, group=group)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        return y

    def case_ring():
        for n in (10, 1 << 20):
            got = case_batch_isend_irecv(S, n)
            want = case_batch_isend_irecv(G, n)
            assert_close(got, want, f"ring exchange {n}")

    res.run("batch_isend_irecv ring (40 B, 4 MiB)", case_ring)

    # ------------------------------------------------------------ barrier, async, futures
    def case_barrier():
        for _ in range(3):
            dist.barrier()
        w = dist.barrier(async_op=True)
        w.wait()
        assert w.is_completed()

    res.run("barrier", case_barrier)

    def case_async():
        # Rank 0 arrives late: the others' async calls must return at once
        # and complete only after rank 0 joins.
        dist.barrier()
        if R == 0:
            time.sleep(1.0)
        t = torch.ones(100)
        t0 = time.monotonic()
        w = dist.all_reduce(t, async_op=True)
        issued = time.monotonic() - t0
        done_early = w.is_completed()
        w.wait()
        assert w.is_completed()
        assert torch.all(t == W)
        if R != 0 and W > 1:
            assert issued < 0.5, f"async all_reduce blocked the caller {issued:.3f} s"
            assert not done_early, "completed before rank 0 joined"
        # Several operations in flight, then waits in reverse order.
        ts = [torch.full((1000,), float(i)) for i in range(8)]
        ws = [dist.all_reduce(t, async_op=True) for t in ts]
        for w in reversed(ws):
            w.wait()
        for i, t in enumerate(ts):
            assert torch.all(t == i * W)
        return f"issue took {issued * 1e3:.2f} ms"

    res.run("async ops do not block the caller", case_async)

    def worker_switches():
        """Voluntary context switches of the backend's worker thread(s)."""
        n, found = 0, 0
        for task in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{task}/comm") as f:
                    if f.read().strip() != "sncl-torch-wrk":
                        continue
                with open(f"/proc/self/task/{task}/status") as f:
                    for line in f:
                        if line.startswith("voluntary_ctxt_switches"):
                            n += int(line.split()[1])
                            found += 1
            except OSError:
                pass
        return n, found

    def case_inline_wakes_no_thread():
        # A blocking operation with nothing queued runs on the caller's
        # thread and must not wake the worker: a futex wake and two context
        # switches per call were most of a 1 KiB all-reduce's time.
        t = torch.ones(256)
        dist.barrier()
        before, found = worker_switches()
        assert found >= 1, "no sncl-torch-wrk thread in this process"
        for _ in range(2000):
            dist.all_reduce(t)
        after, _ = worker_switches()
        assert after - before < 100, f"the worker woke {after - before} times in 2000 inline calls"
        return f"worker context switches: {after - before}"

    res.run("blocking small ops wake no thread", case_inline_wakes_no_thread)

    def case_future():
        t = torch.ones(10) * (R + 1)
        fut = dist.all_reduce(t, async_op=True).get_future()
        fut2 = fut.then(lambda f: f.value()[0] * 2)
        v = fut2.wait()
        assert torch.all(v == W * (W + 1)), v
        assert isinstance(fut.value(), list) and fut.value()[0] is not None
        w = dist.all_reduce(torch.ones(3), async_op=True)
        w.wait()
        assert w.get_future().done()

    res.run("Work.get_future / then", case_future)

    def case_objects():
        objs = [None] * W
        dist.all_gather_object(objs, {"rank": R, "s": "x" * R})
        assert objs == [{"rank": r, "s": "x" * r} for r in range(W)], objs
        lst = [R, "hello"] if R == 0 else [None, None]
        dist.broadcast_object_list(lst, src=0)
        assert lst == [0, "hello"], lst

    res.run("all_gather_object / broadcast_object_list", case_objects)

    def case_bad_dtype():
        try:
            dist.all_reduce(torch.ones(4, dtype=torch.int16))
        except Exception as e:  # noqa: BLE001
            assert "sncl" in str(e), str(e)
        else:
            raise AssertionError("int16 all_reduce should be refused")
        t = torch.ones(4)
        dist.all_reduce(t)  # the group still works
        assert torch.all(t == W)

    res.run("unsupported dtype is refused, group stays usable", case_bad_dtype)

    def case_failure():
        # Rank 0 skips an all_reduce on a group with a 3 s timeout: the
        # others' work fails, and wait() raises with sncl's explanation.
        import datetime
        if W < 2:
            return "skipped: world size 1"
        sub = dist.new_group(backend="sncl", timeout=datetime.timedelta(seconds=3))
        t = torch.ones(1000)
        dist.all_reduce(t, group=sub)  # the group works
        note = ""
        if R != 0:
            t0 = time.monotonic()
            w = dist.all_reduce(t, group=sub, async_op=True)
            try:
                w.wait()
            except Exception as e:  # noqa: BLE001
                msg = str(e)
                assert "sncl" in msg and "snclAllReduce" in msg, msg
                note = f"after {time.monotonic() - t0:.1f} s: {msg.splitlines()[0][:90]}"
            else:
                raise AssertionError("wait() did not raise")
            assert w.is_completed() and not w.is_success()
        dist.barrier(group=G)
        dist.destroy_process_group(sub)
        return note

    res.run("a failed operation raises from wait()", case_failure)

    # ------------------------------------------------------------ new_group
    def case_subgroups():
        evens = list(range(0, W, 2))
        odds = list(range(1, W, 2))
        se = dist.new_group(evens, backend="sncl", timeout=TIMEOUT)
        so = dist.new_group(odds, backend="sncl", timeout=TIMEOUT) if odds else None
        ge = dist.new_group(evens, backend="gloo", timeout=TIMEOUT)
        go = dist.new_group(odds, backend="gloo", timeout=TIMEOUT) if odds else None
        mine_s, mine_g = (se, ge) if R % 2 == 0 else (so, go)
        x = gen(torch.float32, (999,), 123, R)
        y, ref = x.clone(), x.clone()
        dist.all_reduce(y, group=mine_s)
        dist.all_reduce(ref, group=mine_g)
        assert_close(y, ref, "subgroup all_reduce")
        ranks = evens if R % 2 == 0 else odds
        outs = [torch.empty(3) for _ in ranks]
        dist.all_gather(outs, torch.full((3,), float(R)), group=mine_s)
        assert [o[0].item() for o in outs] == [float(r) for r in ranks]
        b = torch.full((4,), float(R))
        dist.broadcast(b, src=ranks[-1], group=mine_s)  # global rank
        assert torch.all(b == ranks[-1])
        # size-1 groups, one per rank (every rank creates all of them)
        singles = [dist.new_group([r], backend="sncl", timeout=TIMEOUT) for r in range(W)]
        me = singles[R]
        t = torch.full((7,), float(R))
        dist.all_reduce(t, group=me, op=RO.AVG)
        assert torch.all(t == R)
        o = torch.empty(7)
        dist.all_gather_into_tensor(o, t, group=me)
        assert torch.equal(o, t)
        dist.barrier(group=me)
        for g in [se, so, ge, go] + singles:
            if g is not None:
                dist.destroy_process_group(g)

    res.run("new_group: even/odd subgroups and size-1 groups", case_subgroups)

    rc = res.finish(group=G)
    dist.destroy_process_group()
    return rc


if __name__ == "__main__":
    sys.exit(main())
