"""What runs inside Dask workers: warm-up and baseline, the measured run, the observation plugin.

Imported on the workers (by unpickling :func:`measured_run`, :class:`ObservationPlugin`
or :func:`warm_worker`) and by the client side that sends them (``explorer.runner.live``,
``explorer.runner.daskrun``); never by the core, which stays free of distributed.

Baseline (:func:`warm_worker`, run on every worker with ``client.run`` before planning)
    imports what a run of the operator needs (the operator's module, its lazy imports by
    running it on a tiny block, segyio, zarr, dask.array), collects garbage, and reports
    the worker process's resident set: ``baseline_bytes`` of the worker footprint
    (``explorer.plan.footprint.worker_footprint``), measured on the workers that do the work.
    No task pays a first-use import afterwards.

Task peaks (definitions in ``docs/definitions.md``), with the kernel high-water method of
:mod:`explorer.measure.highwater` in the worker process:

* ``peak_bytes``: the highest resident set size of the worker process while the *task*
  executes, minus its resident set size when the task starts executing, with the task's
  inputs already resident.  The task is what Dask runs: the task that calls
  ``operator.run`` also reads its block before it (``operators.windowed_map``; from a Dask
  array, ``map_overlap``'s task concatenates the overlap pieces instead) and, with
  blockwise fusion (dask 2026.8), trims and stores after it.  This is the in-worker task peak that
  ``explorer.plan.calibration`` models and ``worker_footprint`` counts per thread.
* ``run_peak_bytes``: the same around ``operator.run(block)`` only (the isolated
  definition, in a worker), measured by :func:`measured_run`.
* ``shape``: the block ``operator.run`` received (chunk plus halos).

The operator's Dask form applies :func:`measured_run` around ``run`` when it is given it
(``operator.dask(x, wrap=measured_run)``): the hook is part of the graph, not a patch of
the operator class inside workers.  A task is an operator task when ``measured_run`` left
a note under its key (``distributed.worker.thread_state.key``); key names are not used
(fusion renames them).

High-water segments: writing to ``/proc/self/clear_refs`` resets the one process-wide
``VmHWM``.  Before every reset the current ``VmHWM`` is folded into every measurement
still open, so each measurement is the exact process maximum over its own interval,
however many begin or end inside it.  With one thread per worker a task runs alone in
its process, so its figure is exact (``exact=True``).  With ``T > 1`` threads, tasks
overlap and a figure is the process's growth during the task, which mixes the
concurrent tasks' allocations into it; such observations carry ``exact=False``.

Order (the cold first task): each report says where the task stood among this operator's tasks
on its worker: ``task_index``, the operator tasks of this run (this plugin's registration)
the worker had finished when the task started, and ``first_in_run``, whether that was none
(the worker's first task of the run; with ``T`` threads, the first ``T`` start before any
finishes and all are first); ``process_task_index`` counts the same over the worker process's
life, across runs.  A worker's first task of a run finds none of the run's freed memory in the
process to reuse and peaked highest on each worker of the first-run trials (issue 33):
``explorer.plan.calibration`` estimates that offset from groups holding both kinds.

Clocks: each operator task reports its own seconds, the seconds inside ``run``, the seconds
before its first ``run`` (``read_seconds``: a windowed task reads its block then), and the
seconds and count of the worker's other tasks (reads, overlap slices) since its previous
report; a task's seconds are its compute as the worker records it (``startstops``, without the
event loop's latency), so ``explorer.plan.calibration`` can learn a run's time per voxel.
"""

from __future__ import annotations

import gc
import math
import os
import threading
import time
import uuid

import numpy as np
from distributed.diagnostics.plugin import WorkerPlugin

from explorer.measure.highwater import is_supported, read_status, reset_high_water_mark

__all__ = ["ObservationPlugin", "first_touch_seconds", "measured_run", "reset_worker_high_water", "resident_bytes",
           "warm_worker", "worker_high_water_bytes"]


class _Interval:
    __slots__ = ("owner", "rss_before", "high", "overlapped", "started")

    def __init__(self, owner, rss_before: int):
        self.owner = owner
        self.rss_before = rss_before
        self.high = rss_before
        self.overlapped = False
        self.started = time.perf_counter()


class _HighWater:
    """Open measurements over the process's one kernel high-water mark (thread-safe).

    ``begin`` folds the current ``VmHWM`` into every open interval, then resets it;
    ``end`` returns ``(peak_bytes, rss_before, process_peak, exact, seconds)`` with
    ``peak_bytes = max VmHWM over the interval - RSS at begin``.  ``lifetime_peak`` keeps
    the largest ``VmHWM`` ever folded, so resets do not lose the process's own peak.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._open: dict = {}
        self.lifetime_peak = 0

    def begin(self, token, owner) -> None:
        with self._lock:
            high = read_status()["VmHWM"]
            self.lifetime_peak = max(self.lifetime_peak, high)
            others = False
            for iv in self._open.values():
                iv.high = max(iv.high, high)
                if iv.owner != owner:
                    iv.overlapped = True
                    others = True
            interval = _Interval(owner, reset_high_water_mark())
            interval.overlapped = others
            self._open[token] = interval

    def end(self, token):
        with self._lock:
            interval = self._open.pop(token, None)
            if interval is None:
                return None
            high = read_status()["VmHWM"]
            self.lifetime_peak = max(self.lifetime_peak, high)
            process_peak = max(interval.high, high)
            return (process_peak - interval.rss_before, interval.rss_before, process_peak,
                    not interval.overlapped, time.perf_counter() - interval.started)


_HIGH_WATER = _HighWater()

#: Per operator name: its tasks this worker process has reported, over every run (``process_task_index``).
_PROCESS_TASKS: dict = {}

#: Per task key: the measured ``run`` calls in that task, as
#: ``(operator, shape, run_peak_bytes, exact, run_seconds)``.
_RUNS: dict = {}
_RUNS_LOCK = threading.Lock()


def worker_high_water_bytes() -> int:
    """This process's peak resident set size in bytes since :func:`reset_worker_high_water`
    (or its start): ``VmHWM``, or the largest value it had before an observation reset it
    (run it on workers with ``client.run``)."""
    return max(_HIGH_WATER.lifetime_peak, read_status()["VmHWM"])


def reset_worker_high_water() -> int:
    """Start a new high-water period: a run on a long-lived worker reports its own peak, not
    the worker's peak of all time (earlier runs, other users' work).  Tasks being measured
    keep their own peaks.  Returns the resident set at the reset."""
    with _HIGH_WATER._lock:
        high = read_status()["VmHWM"]
        for interval in _HIGH_WATER._open.values():
            interval.high = max(interval.high, high)
        _HIGH_WATER.lifetime_peak = 0
        return reset_high_water_mark() if is_supported() else int(read_status()["VmRSS"])


def resident_bytes() -> int:
    """This process's resident set size in bytes (after a garbage collection)."""
    gc.collect()
    return int(read_status()["VmRSS"])


#: :func:`first_touch_seconds` touches memory in segments of this many bytes, at most
#: :data:`FIRST_TOUCH_MAX_BYTES` in all (and at most a quarter of the worker's memory limit).
FIRST_TOUCH_SEGMENT_BYTES = 16 << 20
FIRST_TOUCH_MAX_BYTES = 512 << 20
#: A segment that took this many times a warm one is on pages the host has to back
#: (:func:`first_touch_seconds`); two in a row end the measurement.
COLD_SEGMENT_FACTOR = 4.0
#: The segments never take a worker past this share of its memory limit (Dask pauses it at 80%).
FIRST_TOUCH_LIMIT_SHARE = 0.6
_PAGE_BYTES = 4096


def _touch(nbytes: int):
    """``(seconds, array)``: map ``nbytes`` and write one byte per page (the pages' cost, not
    the writing's)."""
    started = time.perf_counter()
    pages = np.empty(nbytes, dtype=np.uint8)
    pages[::_PAGE_BYTES] = 1
    return time.perf_counter() - started, pages


def first_touch_seconds(max_bytes: int = FIRST_TOUCH_MAX_BYTES, segment_bytes: int = FIRST_TOUCH_SEGMENT_BYTES, *,
                        dask_worker=None) -> dict:
    """What this process pays to touch memory, segment by segment, until it reaches pages the
    machine has not used lately (run it on workers with ``client.run``): ``{"segment_bytes",
    "warm", "segments", "cold", "touched_bytes"}``: the seconds of a segment touched just after it
    was freed (``warm``), of each segment touched in turn (all held until the end), whether the
    last two were cold, and all the bytes touched (warm once freed).

    An array larger than the mmap threshold is a fresh mapping, whose pages the kernel zeroes
    on their first touch.  On a virtual machine whose balloon reports free pages to its host
    (this one: ``virtio_balloon``), free memory the guest has reported is no longer backed, and
    touching it costs what backing it does: about 2 ms per MiB here, against 0.06-0.1 ms for
    pages freed moments before, which the guest hands out first and reports only bit by bit
    (after a process freed 600 MiB, the next one's first 416 MiB were warm).  Segments are
    touched until two in a row take :data:`COLD_SEGMENT_FACTOR` times ``warm``, or ``max_bytes``
    are held (a quarter of the worker's memory limit at most, and never past
    :data:`FIRST_TOUCH_LIMIT_SHARE` of it: none at all for a worker already near it).  The slow
    ones time the pages a run's first tasks pay for; the count before them is the warm memory
    there was to share.  All of it is freed at the end, and so warm for what runs next.  Where a
    first touch costs a page fault on bare metal, no segment is cold.
    """
    segment_bytes = int(segment_bytes)
    if dask_worker is not None and getattr(dask_worker, "memory_manager", None) is not None \
            and dask_worker.memory_manager.memory_limit:
        limit = int(dask_worker.memory_manager.memory_limit)
        room = int(FIRST_TOUCH_LIMIT_SHARE * limit) - int(read_status()["VmRSS"])  # never near its pause
        max_bytes = min(int(max_bytes), limit // 4, room)
        if max_bytes < 3 * segment_bytes:
            return {"segment_bytes": segment_bytes, "warm": 0.0, "segments": [], "cold": False, "touched_bytes": 0}
    _touch(segment_bytes)
    warm, pages = _touch(segment_bytes)  # the pages just freed: warm whatever the machine
    held, seconds, cold = [pages], [], False
    while not cold and len(seconds) < max(2, int(max_bytes) // segment_bytes - 1):
        took, pages = _touch(segment_bytes)
        held.append(pages)
        seconds.append(took)
        cold = len(seconds) >= 2 and min(seconds[-2:]) > COLD_SEGMENT_FACTOR * warm
    del held, pages
    return {"segment_bytes": segment_bytes, "warm": warm, "segments": seconds, "cold": cold,
            "touched_bytes": (1 + len(seconds)) * segment_bytes}


def measured_run(run, block):
    """``run(block)``, measured: the hook an operator's Dask form applies when observed.

    Inside a Dask task with a supported kernel, notes the block's shape and the peak of
    the ``run`` call (``run_peak_bytes``) under the task's key for
    :class:`ObservationPlugin`; anywhere else it is just ``run(block)``.
    """
    from distributed.metrics import time as task_clock
    from distributed.worker import thread_state

    key = getattr(thread_state, "key", None)
    if key is None or not is_supported():
        return run(block)
    operator = getattr(getattr(run, "__self__", None), "name", None)
    token = object()
    task_started = getattr(thread_state, "start_time", None)  # set by the worker as the task starts
    before_run = None if task_started is None else max(0.0, task_clock() - float(task_started))
    _HIGH_WATER.begin(token, key)
    try:
        return run(block)
    finally:
        measured = _HIGH_WATER.end(token)
        if measured is not None:
            note = (operator, [int(n) for n in np.shape(block)], measured[0], measured[3], measured[4], before_run)
            with _RUNS_LOCK:
                _RUNS.setdefault(key, []).append(note)


def warm_worker(operator: str, readable: tuple[str, ...] = (), writable: tuple[str, ...] = (), *,
                dask_worker=None) -> dict:
    """Load and warm ``operator`` in this worker; report its resident set and environment.

    Returns ``{"rss_bytes", "environment", "threads", "paused", "pid"}`` (``paused``: the
    worker is paused, or its resident set is at its pause threshold already), or ``{"error": line}`` when
    the operator cannot be loaded here (a plugin module missing on the worker, say) or a
    path in ``readable`` cannot be read / a directory in ``writable`` cannot be written
    from this worker.  Run with ``client.run`` on every worker before planning (which
    passes the worker as ``dask_worker``).
    """
    try:
        import dask.array  # noqa: F401
        import segyio  # noqa: F401
        import zarr  # noqa: F401

        import operators
        from explorer.core.environment import environment_stamp
        from operators.plugins import load_plugins

        load_plugins()
        op = operators.get(operator)
        op.run(np.zeros((8, 8, 8), dtype=np.float32))
    except Exception as exc:
        text = " ".join(str(exc).split())
        return {"error": f"cannot load operator {operator!r}: {type(exc).__name__}: {text}"[:300]}
    for path in readable:
        if not os.access(path, os.R_OK):
            return {"error": f"cannot read {path}"}
    for path in writable:
        if not (os.path.isdir(path) and os.access(path, os.W_OK)):
            return {"error": f"cannot write into {path}"}
    gc.collect()
    rss = int(read_status()["VmRSS"])
    threads, paused = None, False
    if dask_worker is not None:
        threads = int(dask_worker.state.nthreads)
        memory = dask_worker.memory_manager
        pause = memory.memory_pause_fraction
        paused = dask_worker.status.name == "paused" or bool(memory.memory_limit and pause
                                                              and rss >= pause * memory.memory_limit)
    return {"rss_bytes": rss, "environment": environment_stamp(op), "threads": threads, "paused": paused,
            "pid": os.getpid()}


class ObservationPlugin(WorkerPlugin):
    """A worker plugin reporting, for each task of ``operator``, its block shape and peak.

    Each report is ``worker.log_event(topic, msg)`` with ``msg`` a dict: ``operator``,
    ``shape`` (the block ``run`` saw), ``peak_bytes`` (task), ``run_peak_bytes``,
    ``seconds``, ``run_seconds``, ``read_seconds``, ``other_seconds``, ``other_tasks``, ``exact``,
    ``n_runs``, ``rss_before_bytes``, ``process_peak_bytes``, ``worker``, ``threads``,
    ``memory_limit``, ``environment`` (digest), ``key``, ``id``, and the task's order on its
    worker (module docstring): ``first_in_run``, ``task_index``, ``process_task_index``.
    """

    idempotent = False

    def __init__(self, operator: str, topic: str, name: str):
        self.operator = operator
        self.topic = topic
        self.name = name
        self.worker = None

    def setup(self, worker):
        from explorer.core.environment import environment_digest
        from explorer.core.environment import environment_stamp
        from operators.plugins import load_plugins

        self.worker = worker
        self.supported = is_supported()
        if not self.supported:
            worker.log_event(self.topic, {"unsupported": True, "worker": worker.address})
            return
        load_plugins()
        self._threads = int(worker.state.nthreads)
        self._limit = int(getattr(worker.memory_manager, "memory_limit", None) or 0)
        self._environment = environment_digest(environment_stamp(self.operator))
        self._lock = threading.Lock()
        self._other_seconds = 0.0
        self._other_tasks = 0
        self._managed = {}
        self._reported = 0  # this run's operator tasks reported by this worker
        self._order = {}  # per executing key: (reported, process-wide reported) when it started

    def _managed_bytes(self) -> int:
        """Bytes of task data this worker holds (``WorkerState.nbytes``: its managed memory)
        plus the bytes of dependencies in flight to it."""
        state = self.worker.state
        return int(state.nbytes) + int(getattr(state, "transfer_incoming_bytes", 0) or 0)

    def _compute_seconds(self, key, measured: float) -> float:
        """The task's compute seconds as its worker recorded them (the last ``compute`` of its
        ``startstops``, which distributed keeps free of the thread pool's and the event loop's
        latency), else ``measured`` (this plugin's interval, from the transition to executing
        to the one out of it).  The interval also holds the event loop's latency, about a
        millisecond a task when this was measured here, which on the ~10 overlap slices around a
        small operator task made most of what a probe charged it for them."""
        ts = self.worker.state.tasks.get(key)
        for step in reversed(getattr(ts, "startstops", None) or ()):
            if step.get("action") == "compute":
                return float(step["stop"] - step["start"])
        return measured

    def transition(self, key, start, finish, *args, **kwargs):
        if not self.supported:
            return
        if finish == "executing":
            _HIGH_WATER.begin((self.name, key), key)
            with self._lock:
                self._managed[key] = self._managed_bytes()
                self._order[key] = (self._reported, _PROCESS_TASKS.get(self.operator, 0))
            return
        if start not in ("executing", "long-running") or finish == "long-running":
            return
        measured = _HIGH_WATER.end((self.name, key))
        managed_after = self._managed_bytes()
        with self._lock:
            managed_before = self._managed.pop(key, None)
            order = self._order.pop(key, None)
        with _RUNS_LOCK:
            notes = _RUNS.get(key)
            mine = [n for n in notes if n[0] == self.operator] if notes else []
            if notes is not None and len(mine) == len(notes):
                del _RUNS[key]
            elif mine:
                _RUNS[key] = [n for n in notes if n[0] != self.operator]
        if measured is None:
            return
        peak, rss_before, process_peak, exact, seconds = measured
        seconds = self._compute_seconds(key, seconds)
        if not mine:
            with self._lock:
                self._other_seconds += seconds
                self._other_tasks += 1
            return
        if finish != "memory":
            return
        with self._lock:
            other_seconds, other_tasks = self._other_seconds, self._other_tasks
            self._other_seconds, self._other_tasks = 0.0, 0
            self._reported += 1
            _PROCESS_TASKS[self.operator] = _PROCESS_TASKS.get(self.operator, 0) + 1
        task_index, process_index = order if order is not None else (None, None)
        largest = max(mine, key=lambda n: math.prod(n[1]))
        self.worker.log_event(self.topic, {
            "id": uuid.uuid4().hex,
            "operator": self.operator,
            "shape": largest[1],
            "peak_bytes": int(peak),
            "run_peak_bytes": int(largest[2]),
            "seconds": float(seconds),
            "run_seconds": float(sum(n[4] for n in mine)),
            "read_seconds": mine[0][5],
            "other_seconds": float(other_seconds),
            "other_tasks": int(other_tasks),
            "exact": bool(exact and largest[3] and len(mine) == 1),
            "n_runs": len(mine),
            "rss_before_bytes": int(rss_before),
            "process_peak_bytes": int(process_peak),
            "worker": self.worker.address,
            "threads": self._threads,
            "memory_limit": self._limit,
            "environment": self._environment,
            "key": str(key),
            "chunk_index": chunk_index(key),
            "managed_before_bytes": None if managed_before is None else int(managed_before),
            "managed_after_bytes": int(managed_after),
            "first_in_run": None if task_index is None else task_index == 0,
            "task_index": task_index,
            "process_task_index": process_index,
        })


def chunk_index(key) -> list[int] | None:
    """The chunk's position in its array's grid, from a Dask array task's key ``(name, i, j, k)``;
    None for any other key."""
    if isinstance(key, tuple) and len(key) > 1 and all(isinstance(i, int) for i in key[1:]):
        return [int(i) for i in key[1:]]
    return None


def dask_setup(worker) -> None:
    """Preload hook (``preload=["explorer.measure.inworker"]``) of the workers of a ``LocalCluster``
    that ``explorer.runner.daskrun`` starts: they ignore SIGINT.  A Ctrl-C in the terminal reaches
    the whole process group; the run's own process handles it (cancels, removes the
    partial output, closes the cluster, which stops its workers) instead of every worker
    printing a ``KeyboardInterrupt`` traceback of its event loop."""
    import signal

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
