"""Builds sncl_torch, the "sncl" c10d backend, against the installed torch.

Install with the torch you will run it with (no build isolation, so the
extension compiles against that torch's headers and C++ ABI; it is never
shipped prebuilt):

    cargo build --release -p sncl-capi          # target/release/libsncl.a
    pip install --no-build-isolation ./python

libsncl is linked statically (target/release/libsncl.a, or $SNCL_LIB_DIR),
so the extension does not depend on a library path at run time; its Rust
symbols stay private to the extension (--exclude-libs). The header comes
from the repository's include/ (or $SNCL_INCLUDE_DIR).

CUDA tensors: when torch was built with CUDA (torch.version.cuda) and the
CUDA runtime headers are found, the extension is compiled with
SNCL_TORCH_CUDA and linked with c10_cuda. No nvcc is needed (host code
only): the headers come from the nvidia wheel that torch's CUDA build
installs (nvidia/cu13/include, nvidia/cuda_runtime/include) plus, for
CUDA 13, the crt/ headers of the nvidia-cuda-crt wheel, else from
$CUDA_HOME/include or target/cuda-wheels (scripts/cuda-wheels.sh); $SNCL_CUDA_INCLUDE_DIR (a path list) names them
explicitly and SNCL_TORCH_CUDA=0 builds the CPU-only variant.
"""

import os
import pathlib
import sys

from setuptools import setup

try:
    import torch
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

for f, hint in ((STATIC, "run `cargo build --release -p sncl-capi` or set SNCL_LIB_DIR"),
                (HEADER, "set SNCL_INCLUDE_DIR")):
    if not f.exists():
        raise SystemExit(f"sncl_torch: {f} not found ({hint})")


def cuda_include_dirs():
    """The include directories for torch's CUDA runtime headers
    (cuda_runtime_api.h and the crt/ headers it includes), or [] (then the
    extension is CPU-only) with the reason printed."""
    if os.environ.get("SNCL_TORCH_CUDA", "1") == "0":
        return []
    if not torch.version.cuda:
        return []
    forced = os.environ.get("SNCL_CUDA_INCLUDE_DIR")
    if forced:
        dirs = [d for d in forced.split(os.pathsep) if d]
        for need in ("cuda_runtime_api.h", "crt/host_defines.h"):
            if not any((pathlib.Path(d) / need).exists() for d in dirs):
                raise SystemExit(f"sncl_torch: SNCL_CUDA_INCLUDE_DIR={forced}: no {need} there")
        return dirs
    major = torch.version.cuda.split(".")[0]
    candidates = []
    # The nvidia wheels torch's CUDA build installs (a namespace package):
    # nvidia/cu13/include (CUDA 13), nvidia/cuda_runtime/include (CUDA 12).
    for base in sys.path:
        nv = pathlib.Path(base or ".") / "nvidia"
        if nv.is_dir():
            candidates += [nv / f"cu{major}" / "include", nv / "cuda_runtime" / "include"]
            candidates += [nv / "cuda_crt" / "include"]
    from torch.utils import cpp_extension

    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), cpp_extension.CUDA_HOME):
        if home:
            candidates.append(pathlib.Path(home) / "include")
    # What scripts/cuda-wheels.sh installs (it has the crt/ headers).
    candidates.append(REPO / "target" / "cuda-wheels" / "nvidia" / f"cu{major}" / "include")
    runtime = [c for c in candidates if (c / "cuda_runtime_api.h").exists()]
    crt = [c for c in candidates if (c / "crt" / "host_defines.h").exists()]
    if not runtime:
        why = "no cuda_runtime_api.h (the nvidia-cuda-runtime wheel, or CUDA_HOME)"
    elif not crt:
        # CUDA 13 moved crt/ into the nvidia-cuda-crt wheel, which torch
        # does not install.
        why = f"cuda_runtime_api.h in {runtime[0]} but no crt/host_defines.h (the nvidia-cuda-crt wheel for CUDA {major}, or CUDA_HOME)"
    else:
        # torch's own runtime headers first; crt/ from wherever it is.
        return [str(runtime[0])] + ([str(crt[0])] if crt[0] != runtime[0] else [])
    print(
        f"sncl_torch: torch has CUDA {torch.version.cuda} but {why} was found: building "
        "without CUDA tensor support (set SNCL_CUDA_INCLUDE_DIR to the include directories)",
        file=sys.stderr,
    )
    return []


CUDA_INC = cuda_include_dirs()
if CUDA_INC:
    print(f"sncl_torch: CUDA tensor support, CUDA headers from {os.pathsep.join(CUDA_INC)}", file=sys.stderr)

ext = CppExtension(
    name="sncl_torch._C",
    sources=[
        "csrc/sncl_backend.cpp",  # Work, the process group's plumbing, module
        "csrc/sncl_ops.cpp",  # collectives: one wrapper per c10d op
        "csrc/sncl_ops_p2p.cpp",  # all-to-all, send/recv, compressed, barrier
        "csrc/sncl_helpers.cpp",  # tensor checks, dtype mapping, reductions
        "csrc/sncl_extras.cpp",  # profiling, any-source recv, monitored barrier
        "csrc/sncl_cuda.cpp",  # CUDA streams and allocator (SNCL_TORCH_CUDA)
    ],
    include_dirs=[str(INC_DIR)] + CUDA_INC,
    define_macros=[("SNCL_TORCH_CUDA", "1")] if CUDA_INC else [],
    libraries=["c10_cuda"] if CUDA_INC else [],
    depends=[
        str(STATIC),
        str(HEADER),
        "csrc/sncl_backend.hpp",
        "csrc/sncl_helpers.hpp",
        "csrc/sncl_cuda.hpp",
    ],
    extra_objects=[str(STATIC)],
    extra_compile_args=["-O2", "-g0"],
    extra_link_args=[
        "-Wl,--exclude-libs,ALL",
        "-Wl,--gc-sections",
        # a debug-profile libsncl.a carries ~200 MB of DWARF the module never uses
        "-Wl,--strip-debug",
        # what the Rust staticlib needs (rustc --print native-static-libs)
        "-lgcc_s", "-lutil", "-lrt", "-lpthread", "-ldl", "-lm",
    ],
)



class Build(BuildExtension.with_options(use_ninja=True)):
    """torch's BuildExtension; without ninja (torch then falls back to
    setuptools, one source at a time) the sources compile in parallel
    threads, $MAX_JOBS of them (default: the CPU count)."""

    def build_extension(self, ext):
        if not getattr(self, "use_ninja", False) and len(ext.sources) > 1:
            from concurrent.futures import ThreadPoolExecutor

            one = self.compiler.compile
            jobs = int(os.environ.get("MAX_JOBS") or os.cpu_count() or 1)

            def compile_all(sources, *args, **kwargs):
                with ThreadPoolExecutor(max(1, min(jobs, len(sources)))) as pool:
                    objs = pool.map(lambda src: one([src], *args, **kwargs), sources)
                    return [o for chunk in objs for o in chunk]

            self.compiler.compile = compile_all
        super().build_extension(ext)


setup(
    name="sncl-torch",
    version="0.1.0",
    description='The "sncl" torch.distributed (c10d) backend',
    packages=["sncl_torch"],
    ext_modules=[ext],
    cmdclass={"build_ext": Build},
    entry_points={"torch.distributed.backends": ["sncl = sncl_torch:_register"]},
    python_requires=">=3.9",
    zip_safe=False,
)
