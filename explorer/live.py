"""Live observation of an operator's Dask tasks, and the production calibration learnt from it.

Inside a Dask worker, every task of the observed operator reports the block its
``operator.run`` saw and the memory the task took; the client stores each report at
once in the operator's study (``source="production"``) and compares it with the
model's upper bound.  From the stored reports, :func:`calibration` learns how in-worker
task peaks relate to isolated profiles, and saves it where ``recommend_chunks`` can
apply it without opening the store (:func:`load_calibration`).

::

    with observe(client, "gst3d", model=model) as observer:   # any Dask code
        da.to_zarr(operators.get("gst3d").dask(x), "out.zarr")
    observer.recorded, observer.tasks_over_bound

What is measured, and how (worker side)
---------------------------------------
With the kernel high-water method of :mod:`explorer.highwater`, in the worker process:

* ``peak_bytes`` (the stored value): the highest resident set size of the worker
  process while the *task* executes, minus its resident set size when the task starts
  executing, with the task's inputs already resident.  The task is what Dask runs: with
  blockwise and low-level fusion (dask 2026.8) the task that calls ``operator.run`` also
  concatenates the overlap pieces before it and trims, and stores to zarr, after it (its
  key is e.g. ``('overlap-store-map-<token>', i, j, k)``).  This is the memory the
  worker must find for one running task: the ``task_peak_bytes`` term of
  ``explorer.chunking.worker_footprint``.
* ``run_peak_bytes`` (in the context): the same, around ``operator.run(block)`` only,
  with the block resident: the definition of the isolated profiles, now in a worker.
* ``shape``: ``block.shape`` of the block ``operator.run`` received (chunk plus halos).

High-water segments: writing to ``/proc/self/clear_refs`` resets the one process-wide
``VmHWM``.  Before every reset the current ``VmHWM`` is folded into every measurement
still open, so each measurement is the exact process maximum over its own interval,
however many begin or end inside it.

With one thread per worker, a task runs alone in its process, so its figure is exact
(``exact=True`` in the context).  With ``T > 1`` threads, tasks overlap: a figure is
then the process's growth during the task, which mixes the concurrent tasks'
allocations and releases into it (neither an upper nor a lower bound of the task's own
peak); such observations are stored with ``exact=False`` and :func:`calibration`
leaves them out.

How tasks are recognised
------------------------
Not by key name: fusion names the task that calls ``run`` after other layers fused
with it.  Measured with dask/distributed 2026.8: ``overlap-<token>`` for a
``map_overlap`` operator computed to NumPy, ``overlap-store-map-<token>`` stored to
zarr, ``store-map-<token>`` for a halo-free operator stored to zarr, and a single chunk
fuses the SEG-Y read in too (``getitem-original-read-segy-...-store-map-<token>``).
``key_split(key)`` is never the operator's name on these paths, whatever name its own
layer is given.  Instead the
plugin wraps the operator class's ``run`` in the worker process (restored on teardown):
the wrapper notes ``block.shape`` under ``distributed.worker.thread_state.key``, the key
of the task running in that thread, and a task whose key has such a note when it leaves
``executing`` is an operator task.  Tasks must therefore be deserialised after the
plugin is registered (true of any graph submitted inside :func:`observe`).

Cost: on the worker, about 0.1 ms per task (reads of ``/proc/self/status`` and writes
to ``clear_refs`` at task start, ``run`` start, ``run`` end and task end) and one small
event to the scheduler per operator task.  On the client, about 15-20 ms of CPU per
observation to store it (Optuna over SQLite), in one writer thread at the lowest CPU
priority so that it does not take cores from the workers (``WRITER_NICE``).  Should the
client process itself be killed, observations still queued for that thread are lost;
every one that reached the client is stored when the computation merely fails.
"""

from __future__ import annotations

import functools
import math
import os
import queue
import threading
import time
import uuid
import warnings
from dataclasses import dataclass, field

import numpy as np

from explorer.calibration import (  # noqa: F401  (part of this module's surface)
    Calibration, calibrated_model, calibration, calibration_path, load_calibration)
from explorer.highwater import is_supported, read_status, reset_high_water_mark

__all__ = [
    "Calibration",
    "Observation",
    "ObservationPlugin",
    "Observer",
    "calibrated_model",
    "calibration",
    "calibration_path",
    "load_calibration",
    "observe",
    "worker_high_water_bytes",
]

#: Prefix of the event topic on which workers send observations.
TOPIC_PREFIX = "memory-explorer-observations"
#: Tasks over the bound warned about one by one; later ones are only counted.
MAX_OVER_BOUND_WARNINGS = 5
#: CPU niceness of the thread that writes observations to the store (see ``_lower_this_threads_priority``).
WRITER_NICE = 19


# =========================================================================== worker side


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

    def discard(self, token) -> None:
        with self._lock:
            self._open.pop(token, None)


_HIGH_WATER = _HighWater()

#: Per task key: the ``run`` calls of observed operators in that task, as
#: ``(operator, shape, run_peak_bytes, exact, run_seconds)``.
_RUNS: dict = {}
_RUNS_LOCK = threading.Lock()
#: Installed ``run`` wrappers: class -> [users, original attribute or None].
_HOOKS: dict = {}
_HOOKS_LOCK = threading.Lock()


def worker_high_water_bytes() -> int:
    """This process's peak resident set size in bytes: ``VmHWM``, or the largest value it
    had before an observation reset it (run it on workers with ``client.run``)."""
    return max(_HIGH_WATER.lifetime_peak, read_status()["VmHWM"])


def _install_run_hook(cls, operator: str) -> None:
    with _HOOKS_LOCK:
        if cls in _HOOKS:
            _HOOKS[cls][0] += 1
            return
        own = cls.__dict__.get("run")
        original = cls.run

        @functools.wraps(original)
        def run(self, block):
            from distributed.worker import thread_state

            key = getattr(thread_state, "key", None)
            if key is None:  # not inside a Dask task
                return original(self, block)
            token = object()
            _HIGH_WATER.begin(token, key)
            try:
                return original(self, block)
            finally:
                measured = _HIGH_WATER.end(token)
                if measured is not None:
                    note = (operator, [int(n) for n in np.shape(block)], measured[0], measured[3], measured[4])
                    with _RUNS_LOCK:
                        _RUNS.setdefault(key, []).append(note)

        run.__explorer_observed__ = True
        cls.run = run
        _HOOKS[cls] = [1, own]


def _remove_run_hook(cls) -> None:
    with _HOOKS_LOCK:
        entry = _HOOKS.get(cls)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] > 0:
            return
        del _HOOKS[cls]
        if entry[1] is None:
            del cls.run
        else:
            cls.run = entry[1]


def _plugin_class():
    """``ObservationPlugin``, built on first use so that importing this module (for
    :func:`load_calibration` on the ``recommend_chunks`` path) does not import distributed."""
    from distributed.diagnostics.plugin import WorkerPlugin

    class ObservationPlugin(WorkerPlugin):
        """A worker plugin reporting, for each task of ``operator``, its block shape and peak.

        Each report is ``worker.log_event(topic, msg)`` with ``msg`` a dict: ``operator``,
        ``shape`` (the block ``run`` saw), ``peak_bytes`` (task), ``run_peak_bytes``,
        ``seconds``, ``run_seconds``, ``exact``, ``n_runs``, ``rss_before_bytes``,
        ``process_peak_bytes``, ``worker``, ``threads``, ``memory_limit``, ``key``, ``id``.
        """

        idempotent = False

        def __init__(self, operator: str, topic: str, name: str):
            self.operator = operator
            self.topic = topic
            self.name = name
            self.worker = None

        def setup(self, worker):
            import operators
            from explorer.plugins import load_plugins

            self.worker = worker
            self.supported = is_supported()
            if not self.supported:
                worker.log_event(self.topic, {"unsupported": True, "worker": worker.address})
                return
            load_plugins()
            self._cls = type(operators.get(self.operator))
            self._threads = int(worker.state.nthreads)
            self._limit = int(getattr(worker.memory_manager, "memory_limit", None) or 0)
            _install_run_hook(self._cls, self.operator)

        def teardown(self, worker):
            if getattr(self, "supported", False):
                _remove_run_hook(self._cls)

        def transition(self, key, start, finish, *args, **kwargs):
            if not self.supported:
                return
            if finish == "executing":
                _HIGH_WATER.begin((self.name, key), key)
            elif start in ("executing", "long-running") and finish != "long-running":
                measured = _HIGH_WATER.end((self.name, key))
                with _RUNS_LOCK:
                    notes = _RUNS.get(key)
                    mine = [n for n in notes if n[0] == self.operator] if notes else []
                    if notes is not None and len(mine) == len(notes):
                        del _RUNS[key]
                    elif mine:
                        _RUNS[key] = [n for n in notes if n[0] != self.operator]
                if finish != "memory" or measured is None or not mine:
                    return
                peak, rss_before, process_peak, exact, seconds = measured
                largest = max(mine, key=lambda n: math.prod(n[1]))
                self.worker.log_event(self.topic, {
                    "id": uuid.uuid4().hex,
                    "operator": self.operator,
                    "shape": largest[1],
                    "peak_bytes": int(peak),
                    "run_peak_bytes": int(largest[2]),
                    "seconds": float(seconds),
                    "run_seconds": float(largest[4]),
                    "exact": bool(exact and largest[3] and len(mine) == 1),
                    "n_runs": len(mine),
                    "rss_before_bytes": int(rss_before),
                    "process_peak_bytes": int(process_peak),
                    "worker": self.worker.address,
                    "threads": self._threads,
                    "memory_limit": self._limit,
                    "key": str(key),
                })

    ObservationPlugin.__module__ = __name__
    ObservationPlugin.__qualname__ = "ObservationPlugin"
    return ObservationPlugin


def __getattr__(name):  # PEP 562: pickles of the plugin find its class here
    if name == "ObservationPlugin":
        cls = _plugin_class()
        globals()["ObservationPlugin"] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# =========================================================================== client side


@dataclass
class Observation:
    """One operator task as the worker measured it (see the module docstring)."""

    operator: str
    shape: tuple[int, int, int]
    peak_bytes: int
    run_peak_bytes: int
    seconds: float
    exact: bool
    worker: str
    threads: int
    memory_limit: int
    key: str
    upper_bytes: float | None = None
    over_bound: bool = False
    extra: dict = field(default_factory=dict)


class Observer:
    """The client side of :func:`observe`: receives, stores and checks observations.

    ``observations`` (all received), ``recorded`` (persisted), ``tasks_over_bound``,
    ``over_bound`` (those observations), ``warnings`` (one line each), ``errors``
    (storage errors, one line each).  ``on_over_bound(observation)`` is called from the
    writer thread for each task over the bound.
    """

    def __init__(self, client, operator: str, *, store=None, runs_dir=None, storage=None, model=None,
                 confidence: float = 0.99, context: dict | None = None, on_over_bound=None,
                 warn: bool = True):
        self.client = client
        self.operator = operator
        self.model = model
        self.confidence = float(confidence)
        self.context = {"cluster": _cluster_kind(client), **(context or {})}
        self.on_over_bound = on_over_bound
        self.warn = warn
        self.topic = f"{TOPIC_PREFIX}-{operator}-{uuid.uuid4().hex[:12]}"
        self.plugin_name = f"memory-explorer-observe-{self.topic[len(TOPIC_PREFIX) + 1:]}"
        self.observations: list[Observation] = []
        self.over_bound: list[Observation] = []
        self.warnings: list[str] = []
        self.errors: list[str] = []
        self.recorded = 0
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue()
        self._store = store
        self._store_args = (runs_dir, storage)
        self._writer: threading.Thread | None = None
        self._stored = threading.Condition()
        self._unsupported_warned = False

    @property
    def tasks_over_bound(self) -> int:
        return len(self.over_bound)

    # ---- lifecycle ------------------------------------------------------------------
    def start(self) -> "Observer":
        self._writer = threading.Thread(target=self._write_loop, name="explorer-observation-writer", daemon=True)
        self._writer.start()
        self.client.subscribe_topic(self.topic, self._on_event)
        plugin = _plugin_class_cached()(self.operator, self.topic, self.plugin_name)
        self.client.register_plugin(plugin, name=self.plugin_name)
        return self

    def close(self, *, expected: int | None = None, timeout: float = 5.0) -> None:
        """Stop observing: wait for ``expected`` observations (at most ``timeout`` s),
        pick up any the subscription missed from the scheduler's event log, unregister
        the plugin, and wait until every received observation is stored."""
        deadline = time.monotonic() + timeout
        if expected is not None:
            while len(self.observations) < expected and time.monotonic() < deadline:
                time.sleep(0.02)
        try:
            for event in self.client.get_events(self.topic):
                self._on_event(event)
        except Exception:  # the cluster may be gone (a failed run): keep what arrived
            pass
        for undo in (lambda: self.client.unregister_worker_plugin(self.plugin_name),
                     lambda: self.client.unsubscribe_topic(self.topic)):
            try:
                undo()
            except Exception:
                pass
        self._queue.put(None)
        if self._writer is not None:
            self._writer.join()

    def flush(self, timeout: float = 30.0) -> None:
        """Block until every observation received so far is stored (or failed to be)."""
        deadline = time.monotonic() + timeout
        with self._stored:
            while self.recorded + len(self.errors) < len(self.observations) and time.monotonic() < deadline:
                self._stored.wait(0.05)

    def __enter__(self) -> "Observer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- events (client event loop thread: keep it short) ------------------------------
    def _on_event(self, event) -> None:
        _timestamp, msg = event
        if not isinstance(msg, dict):
            return
        if msg.get("unsupported"):
            if not self._unsupported_warned:
                self._unsupported_warned = True
                self._warn(f"worker {msg.get('worker')}: no /proc/self/clear_refs; its tasks are not observed")
            return
        with self._lock:
            if msg["id"] in self._seen:
                return
            self._seen.add(msg["id"])
            observation = Observation(
                operator=msg["operator"], shape=tuple(int(n) for n in msg["shape"]),
                peak_bytes=int(msg["peak_bytes"]), run_peak_bytes=int(msg["run_peak_bytes"]),
                seconds=float(msg["seconds"]), exact=bool(msg["exact"]), worker=str(msg["worker"]),
                threads=int(msg["threads"]), memory_limit=int(msg["memory_limit"]), key=str(msg["key"]),
                extra={k: msg[k] for k in ("run_seconds", "n_runs", "rss_before_bytes", "process_peak_bytes")},
            )
            self.observations.append(observation)
        self._queue.put(observation)

    def _warn(self, line: str) -> None:
        self.warnings.append(line)
        if self.warn:
            warnings.warn(line, RuntimeWarning, stacklevel=2)

    # ---- the writer thread -------------------------------------------------------------
    def _write_loop(self) -> None:
        _lower_this_threads_priority()
        store = self._store
        while True:
            observation = self._queue.get()
            if observation is None:
                return
            try:
                self._check(observation)
            except Exception as exc:  # a broken model must not lose the observation
                self.warnings.append(f"bound check failed: {type(exc).__name__}: {exc}")
            try:
                if store is None:
                    from explorer.store import Store

                    store = self._store = Store(*self._store_args)
                store.add_observation(self.operator, observation.shape, observation.peak_bytes,
                                      source="production", context=self._context(observation))
                with self._stored:
                    self.recorded += 1
                    self._stored.notify_all()
            except Exception as exc:
                with self._stored:
                    self.errors.append(f"observation not stored: {type(exc).__name__}: {exc}")
                    self._stored.notify_all()

    def _context(self, o: Observation) -> dict:
        return {
            **self.context,
            "threads_per_worker": o.threads,
            "memory_limit_bytes": o.memory_limit,
            "worker": o.worker,
            "exact": o.exact,
            "run_peak_bytes": o.run_peak_bytes,
            "task_seconds": round(o.seconds, 6),
            "key": o.key,
            "upper_bytes": o.upper_bytes,
            "confidence": self.confidence if o.upper_bytes is not None else None,
            **o.extra,
        }

    def _check(self, o: Observation) -> None:
        if self.model is None:
            return
        _mean, upper = self.model.predict(o.shape, self.confidence)
        o.upper_bytes = float(upper)
        if o.peak_bytes > upper:
            o.over_bound = True
            self.over_bound.append(o)
            if len(self.over_bound) > MAX_OVER_BOUND_WARNINGS:
                if self.on_over_bound is not None:
                    self.on_over_bound(o)
                return
            self._warn(
                f"{self.operator}: a task on block {'x'.join(map(str, o.shape))} took "
                f"{_fmt(o.peak_bytes)} > its {self.confidence:.0%} bound {_fmt(upper)} "
                f"(worker {o.worker}); the calibration will widen the next plan")
            if self.on_over_bound is not None:
                self.on_over_bound(o)


def _lower_this_threads_priority() -> None:
    """Give the calling thread the lowest CPU priority (Linux: ``setpriority`` on its
    thread id), best effort.

    A store write costs about 15-20 ms of CPU (Optuna and SQLAlchemy in this process,
    which also hosts a LocalCluster's scheduler); at normal priority these writes compete
    with the workers for cores while tasks run.  At nice ``WRITER_NICE`` they take cores
    the workers leave free (between tasks, or at the end of the run).  Measured (gst3d
    160^3 in 80^3 chunks, 2 workers x 1 thread, 2 cores): the computation's time with
    observation at normal priority was a few percent longer, at nice 19 unchanged, with the
    eight writes finishing in about 0.15 s after it.
    """
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WRITER_NICE)
    except (AttributeError, OSError):
        pass


_PLUGIN_CLASS = None


def _plugin_class_cached():
    global _PLUGIN_CLASS
    if _PLUGIN_CLASS is None:
        _PLUGIN_CLASS = globals().get("ObservationPlugin") or __getattr__("ObservationPlugin")
    return _PLUGIN_CLASS


def observe(client, operator, *, store=None, model=None, confidence: float = 0.99, context: dict | None = None,
            runs_dir=None, storage=None, on_over_bound=None, warn: bool = True) -> Observer:
    """Observe the tasks of ``operator`` on ``client``'s cluster; use as a context manager.

    ``operator`` is a name or an ``Operator``.  The observation of every task of it that
    finishes while the context is open goes at once to one writer thread, which stores it
    in ``store`` (default ``Store(runs_dir, storage)``) as soon as a core is free, with
    ``source="production"`` and a context (the given ``context`` plus the worker's threads
    and memory limit, ``exact``, ``run_peak_bytes``, timings); all are stored before the
    context exits, also when the computation failed.  When ``model`` is given, each is
    compared with ``model.predict(block, confidence)``'s upper bound: tasks over it are
    counted (``tasks_over_bound``), warned about, and passed to ``on_over_bound``.  Tasks
    deserialised on a worker before the context opened are not observed.  One observer
    per operator and cluster at a time.  See the module docstring for what is measured.
    """
    name = operator if isinstance(operator, str) else operator.name
    return Observer(client, name, store=store, runs_dir=runs_dir, storage=storage, model=model,
                    confidence=confidence, context=context, on_over_bound=on_over_bound, warn=warn)


def _cluster_kind(client) -> str:
    """``type(client.cluster).__name__`` (e.g. ``LocalCluster``), or ``external`` for a
    client connected by address."""
    cluster = getattr(client, "cluster", None)
    return type(cluster).__name__ if cluster is not None else "external"


def _fmt(n) -> str:
    from dask.utils import format_bytes

    return format_bytes(int(n))
