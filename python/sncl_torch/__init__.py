"""The "sncl" backend for torch.distributed.

``import sncl_torch`` registers the backend; it is also found through the
``torch.distributed.backends`` entry point, so ``init_process_group("sncl")``
works without the import once the package is installed::

    import torch.distributed as dist
    dist.init_process_group("sncl")          # cpu tensors
    g = dist.new_group([0, 1], backend="sncl")

The backend is C++ (a ``c10d::Backend`` over sncl's C ABI), compiled at
install time against the installed torch. Rank 0 of each group creates the
sncl unique id and publishes it through the group's c10d store; operations
run on a per-group worker thread, so ``async_op=True`` calls return at once.
"""

import torch  # noqa: F401  (loads libtorch before the extension)
import torch.distributed as dist

from . import _C

__all__ = ["version", "BACKEND_NAME"]

BACKEND_NAME = "sncl"


def version() -> int:
    """SNCL_VERSION_CODE of the libsncl compiled into the extension."""
    return _C.version()


def _create_backend(opts, backend_options=None):
    """c10d's extended-API creator: opts is a _DistributedBackendOptions."""
    group_id = str(opts.group_id) if getattr(opts, "group_id", None) else "default"
    return _C._create_backend(
        opts.store, opts.group_rank, opts.group_size, opts.timeout, group_id
    )


def _register() -> None:
    """Registers "sncl" with torch.distributed (idempotent); the entry point."""
    plugins = getattr(dist.Backend, "_plugins", {})
    if "SNCL" in plugins:
        return
    dist.Backend.register_backend(
        BACKEND_NAME, _create_backend, extended_api=True, devices=["cpu"]
    )


_register()
