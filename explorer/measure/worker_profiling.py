"""Isolated profiles on a cluster's workers: a profiling server per worker, started by a worker plugin.

``explore OP --scheduler ADDR`` (``explorer.explore(op, client=...)``) profiles where the work
will run: each worker keeps its own :class:`~explorer.measure.profiling.SessionProfiler` (its
profiling servers are children of the worker process, so a profile is the same isolated child
as on the calling machine, measured by the same kernel high-water mark), made by
:class:`ProfilingPlugin` on first use and closed when the loop ends (:func:`close_cluster_profilers`)
or with the worker.  The caller claims each
shape in its store, sends the profile to one worker (:class:`WorkerProfiler`: a task pinned to
that worker's address), and writes what comes back onto the claim at once, with the worker's
address (``profiled_on``); the saved model carries the workers' environment stamp.

A worker lost mid-profile costs that profile only: :meth:`WorkerProfiler.profile` returns None,
the caller releases the claim, and the loop goes on with the workers left.
"""

from __future__ import annotations

from distributed.diagnostics.plugin import WorkerPlugin

from explorer.measure.profiling import Measurement, default_memory_cap

__all__ = ["PLUGIN_NAME", "ProfilingPlugin", "WorkerProfiler", "close_cluster_profilers", "cluster_profilers",
           "workers_environment", "workers_memory_cap", "workers_memory_limit"]

#: The name :class:`ProfilingPlugin` is registered under (one per scheduler).
PLUGIN_NAME = "explorer-profiling"
#: Seconds between looks at whether the worker running a profile is still in the cluster.
WORKER_CHECK_SECONDS = 1.0


class ProfilingPlugin(WorkerPlugin):
    """Gives each worker one :class:`~explorer.measure.profiling.SessionProfiler` of ``sessions``
    profiling servers, started at its first profile (a worker that never profiles starts none)
    and closed in ``teardown``; one profile at a time per worker (:attr:`lock`: a worker of
    several threads, or two explore processes sharing the cluster, queue)."""

    name = PLUGIN_NAME
    idempotent = True

    def __init__(self, sessions: int):
        self.sessions = int(sessions)
        self._profiler = None
        self.lock = None

    def setup(self, worker) -> None:
        import threading

        self._profiler = None
        self.lock = threading.Lock()

    def profiler(self):
        from explorer.measure.profiling import SessionProfiler

        if self._profiler is None:
            self._profiler = SessionProfiler(self.sessions, gpu=False)
        return self._profiler

    def teardown(self, worker) -> None:
        if self._profiler is not None:
            self._profiler.close()
            self._profiler = None


def _profile_here(operator: str, shape, repeat: int, options: dict) -> dict:
    """In a worker: one profile by its :class:`ProfilingPlugin`'s servers, as a dict."""
    from distributed import get_worker

    plugin = get_worker().plugins[PLUGIN_NAME]
    with plugin.lock:
        return plugin.profiler().profile(operator, tuple(shape), repeat=repeat, **options).to_dict()


def _operator_error_here(operator: str) -> str | None:
    """In a worker: why ``operator`` cannot be found here (its plug-in package not installed,
    say), or None."""
    try:
        import operators
        from operators.plugins import load_plugins

        load_plugins()
        operators.get(operator)
    except Exception as exc:
        return f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:300]
    return None


class WorkerProfiler:
    """Profiles on one worker (``address``) of ``client``'s cluster: the interface of
    :class:`~explorer.measure.profiling.SessionProfiler` (``profile``, ``close``); the worker's
    environment stamp for the operator (read once, :func:`cluster_profilers`) in :attr:`environment`."""

    def __init__(self, client, address: str, environment: dict | None = None):
        self.client, self.address, self.environment = client, address, environment
        self.lost: str | None = None  # why this worker can no longer profile

    def profile(self, operator: str, shape, *, repeat: int = 1, **options) -> Measurement | None:
        """One profile on this worker, or None when the worker was lost before it finished
        (:attr:`lost` says how)."""
        from distributed import CancelledError
        from distributed.comm.core import CommClosedError
        from distributed.scheduler import KilledWorker

        if self.lost:
            return None
        future = self.client.submit(_profile_here, operator, tuple(int(n) for n in shape), int(repeat), dict(options),
                                    workers=[self.address], allow_other_workers=False, pure=False)
        try:
            while True:  # a task pinned to a worker that died would wait for it for ever
                try:
                    data = future.result(timeout=WORKER_CHECK_SECONDS)
                    break
                except TimeoutError:
                    if self.address not in self.client.scheduler_info(n_workers=-1).get("workers", {}):
                        future.cancel()
                        self.lost = "the worker left the cluster mid-profile"
                        return None
        except (KilledWorker, CommClosedError, CancelledError, OSError) as exc:
            self.lost = f"{type(exc).__name__}: {exc}".splitlines()[0]
            return None
        return Measurement.from_dict(data)

    def close(self) -> None:
        """Stop the profiling servers of the cluster's workers (:func:`close_cluster_profilers`:
        the plug-in is the cluster's, so closing one profiler closes all; the rest then do
        nothing): they hold memory on the workers' machines that the probes and runs need."""
        close_cluster_profilers(self.client)


def cluster_profilers(client, operator, sessions: int, jobs: int | None = None) -> list[WorkerProfiler]:
    """Register :class:`ProfilingPlugin` (and the operator the workers cannot find by name,
    ``explorer.measure.workersetup.send_operators``) and return one :class:`WorkerProfiler`
    per worker, at most ``jobs`` of them (all the workers when None).  Raises ValueError (one
    line) when a worker cannot find the operator.  :func:`close_cluster_profilers` stops the
    workers' profiling servers."""
    import operators
    from explorer.core.environment import environment_stamp
    from explorer.measure.workersetup import send_operators

    addresses = sorted(client.scheduler_info(n_workers=-1).get("workers", {}))
    if not addresses:
        raise ValueError("the cluster has no workers to profile on")
    name = operators.get(operator).name
    send_operators(client, operator)
    for address, error in sorted(client.run(_operator_error_here, name).items()):
        if error:
            raise ValueError(f"worker {address} cannot profile {name}: {error} (install its package on the "
                             "workers, or set $EXPLORER_PLUGINS there)")
    stamps = client.run(environment_stamp, name)
    client.register_plugin(ProfilingPlugin(sessions), name=PLUGIN_NAME)
    return [WorkerProfiler(client, a, stamps.get(a)) for a in addresses[:jobs or len(addresses)]]


def close_cluster_profilers(client) -> None:
    """Stop the profiling servers :class:`ProfilingPlugin` started in ``client``'s workers (the
    plug-in's ``teardown``): they hold memory on the workers' machines that a run may need."""
    try:
        client.unregister_worker_plugin(PLUGIN_NAME)
    except Exception:  # noqa: BLE001 - the cluster or its workers gone: their servers went with them
        pass


def workers_memory_cap(client) -> int:
    """The smallest default memory cap (``profiling.default_memory_cap``) of ``client``'s
    workers' machines: a profile's child may take no more on any of them."""
    caps = client.run(default_memory_cap)
    if not caps:
        raise ValueError("the cluster has no workers to profile on")
    return int(min(caps.values()))


def workers_environment(client, operator: str) -> dict | None:
    """The environment stamp (``explorer.core.environment.environment_stamp``) of one of
    ``client``'s workers for ``operator`` (the first by address; the operator sent to them
    first, ``send_operators``), or None when none can say (no workers, or the operator not
    found there: :func:`cluster_profilers` says why)."""
    from explorer.core.environment import environment_stamp
    from explorer.measure.workersetup import send_operators

    send_operators(client, operator)
    try:
        stamps = client.run(environment_stamp, operator)
    except Exception:  # noqa: BLE001 - said, in one line, by cluster_profilers
        return None
    return stamps[min(stamps)] if stamps else None


def workers_memory_limit(client) -> int | None:
    """The smallest memory limit of ``client``'s workers in bytes (what the chunks will be sized
    for), or None when none has one."""
    limits = [int(w.get("memory_limit") or 0) for w in client.scheduler_info(n_workers=-1).get("workers", {}).values()]
    limits = [m for m in limits if m > 0]
    return min(limits) if limits else None
