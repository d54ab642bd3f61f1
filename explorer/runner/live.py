"""Live observation of an operator's Dask tasks (the client side).

Inside the workers (:mod:`explorer.measure.inworker`) every task of the observed operator reports
the block its ``operator.run`` saw, the memory the task took and its clocks; here the
client stores each report at once in the operator's study (``source="production"``, or
``"probe"`` for explore's in-worker probes) and compares it with the bound of the
in-worker task model (``explorer.plan.task_model.TaskModel``).  The stored reports are what
``explorer.plan.calibration.calibrate`` learns from.

::

    with observe(client, "gst3d", model=task_model("gst3d")) as observer:   # any Dask code
        da.to_zarr(operators.get("gst3d").dask(x, wrap=observer.wrap), "out.zarr")
    observer.recorded, observer.tasks_over_bound

The graph must carry the measuring hook: build the operator's Dask form with
``wrap=observer.wrap`` (what ``explorer.runner.daskrun`` does); what is measured, and how, is
in :mod:`explorer.measure.inworker`'s docstring.

Bound checks: an exact observation (one thread per worker) is over its bound when its
``peak_bytes`` exceeds the model's upper bound on one task at its block (a task model is told
whether the task was its worker's first of the run: ``first_in_run``, :mod:`explorer.measure.inworker`),
plus, for a windowed task whose chunk the volume does not fill, the store chunk it merges
(``Observer._store_chunk_bytes``: the footprint's term for that task).  With ``T > 1`` threads a
figure is the process's growth while ``T`` tasks ran, so it is compared with the footprint's task
term for ``T`` tasks, ``T (input_block_bytes + upper)``, or ``T upper`` when each task reads its
own block (``windowed``: ``explorer.runner.daskrun``'s runs, whose reads are inside the tasks'
peaks).

Cost: on the worker, about 0.1 ms per task (reads of ``/proc/self/status`` and writes
to ``clear_refs`` at task start, ``run`` start, ``run`` end and task end) and one small
event to the scheduler per operator task.  On the client, about 15-20 ms of CPU per
observation to store it (Optuna over SQLite), in one writer thread at the lowest CPU
priority so that it does not take cores from the workers (``WRITER_NICE``).  Should the
client process itself be killed, observations still queued for that thread are lost;
every one that reached the client is stored when the computation merely fails.
"""

from __future__ import annotations

import math
import os
import queue
import threading
import time
import uuid
import warnings
from dataclasses import dataclass, field

import numpy as np

from explorer.core.units import FLOAT32_BYTES
from explorer.plan.predictor import takes

__all__ = ["Observation", "Observer", "observe"]

#: Prefix of the event topic on which workers send observations.
TOPIC_PREFIX = "memory-explorer-observations"
#: Tasks over the bound warned about one by one; later ones are only counted.
MAX_OVER_BOUND_WARNINGS = 5
#: CPU niceness of the thread that writes observations to the store (see ``_lower_this_threads_priority``).
WRITER_NICE = 19


@dataclass
class Observation:
    """One operator task as the worker measured it (see :mod:`explorer.measure.inworker`)."""

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
    #: The task read its own block (``operators.windowed_map``): no input was resident before it.
    windowed: bool = False

    @property
    def bound_bytes(self) -> float | None:
        """What ``peak_bytes`` is compared with: the task's upper bound when exact, the
        task term of ``threads`` concurrent tasks otherwise (module docstring)."""
        if self.upper_bytes is None:
            return None
        if self.exact:
            return self.upper_bytes
        block_in = 0 if self.windowed else FLOAT32_BYTES * math.prod(self.shape)
        return self.threads * (self.upper_bytes + block_in)


class Observer:
    """The client side of :func:`observe`: receives, stores and checks observations.

    ``wrap`` is the hook to pass to the operator's Dask form.  ``observations`` (all
    received), ``recorded`` (persisted), ``tasks_over_bound``, ``over_bound`` (those
    observations), ``warnings`` (one line each), ``errors`` (storage errors, one line
    each), ``run_id`` (kept in each stored observation's context: the calibration groups
    by it).  ``on_over_bound(observation)`` is called for each task over the bound from the
    thread that stores it: the writer, or at the end the one that closes the observer.
    """

    def __init__(self, client, operator: str, *, store=None, runs_dir=None, storage=None, model=None,
                 confidence: float = 0.99, context: dict | None = None, on_over_bound=None,
                 warn: bool = True, source: str = "production", windowed: bool = False):
        from explorer.measure.inworker import measured_run

        self.windowed = bool(windowed)
        self.client = client
        self.operator = operator
        self.output_itemsize = _output_itemsize(operator)
        self.model = model
        self.confidence = float(confidence)
        self.run_id = uuid.uuid4().hex[:12]
        self.source = source
        self.context = {"cluster": _cluster_kind(client), "run": self.run_id, **(context or {})}
        self.on_over_bound = on_over_bound
        self.warn = warn
        self.wrap = measured_run
        self.topic = f"{TOPIC_PREFIX}-{operator}-{self.run_id}"
        self.plugin_name = f"memory-explorer-observe-{operator}-{self.run_id}"
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
        self._writing = threading.Lock()  # one write at a time: the writer's, or the closing thread's
        self._closing = False
        self._unsupported_warned = False

    @property
    def tasks_over_bound(self) -> int:
        return len(self.over_bound)

    @property
    def store(self):
        """The store observations go to (opened by the writer thread on first use)."""
        if self._store is None:
            from explorer.search.store import Store

            self._store = Store(*self._store_args)
        return self._store

    # ---- lifecycle ------------------------------------------------------------------
    def start(self) -> "Observer":
        from explorer.measure.inworker import ObservationPlugin

        self._writer = threading.Thread(target=self._write_loop, name="explorer-observation-writer", daemon=True)
        self._writer.start()
        self.client.subscribe_topic(self.topic, self._on_event)
        self.client.register_plugin(ObservationPlugin(self.operator, self.topic, self.plugin_name),
                                    name=self.plugin_name)
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
        self._closing = True
        self._queue.put(None)
        if self._writer is not None:
            self._drain()
            self._writer.join()
            self._drain()  # any the writer put back

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
                extra={k: msg[k] for k in ("run_seconds", "read_seconds", "other_seconds", "other_tasks", "n_runs",
                                           "rss_before_bytes", "process_peak_bytes", "environment",
                                           "managed_before_bytes", "managed_after_bytes", "first_in_run",
                                           "task_index", "process_task_index", "chunk_index") if k in msg},
                windowed=self.windowed,
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
        while True:
            try:
                observation = self._queue.get(timeout=0.1)
            except queue.Empty:
                if self._closing:
                    return
                continue
            if observation is None:
                return
            if self._closing:  # the closing thread writes the rest (_drain)
                self._queue.put(observation)
                return
            self._write(observation)

    def _drain(self) -> None:
        """Write what is still queued from the closing thread, at its own priority: the writer
        runs at :data:`WRITER_NICE` so as not to slow the tasks, and on a busy machine it got
        about 2 s a write (16 observations of a probe: 35 s) once the run it yielded to was over.
        The writer finishes the one it holds (``_writing`` keeps the two apart)."""
        while True:
            try:
                observation = self._queue.get_nowait()
            except queue.Empty:
                return
            if observation is not None:
                self._write(observation)

    def _write(self, observation: Observation) -> None:
        """Check ``observation`` against its bound and store it (any failure is kept as a warning)."""
        with self._writing:
            try:
                self._check(observation)
            except Exception as exc:  # a broken model must not lose the observation
                self.warnings.append(f"bound check failed: {type(exc).__name__}: {exc}")
            try:
                self.store.add_observation(self.operator, observation.shape, observation.peak_bytes,
                                           source=self.source, context=self._context(observation))
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
        first = o.extra.get("first_in_run")
        order = {"cold": int(bool(first))} if first is not None and takes(self.model.predict, "cold") else {}
        _mean, upper = self.model.predict(o.shape, self.confidence, **order)
        store = o.extra["store_chunk_bytes"] = self._store_chunk_bytes(o)
        o.upper_bytes = float(upper) + store
        if o.peak_bytes <= o.bound_bytes:
            return
        o.over_bound = True
        self.over_bound.append(o)
        if len(self.over_bound) <= MAX_OVER_BOUND_WARNINGS:
            what = "task" if o.exact else f"{o.threads} concurrent tasks"
            self._warn(
                f"{self.operator}: {what} on block {'x'.join(map(str, o.shape))} took "
                f"{_fmt(o.peak_bytes)} > the {self.confidence:.0%} bound {_fmt(o.bound_bytes)} "
                f"(worker {o.worker}); the calibration will widen the next plan")
        if self.on_over_bound is not None:
            self.on_over_bound(o)

    def _store_chunk_bytes(self, o: Observation) -> int:
        """What ``o``'s task holds for the store beyond its operator's bound: a windowed task
        writes its chunk in the same task (``windowed-store-map``), and one whose chunk the volume
        does not fill merges it into a whole store chunk there
        (``explorer.plan.footprint.task_store_chunk_bytes``, the footprint's term for that task);
        0 when the run did not say its chunks."""
        from explorer.plan.footprint import task_store_chunk_bytes

        shape, chunks, index = (self.context.get("volume_shape"), self.context.get("chunks"),
                                o.extra.get("chunk_index"))
        if not (o.windowed and shape and chunks and index) or not len(shape) == len(chunks) == len(index):
            return 0
        return task_store_chunk_bytes(shape, chunks, index, self.output_itemsize)


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


def observe(client, operator, *, store=None, model=None, confidence: float = 0.99, context: dict | None = None,
            runs_dir=None, storage=None, on_over_bound=None, warn: bool = True,
            source: str = "production", windowed: bool = False) -> Observer:
    """Observe the tasks of ``operator`` on ``client``'s cluster; use as a context manager.

    ``operator`` is a name or an ``Operator``; the observed graph must be built with
    ``operator.dask(x, wrap=observer.wrap)``.  The observation of every task of it that
    finishes while the context is open goes at once to one writer thread, which stores it
    in ``store`` (default ``Store(runs_dir, storage)``) with ``source`` (``"production"``,
    or ``"probe"``) and a context (the given ``context``, the observer's ``run_id``, the
    worker's threads and memory limit, ``exact``, ``run_peak_bytes``, clocks, the
    workers' environment digest); all are stored before the context exits, also when the
    computation failed.  When ``model`` is given (a ``TaskModel`` or any object with
    ``predict(shape, confidence) -> (mean, upper)``; one that declares ``cold``
    (``explorer.plan.predictor.takes_keywords``) is told whether each task was its worker's
    first of the run), each is compared with its bound (module docstring): tasks over it
    are counted (``tasks_over_bound``), warned about, and passed to ``on_over_bound``.
    ``windowed``: the graph's tasks read their own blocks (``operator.dask(source,
    chunks=...)``), which a ``T > 1`` figure's bound then does not add again.  One observer
    per operator and cluster at a time.
    """
    name = operator if isinstance(operator, str) else operator.name
    return Observer(client, name, store=store, runs_dir=runs_dir, storage=storage, model=model,
                    confidence=confidence, context=context, on_over_bound=on_over_bound, warn=warn,
                    source=source, windowed=windowed)


def _output_itemsize(name: str) -> int:
    """Bytes per output sample of operator ``name`` (float32's when this process cannot load it:
    an operator only the workers have)."""
    try:
        import operators

        return int(np.dtype(operators.get(name).output_dtype).itemsize)
    except Exception:
        return FLOAT32_BYTES


def _cluster_kind(client) -> str:
    """``type(client.cluster).__name__`` (e.g. ``LocalCluster``), or ``external`` for a
    client connected by address."""
    cluster = getattr(client, "cluster", None)
    return type(cluster).__name__ if cluster is not None else "external"


def _fmt(n) -> str:
    from dask.utils import format_bytes

    return format_bytes(int(n))
