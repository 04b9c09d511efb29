"""The "sncl" backend for torch.distributed.

``import sncl_torch`` registers the backend; it is also found through the
``torch.distributed.backends`` entry point, so ``init_process_group("sncl")``
works without the import once the package is installed::

    import torch.distributed as dist
    dist.init_process_group("sncl")          # cpu (and cuda) tensors
    g = dist.new_group([0, 1], backend="sncl")

or, for CUDA tensors (when :func:`cuda_built`), one of::

    dist.init_process_group("sncl", device_id=torch.device("cuda", local_rank))
    dist.init_process_group("cpu:gloo,cuda:sncl")

The backend is C++ (a ``c10d::Backend`` over sncl's C ABI), compiled at
install time against the installed torch. Rank 0 of each group creates the
sncl unique id and publishes it through the group's c10d store; operations
run on a per-group worker thread, so ``async_op=True`` calls return at once;
operations on CUDA tensors are enqueued on the current CUDA stream of their
device and complete through CUDA events, as with ProcessGroupNCCL.

Beyond torch.distributed, :func:`all_reduce_compressed` runs sncl's
compressed all-reduce (int8 / fp16 / bf16 / top-k codecs on the cross-node
tier), and :func:`int8_compress_hook` is a DDP communication hook over it::

    ddp.register_comm_hook(None, sncl_torch.int8_compress_hook)
"""

import contextlib
import itertools

import torch  # noqa: F401  (loads libtorch before the extension)
import torch.distributed as dist

from . import _C

__all__ = [
    "Options",
    "version",
    "cuda_built",
    "BACKEND_NAME",
    "all_reduce_compressed",
    "int8_compress_hook",
    "compress_hook",
]

BACKEND_NAME = "sncl"

# Numbers compress_hook gives its hooks (their error-feedback keys).
_hook_numbers = itertools.count()


def version() -> int:
    """SNCL_VERSION_CODE of the libsncl compiled into the extension."""
    return _C.version()


def _sncl_backend(group):
    """The sncl backend (c10d Backend) of a process group (None: WORLD)."""
    if group is None:
        group = dist.group.WORLD
    if group is None:
        raise RuntimeError("sncl: the default process group is not initialized")
    return group._get_backend(torch.device("cpu"))


def suspend(group=None) -> None:
    """Releases the peer buffers of `group`'s sncl communicator (None: the
    default group) once the operations queued before it ran: every rank
    calls it, like a collective (snclCommSuspend; the same as
    ``group._get_backend(torch.device("cpu")).suspend()``, torch's memory
    offload API). Operations fail until :func:`resume`."""
    _sncl_backend(group).suspend()


def resume(group=None) -> None:
    """Connects a suspended group's ranks again (snclCommResume): every rank
    calls it."""
    _sncl_backend(group).resume()


def memory_stats(group=None) -> dict:
    """What this rank of `group` holds, in bytes: NCCL's keys ("suspend":
    what :func:`suspend` would release, "suspended", "persist", "total") and
    sncl's by purpose and residence (snclCommMemStats)."""
    return dict(_sncl_backend(group).memory_stats())


def dump_flight_recorder(group=None) -> str:
    """Writes this rank's flight recorder of `group` (its last operations,
    their state, timing and tags) as JSON lines into ``SNCL_DEBUG_DUMP_DIR``
    (set before the group is created) and returns the file's path;
    ``commbench trace DIR`` reads the dumps of all ranks. Waits for no
    operation (snclCommDumpFlightRecorder)."""
    return _C._dump_flight_recorder(_sncl_backend(group))


@contextlib.contextmanager
def tag(name: str):
    """Tags the sncl operations this thread issues inside the block with
    ``name`` (``snclTagOfName``: a stable 64-bit hash, the same on every
    rank; the tag is yielded). sncl's flight recorder, ``commbench trace``
    and statistics show the name with each operation, and the block is a
    ``torch.profiler.record_function`` scope of that name, so the profiler
    shows the ``sncl:<op>`` events inside it::

        with sncl_torch.tag("backward/bucket 3"):
            dist.all_reduce(grad)
    """
    value = _C._tag_of(name)
    previous = _C._set_thread_tag(value)
    try:
        with torch.profiler.record_function(name):
            yield value
    finally:
        _C._set_thread_tag(previous)


def all_reduce_compressed(
    tensor: torch.Tensor,
    codec: str = "int8",
    group=None,
    average: bool = True,
    feedback_key=None,
) -> torch.futures.Future:
    """All-reduces ``tensor`` in place with sncl's compressed all-reduce.

    ``tensor``: a contiguous float32 CPU tensor, the same length on every
    rank. ``codec``: a codec spec (``"int8"``, ``"int8:<block>"``,
    ``"fp16"``, ``"bf16"``, ``"mxfp8"``, ``"mxfp4"``, ``"topk:0.01"``), the same on every rank; it is
    lossy and applies where the data crosses nodes (between all ranks when
    they share one node). ``group``: a process group whose CPU backend is
    sncl (None: the default group). ``average``: mean instead of sum.
    ``feedback_key``: a non-negative int naming the tensor (e.g. a DDP
    bucket's index) to run with error feedback: what the codec drops of
    this rank's data is kept by the group under that key and added to the
    next call's data, so nothing is lost over time; None: no feedback.

    Runs asynchronously on the group's worker, in order with its other
    operations; returns a Future resolving to ``tensor`` once it is reduced.
    """
    key = -1 if feedback_key is None else int(feedback_key)
    if key < 0 and feedback_key is not None:
        raise ValueError(f"sncl: feedback_key must be a non-negative int, got {feedback_key!r}")
    work = _C._all_reduce_compressed(_sncl_backend(group), tensor, codec, average, key)
    return work.get_future().then(lambda fut: fut.value()[0])


def compress_hook(codec: str, error_feedback: bool = False):
    """A DDP communication hook that averages each gradient bucket with
    sncl's compressed all-reduce under ``codec`` (any spec
    :func:`all_reduce_compressed` takes: ``"mxfp8"``, ``"mxfp4"``,
    ``"int8"``, ...)::

        ddp.register_comm_hook(None, sncl_torch.compress_hook("mxfp8", error_feedback=True))

    ``error_feedback``: keep, per bucket, what the codec dropped and add it
    to that bucket's next gradients. Each hook made here has its own
    feedback (the group keeps it under this hook's keys and the bucket's
    index), so two models, or two runs, never share it; a bucket whose
    length changes starts over. The hook's ``state`` is None (the default
    group) or a process group whose CPU backend is sncl.
    """
    # Keys of this hook: its number in the high bits, the bucket's index
    # in the low 32.
    base = next(_hook_numbers) << 32

    def hook(state, bucket) -> torch.futures.Future[torch.Tensor]:
        key = base + bucket.index() if error_feedback else None
        return all_reduce_compressed(
            bucket.buffer(), codec, group=state, average=True, feedback_key=key
        )

    suffix = "_ef" if error_feedback else ""
    hook.__name__ = hook.__qualname__ = f"sncl_compress_hook_{codec}{suffix}"
    return hook


def int8_compress_hook(state, bucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: averages the gradient bucket with sncl's int8
    codec (block-scaled int8 across nodes, decoded and summed in float32).

    ``state``: None (the default group) or a process group whose CPU
    backend is sncl::

        ddp.register_comm_hook(None, sncl_torch.int8_compress_hook)
    """
    return all_reduce_compressed(bucket.buffer(), "int8", group=state, average=True)


class Options:
    """Options of the sncl backend, passed as ``pg_options``::

        dist.init_process_group(
            "sncl", pg_options=sncl_torch.Options(deterministic=True)
        )

    ``deterministic``: True makes all-reduce, reduce and reduce-scatter
    bitwise reproducible, every element reduced in one canonical order
    whatever the algorithm, placement or bucket boundaries (sncl's
    docs/DETERMINISM.md); False lets each algorithm reduce in its own
    order; None (default) leaves it to ``SNCL_DETERMINISTIC``. Every rank
    must pass the same; groups split or shrunk from the group keep it, but
    a group made by ``dist.new_group`` takes its own ``pg_options`` (else
    ``SNCL_DETERMINISTIC``): for a whole job, set ``SNCL_DETERMINISTIC=1``.
    """

    def __init__(self, deterministic=None):
        if deterministic not in (None, True, False):
            raise ValueError(
                f"sncl_torch.Options: deterministic must be True, False or None, "
                f"got {deterministic!r}"
            )
        self.deterministic = deterministic

    def __repr__(self):
        return f"sncl_torch.Options(deterministic={self.deterministic!r})"


def _create_backend(opts, backend_options=None):
    """c10d's extended-API creator: opts is a _DistributedBackendOptions;
    backend_options is the ``pg_options`` given (an :class:`Options`, or
    None)."""
    group_id = str(opts.group_id) if getattr(opts, "group_id", None) else "default"
    deterministic = -1
    if backend_options is not None:
        if not isinstance(backend_options, Options):
            raise TypeError(
                "sncl: pg_options must be a sncl_torch.Options, got "
                f"{type(backend_options).__name__}"
            )
        if backend_options.deterministic is not None:
            deterministic = int(backend_options.deterministic)
    return _C._create_backend(
        opts.store,
        opts.group_rank,
        opts.group_size,
        opts.timeout,
        group_id,
        deterministic,
    )


def cuda_built() -> bool:
    """Whether this sncl_torch was built with CUDA support (it then takes
    CUDA tensors: see :func:`_devices`)."""
    return bool(_C._cuda_built())


def _devices() -> list:
    """The device types "sncl" registers for: "cpu", and "cuda" when the
    extension was built with CUDA support, so that
    ``init_process_group("sncl")`` serves both and
    ``backend="cpu:gloo,cuda:sncl"`` is accepted."""
    return ["cpu", "cuda"] if cuda_built() else ["cpu"]


def _register() -> None:
    """Registers "sncl" with torch.distributed (idempotent); the entry point."""
    plugins = getattr(dist.Backend, "_plugins", {})
    if "SNCL" in plugins:
        return
    dist.Backend.register_backend(
        BACKEND_NAME, _create_backend, extended_api=True, devices=_devices()
    )


_register()
