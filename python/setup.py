"""Builds sncl_torch, the "sncl" c10d backend, against the installed torch.

Install with the torch you will run it with (no build isolation, so the
extension compiles against that torch's headers and C++ ABI; it is never
shipped prebuilt):

    cargo build --release                       # target/release/libsncl.a
    pip install --no-build-isolation ./python

libsncl is linked statically (target/release/libsncl.a, or $SNCL_LIB_DIR),
so the extension does not depend on a library path at run time; its Rust
symbols stay private to the extension (--exclude-libs). The header comes
from the repository's include/ (or $SNCL_INCLUDE_DIR).
"""

import os
import pathlib

from setuptools import setup

try:
    from torch.utils.cpp_extension import BuildExtension, CppExtension
except ImportError as e:  # pragma: no cover
    raise SystemExit(
        "sncl_torch builds against the installed torch: install torch first, "
        "then `pip install --no-build-isolation ./python`"
    ) from e

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
LIB_DIR = pathlib.Path(os.environ.get("SNCL_LIB_DIR", REPO / "target" / "release"))
INC_DIR = pathlib.Path(os.environ.get("SNCL_INCLUDE_DIR", REPO / "include"))
STATIC = LIB_DIR / "libsncl.a"
HEADER = INC_DIR / "sncl.h"

for f, hint in ((STATIC, "run `cargo build --release` or set SNCL_LIB_DIR"),
                (HEADER, "set SNCL_INCLUDE_DIR")):
    if not f.exists():
        raise SystemExit(f"sncl_torch: {f} not found ({hint})")

ext = CppExtension(
    name="sncl_torch._C",
    sources=[
        "csrc/sncl_backend.cpp",  # Work, the process group's plumbing, module
        "csrc/sncl_ops.cpp",  # collectives: one wrapper per c10d op
        "csrc/sncl_ops_p2p.cpp",  # all-to-all, send/recv, compressed, barrier
        "csrc/sncl_helpers.cpp",  # tensor checks, dtype mapping, reductions
        "csrc/sncl_extras.cpp",  # profiling, any-source recv, monitored barrier
    ],
    include_dirs=[str(INC_DIR)],
    depends=[str(STATIC), str(HEADER), "csrc/sncl_backend.hpp", "csrc/sncl_helpers.hpp"],
    extra_objects=[str(STATIC)],
    extra_compile_args=["-O2", "-g0"],
    extra_link_args=[
        "-Wl,--exclude-libs,ALL",
        "-Wl,--gc-sections",
        # what the Rust staticlib needs (rustc --print native-static-libs)
        "-lgcc_s", "-lutil", "-lrt", "-lpthread", "-ldl", "-lm",
    ],
)

setup(
    name="sncl-torch",
    version="0.1.0",
    description='The "sncl" torch.distributed (c10d) backend',
    packages=["sncl_torch"],
    ext_modules=[ext],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
    entry_points={"torch.distributed.backends": ["sncl = sncl_torch:_register"]},
    python_requires=">=3.9",
    zip_safe=False,
)
