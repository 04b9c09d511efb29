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
