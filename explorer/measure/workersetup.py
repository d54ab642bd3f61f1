"""What every worker that runs our plans gets: glibc's mmap threshold pinned as in the profiling server.

The isolated profiles are taken in children of a fork server that pins glibc's mmap
threshold at 128 KiB (``explorer.measure.highwater.fix_mmap_threshold``).  A process that does
not pin it has glibc's *dynamic* threshold: freeing an mmapped block of ``s`` bytes above
the current threshold (up to 32 MiB) raises the threshold to ``s``, so later arrays up to that size
land on the heap, whose freed pages are reused in place or kept, and the peak of the same
``operator.run`` then depends on what the process freed before.  Measured on unet3d at
200x96x64 (``scripts/results/allocator.md``): 375.7 MiB pinned, as profiled, against 449-468
MiB in fresh processes with the dynamic threshold and 375-422 MiB in such a worker, by the
tasks before; gst3d and envelope peak the same in fresh processes.

So the workers that run the work get the profiling server's setting, and the model's
bound describes them:

* :class:`AllocatorPlugin`, a worker plugin whose ``setup`` pins the threshold in the
  worker process; the scheduler gives a registered plugin to every worker that joins later,
  a worker a nanny restarted included;
* :func:`prepare_workers` registers it (once per scheduler: a named, idempotent plugin) and
  returns, per worker, whether the setting took; ``explorer.runner.daskrun``, ``explorer.runner.probes``
  and ``explorer.plan.recommend`` call it before they measure a worker's baseline or run a task;
* :func:`dask_setup`: the same as a preload, ``dask worker --preload explorer.measure.workersetup``;
* or the environment, ``MALLOC_MMAP_THRESHOLD_=131072 dask worker ...``, read by glibc at the
  process's start (``docs/workers.md``).

Any of glibc's ``M_MMAP_THRESHOLD``, ``M_TRIM_THRESHOLD``, ``M_TOP_PAD`` or ``M_MMAP_MAX``
set by ``mallopt`` or the environment turns the dynamic threshold off, which leaves it at
128 KiB: distributed's nanny spawns its workers with ``MALLOC_TRIM_THRESHOLD_=65536``
(``distributed.nanny.pre-spawn-environ``), so a default nanny-run worker already behaves
as pinned; a worker without a nanny, or with that variable unset in the config, does not.
The plugin makes the setting hold whatever the cluster's configuration.

:func:`prepare_workers` (given the operator) also sends the workers what they cannot find by
name (:func:`send_operators`, :class:`OperatorsPlugin`: a function operator, a class from
``__main__`` or a ``module:attr`` reference; ``operators.portable``), so that a lookup by name on
a worker (a probe's warm-up, the live observer) finds what the caller defined.
"""

from __future__ import annotations

import ctypes
import ctypes.util

from distributed.diagnostics.plugin import WorkerPlugin

from explorer.measure.highwater import MMAP_THRESHOLD_BYTES, fix_mmap_threshold, release_free_heap

__all__ = ["ENVIRONMENT_VARIABLE", "OPERATORS_PLUGIN_NAME", "PLUGIN_NAME", "AllocatorPlugin", "OperatorsPlugin",
           "send_operators", "allocator_pinned", "dask_setup",
           "mmap_threshold_pinned", "pin_mmap_threshold", "prepare_workers"]

#: The name the plugin is registered under (one per scheduler).
PLUGIN_NAME = "explorer-allocator"
#: The name of :class:`OperatorsPlugin` (registered again when the caller's operators change).
OPERATORS_PLUGIN_NAME = "explorer-operators"
#: glibc's environment variable for the same setting, read once at a process's start.
ENVIRONMENT_VARIABLE = "MALLOC_MMAP_THRESHOLD_"

#: In this process: True once the threshold was pinned here, False when pinning failed (not
#: glibc), None when nothing tried.
_PINNED: bool | None = None


def pin_mmap_threshold(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Pin glibc's mmap threshold in this process (``explorer.measure.highwater.fix_mmap_threshold``),
    then return the heap's free memory to the kernel (``malloc_trim(0)``); record and return
    whether pinning took.

    The trim matters in a process that ran with the dynamic threshold: what it put on the heap
    and freed stays there as a free chunk, and glibc serves a request from free heap memory
    before it asks the kernel, so without the trim a 24 MiB array would still land on the heap
    after pinning (seen here with :func:`mmap_threshold_pinned`).
    """
    global _PINNED
    _PINNED = fix_mmap_threshold(threshold)
    if _PINNED:
        release_free_heap()
    return _PINNED


def allocator_pinned() -> bool | None:
    """Whether this process pinned the mmap threshold (:func:`pin_mmap_threshold`: the plugin, the preload):
    True, False (``mallopt`` unavailable or refused), or None (never tried here)."""
    return _PINNED


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                      "fsmblks", "uordblks", "fordblks", "keepcost")]


#: The block freed, then the allocation watched, by :func:`mmap_threshold_pinned`.
_FREED_BYTES = 24 << 20
_WATCHED_BYTES = 1 << 20


def mmap_threshold_pinned() -> bool:
    """Whether this process's mmap threshold behaves as pinned, whoever set it (the plugin, the
    preload, an environment variable, a nanny's ``MALLOC_TRIM_THRESHOLD_``).

    glibc has no getter, so the behaviour is read: ``malloc`` and free a 24 MiB block (above
    128 KiB, so mmapped unless the threshold already rose past it), then ``malloc`` 1 MiB and
    see whether ``mallinfo2().hblkhd`` (bytes in mmapped chunks) grows by it.  A dynamic
    threshold rose to 24 MiB at that free and the 1 MiB went to the heap; a pinned one did
    not.  The majority of three tries (another thread may free an mmapped chunk between two
    reads).  No page is touched: nothing stays resident.  False where glibc's ``mallinfo2``
    is missing (another C library, glibc < 2.33).  Run it on workers with ``client.run``; on
    an unpinned process it leaves the threshold at 24 MiB or above.
    """
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is None or not hasattr(libc, "mallinfo2"):
        return False
    malloc, free, mallinfo2 = libc.malloc, libc.free, libc.mallinfo2
    malloc.restype, malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    free.argtypes = [ctypes.c_void_p]
    mallinfo2.restype, mallinfo2.argtypes = _Mallinfo2, []
    votes = 0
    for _ in range(3):
        free(malloc(_FREED_BYTES))
        before = mallinfo2().hblkhd
        watched = malloc(_WATCHED_BYTES)
        grown = mallinfo2().hblkhd - before
        free(watched)
        votes += grown >= _WATCHED_BYTES
    return votes >= 2


class AllocatorPlugin(WorkerPlugin):
    """Pins glibc's mmap threshold at ``threshold`` bytes (128 KiB) in each worker process.

    ``setup`` calls :func:`pin_mmap_threshold` in the worker and records whether it succeeded
    (:func:`allocator_pinned`); it never raises, so a worker without glibc still runs,
    unpinned, and :func:`prepare_workers` says so.
    """

    name = PLUGIN_NAME
    idempotent = True

    def __init__(self, threshold: int = MMAP_THRESHOLD_BYTES):
        self.threshold = int(threshold)

    def setup(self, worker) -> None:
        pin_mmap_threshold(self.threshold)


class OperatorsPlugin(WorkerPlugin):
    """Registers the caller's operators in each worker (``operators.portable.install``), now and
    in every worker that joins later; ``setup`` raises (the registration fails, one line) when
    one cannot be loaded on a worker."""

    name = OPERATORS_PLUGIN_NAME

    def __init__(self, pickles: list[bytes]):
        self.pickles = list(pickles)

    def setup(self, worker) -> None:
        from operators.portable import install

        install(self.pickles)


def send_operators(client, operator) -> None:
    """Register :class:`OperatorsPlugin` on ``client``'s cluster with what ``operator`` (a name,
    a spec or an ``Operator``) uses that its workers cannot find by name (``operators.portable``:
    a function operator, a class from ``__main__`` or a ``module:attr``); nothing otherwise."""
    from operators.portable import payloads

    sent = payloads(operator)
    if sent:
        client.register_plugin(OperatorsPlugin(sent), name=OPERATORS_PLUGIN_NAME)


def prepare_workers(client, operator=None, threshold: int = MMAP_THRESHOLD_BYTES) -> dict[str, bool]:
    """Register :class:`AllocatorPlugin` on ``client``'s cluster and, for ``operator`` (when
    given), :func:`send_operators`; per worker, whether the allocator setting took.

    Idempotent: the plugin is registered under :data:`PLUGIN_NAME` once per scheduler, and
    every worker that joins later (a restarted one too) gets it from the scheduler.  Returns
    ``{worker address: pinned}`` for the workers connected now: the behaviour read back in
    each worker process (:func:`mmap_threshold_pinned` through ``client.run``), not only
    ``mallopt``'s return.
    """
    threshold = int(threshold)
    if threshold <= 0:
        raise ValueError(f"threshold must be a positive number of bytes, got {threshold}")
    client.register_plugin(AllocatorPlugin(threshold), name=PLUGIN_NAME)
    if operator is not None:
        send_operators(client, operator)
    replies = client.run(mmap_threshold_pinned)
    return {address: bool(pinned) for address, pinned in replies.items()}


def unpinned_warning(pinned: dict[str, bool]) -> str | None:
    """One line for a run's warnings when some workers did not take the setting, else None."""
    missing = sorted(address for address, ok in pinned.items() if not ok)
    if not missing:
        return None
    more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
    return (f"glibc's mmap threshold could not be pinned on worker {missing[0]}{more}: its tasks may peak above the "
            f"isolated profiles (docs/workers.md)")


def dask_setup(worker) -> None:
    """Preload hook: ``dask worker --preload explorer.measure.workersetup`` pins the threshold in each
    worker process at its start, before it connects (the plugin's setting, without a client)."""
    pin_mmap_threshold()
