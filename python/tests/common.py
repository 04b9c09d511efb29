"""Helpers shared by the torchrun tests of sncl_torch."""

import datetime
import os
import sys
import traceback

import torch
import torch.distributed as dist

TIMEOUT = datetime.timedelta(seconds=int(os.environ.get("SNCL_TORCH_TEST_TIMEOUT", "180")))


class Results:
    """Runs named cases, records pass/fail, prints a summary on rank 0 and
    makes every rank agree on the outcome."""

    def __init__(self, title):
        self.title = title
        self.rows = []  # (name, ok, note)

    def run(self, name, fn, *args, **kwargs):
        note = ""
        try:
            out = fn(*args, **kwargs)
            ok = True
            if isinstance(out, str):
                note = out
        except Exception as e:  # noqa: BLE001 - a failing case must not stop the others
            ok = False
            note = f"{type(e).__name__}: {e}"
            print(f"[rank {dist.get_rank()}] {self.title}/{name} FAILED:\n"
                  + traceback.format_exc(), file=sys.stderr, flush=True)
        self.rows.append((name, ok, note))
        return ok

    def finish(self, group=None):
        """Prints the table (rank 0); returns the process exit code. A case
        fails when it failed on any rank. The table's verdicts combine the
        ranks with sncl's own all_reduce, so the exit code does not rest on
        it alone: a rank whose own case failed exits 1 whatever the
        combined table says, and torchrun fails the job on that exit code."""
        own_failed = any(not ok for _, ok, _ in self.rows)
        local = torch.tensor([0 if ok else 1 for _, ok, _ in self.rows], dtype=torch.int32)
        if len(self.rows):
            dist.all_reduce(local, op=dist.ReduceOp.MAX, group=group)
        failed = 0
        if dist.get_rank() == 0:
            print(f"== {self.title}: {len(self.rows)} cases", flush=True)
        for (name, _, note), bad in zip(self.rows, local.tolist()):
            failed += bad
            if dist.get_rank() == 0:
                status = "FAIL" if bad else "pass"
                print(f"  {status}  {name}" + (f"  ({note})" if note else ""), flush=True)
        if dist.get_rank() == 0:
            print(f"== {self.title}: {len(self.rows) - failed} passed, {failed} failed", flush=True)
        return 1 if failed or own_failed else 0


def assert_close(got, want, what, rtol=None, atol=None):
    """Exact for integers and bool, relative tolerance for floats."""
    if isinstance(got, (list, tuple)):
        assert len(got) == len(want), f"{what}: {len(got)} tensors, want {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_close(g, w, f"{what}[{i}]", rtol, atol)
        return
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, want {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)}, want {tuple(want.shape)}"
    if got.is_floating_point() or got.is_complex():
        if rtol is None:
            rtol = {torch.float16: 1e-2, torch.bfloat16: 2e-2}.get(got.dtype, 1e-5)
        if atol is None:
            atol = {torch.float16: 1e-2, torch.bfloat16: 5e-2}.get(got.dtype, 1e-6)
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")
    else:
        if not torch.equal(got, want):
            bad = (got != want).nonzero()[:5].tolist()
            raise AssertionError(f"{what}: differs at {bad}: got {got.flatten()[:8].tolist()}, "
                                 f"want {want.flatten()[:8].tolist()}")
