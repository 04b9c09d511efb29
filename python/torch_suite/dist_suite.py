"""PyTorch's own distributed test suite, `_DistTestBase`
(torch.testing._internal.distributed.distributed_test, shipped in the torch
wheel), on one backend: what test/distributed/test_distributed_spawn.py
does for gloo and nccl, for any backend torch can load.

    BACKEND=sncl WORLD_SIZE=2 TEMP_DIR=$(mktemp -d) python dist_suite.py -v [-k PATTERN]

scripts/torch-dist-suite.sh runs it for sncl and for gloo and compares the
two. For BACKEND=sncl the suite is told what sncl implements on CPU tensors
(DDP, sub-groups, object collectives: the feature sets the suite's skip
decorators read),
before the suite is imported, since its decorators read them then; tests
that need a GPU still skip where there is none.
"""

import os

import torch  # noqa: F401
import torch.testing._internal.common_distributed as common_distributed

import sncl_torch  # noqa: F401  (registers the "sncl" backend)

# BACKEND=sncl-as-gloo: the suite believes it tests gloo (its gloo-only
# tests run: batch isend/irecv, sparse all-reduce, monitored barriers,
# get_future, coalesced all-reduce, timeouts), but every process group it
# makes with backend "gloo" is sncl. Groups a test makes itself are
# changed too; what those tests check of gloo itself (its name, its
# options) is then checked of sncl.
if os.environ.get("BACKEND") == "sncl-as-gloo":
    os.environ["SNCL_SUITE_AS_GLOO"] = "1"  # inherited by the spawned ranks
    os.environ["BACKEND"] = "gloo"
if os.environ.get("SNCL_SUITE_AS_GLOO") == "1":
    import torch.distributed as dist

    _init, _new_group = dist.init_process_group, dist.new_group

    def _sncl_for_gloo(backend):
        return "sncl" if backend in ("gloo", dist.Backend.GLOO) else backend

    def _init_process_group(*args, backend=None, **kwargs):
        return _init(*args, backend=_sncl_for_gloo(backend), **kwargs)

    def _new_group_sncl(*args, backend=None, **kwargs):
        return _new_group(*args, backend=_sncl_for_gloo(backend), **kwargs)

    dist.init_process_group = _init_process_group
    dist.new_group = _new_group_sncl

BACKEND = os.environ["BACKEND"]
if BACKEND == "sncl":
    # What sncl implements, in the suite's terms: DDP, sub-groups, the
    # collectives the suite runs for "gpu" backends (object collectives,
    # monitored barriers; on CPU tensors here, CUDA ones where a GPU is),
    # and "plugin" (a backend torch loads through its entry point).
    for feature in ("ddp", "subgroup", "gpu", "plugin"):
        common_distributed.DistTestCases.backend_feature[feature].add("sncl")

from torch.testing._internal.common_utils import run_tests  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


class _Recorder:
    """Appends "name<TAB>status<TAB>detail" per test to SUITE_RESULTS."""

    def __init__(self, path):
        self.path = path

    def write(self, test, status, detail=""):
        name = test.id().rsplit(".", 1)[-1]
        detail = " ".join(str(detail).split())[:300]
        with open(self.path, "a") as f:
            f.write(f"{name}\t{status}\t{detail}\n")


def _recording_result(path):
    import unittest

    rec = _Recorder(path)

    class Result(unittest.TextTestResult):
        def addSuccess(self, test):
            super().addSuccess(test)
            rec.write(test, "pass")

        def addSkip(self, test, reason):
            super().addSkip(test, reason)
            rec.write(test, "skip", reason)

        def addFailure(self, test, err):
            super().addFailure(test, err)
            rec.write(test, "fail", err[1])

        def addError(self, test, err):
            super().addError(test, err)
            rec.write(test, "error", err[1])

        def addExpectedFailure(self, test, err):
            super().addExpectedFailure(test, err)
            rec.write(test, "xfail")

        def addUnexpectedSuccess(self, test):
            super().addUnexpectedSuccess(test)
            rec.write(test, "xpass")

    return Result


if __name__ == "__main__":
    results = os.environ.get("SUITE_RESULTS")
    if results:
        import sys
        import unittest

        unittest.main(
            argv=sys.argv,
            testRunner=unittest.TextTestRunner(resultclass=_recording_result(results), verbosity=2),
        )
    else:
        run_tests()
