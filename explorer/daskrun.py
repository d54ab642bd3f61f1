"""Production runs: an operator's Dask form on a SEG-Y volume, on a real Dask cluster.

``run("gst3d", "in.sgy", "out.zarr", memory_limit="2GiB", workers=2)`` reads the SEG-Y
lazily (each task reads its own traces), applies the operator's Dask form, writes the
output (``.zarr``, or ``.sgy``/``.segy``), and returns a :class:`RunResult`: the chunks
used, the time taken, each worker's peak memory, workers lost, the status, and advice
when a worker was lost to memory.

Cluster.  A fresh ``LocalCluster`` (one process per worker, each with a nanny that
restarts it when its RSS passes ``distributed.worker.memory.terminate``, 95% of
``memory_limit``), or an existing cluster by ``scheduler`` address; then the workers'
own memory limit and threads are what the plan is made for, and the output path must be
reachable from the workers.

Output.  ``.zarr``: the tasks store their blocks in parallel (``da.store``, zarr 3, one
zarr chunk per Dask block, no locks) into ``<output>.partial``, renamed when complete.
``.sgy``: the same into ``<output>.partial.zarr``, then ``operators.write_segy`` converts
it in this process a slab of inlines at a time (at most 256 MiB), so the operator runs in
parallel and only the conversion is sequential.

Chunks.  ``"model"`` (default): ``explorer.chunking.recommend_chunks`` for the workers'
memory limit and threads.  ``"auto"``: Dask's, sized by input bytes only.  ``"AxBxC"``
or a tuple: those.  Axes the operator needs whole are read whole either way.

What is measured.
* ``seconds``: wall time from submitting the graph to the output being complete
  (for ``.sgy``, the conversion from the intermediate zarr included); cluster start-up,
  planning and the final bookkeeping are not in it (``wall_seconds`` has everything).
* ``worker_peak_bytes``: per worker address seen during the run (order of first
  sight), the largest ``metrics["memory"]`` (the worker process's RSS, as distributed's
  memory monitor reports it in heartbeats) sampled every ``SAMPLE_SECONDS`` by a monitor
  thread.  Heartbeats are periodic, so a short spike between two can be missed.
* ``worker_hwm_bytes``: per worker in ``workers``, the kernel's high-water RSS of its
  process (``VmHWM``, kept across the observation's resets:
  ``explorer.live.worker_high_water_bytes``), read with ``client.run`` at the end: exact,
  but since the worker process started; ``None`` for a worker gone by then.
* ``workers_restarted``: workers removed from the scheduler without being asked to
  (a nanny restart after a memory kill shows as one), from the scheduler's events;
  ``memory_kills``: the nannies' ``worker-restart-memory`` events among them.

Failure.  ``distributed.scheduler.allowed-failures`` is set to ``allowed_failures``
(default 1, Dask's is 3) for a cluster this function starts: a task whose worker dies
twice raises ``KilledWorker`` after two kills instead of four.  The run then ends with
``status="failed"``, a one-line ``error`` and ``advice``, never a traceback.  Other task
errors give ``status="error"``.  The run never waits forever: if every worker stays
paused (memory above ``distributed.worker.memory.pause``) or no worker is connected for
``stall_seconds``, it is cancelled as ``failed``.  A failed run leaves no partial output:
results go to ``<output>.partial`` and are renamed when complete.

Observation (``refine=True``, default): :func:`explorer.live.observe` records every
operator task's block and peak in the store (``source="production"``), counts
``tasks_over_bound`` against the model with its saved calibration (``None`` when there is
no model), and at the end updates the calibration (``runs/<operator>/calibration.json``).

Re-planning (``replan=True``, ``chunks="model"`` only, at most once): when a task exceeds
its bound while at most ``REPLAN_MAX_DONE_FRACTION`` of the tasks are done, the
calibration is recomputed from the observations so far; if the running plan's worker
footprint (``explorer.chunking.worker_footprint`` with the recalibrated upper bound) no
longer fits its budget, ``recommend_chunks`` plans again and, if its chunks differ, the
computation is cancelled and restarted with them into a fresh partial output (the
output's zarr chunks are those of the plan, so finished blocks cannot be kept: two plans'
tasks would write into the same zarr chunks).  Otherwise the run carries on.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from explorer.live import MAX_OVER_BOUND_WARNINGS
from explorer.units import format_bytes, format_shape, parse_shape, parse_size

__all__ = ["RunResult", "run"]

OK, FAILED, ERROR = "ok", "failed", "error"
#: Seconds between two samples of the workers' memory metrics.
SAMPLE_SECONDS = 0.2
#: Seconds between two polls of the computation's progress.
POLL_SECONDS = 0.05
#: Output suffixes.
ZARR_SUFFIXES = (".zarr",)
SEGY_SUFFIXES = (".sgy", ".segy")
#: A run with ``chunks="model"`` whose task exceeds the bound is restarted with the
#: recalibrated plan only while at most this share of its operator tasks is done (and only
#: once): later, finishing costs less than starting again.
REPLAN_MAX_DONE_FRACTION = 0.5


@dataclass
class RunResult:
    """What a production run did (``to_dict()`` is its JSON; the module docstring says how
    each figure is measured).

    ``status``: ``"ok"``; ``"failed"`` (workers lost, to memory or otherwise, or the
    cluster stalled: ``advice`` says what to change); ``"error"`` (bad input, no model,
    no plan fits, a task raised).  ``error`` is one line.  ``chunks`` is one chunk shape
    (the first block's; axes the operator needs whole are whole), ``n_tasks`` the number
    of operator tasks (output blocks), ``plan`` the ``ChunkPlan`` dict when
    ``chunks_source == "model"``.  ``workers`` lists the worker addresses seen, in the
    order of ``worker_peak_bytes`` and ``worker_hwm_bytes``.  ``observations_recorded``
    and ``tasks_over_bound`` (``None`` without a model to compare with) come from
    ``explorer.live``; ``calibration`` is the one saved at the end (or ``None``);
    ``replanned_from`` the chunk shapes abandoned for a recalibrated plan; ``warnings``
    one line each, for the run's output.
    """

    operator: str
    input: str
    output: str
    status: str
    shape: list[int] | None = None
    chunks: list[int] | None = None
    n_tasks: int | None = None
    seconds: float | None = None
    wall_seconds: float | None = None
    workers: list[str] = field(default_factory=list)
    worker_peak_bytes: list[int] = field(default_factory=list)
    worker_hwm_bytes: list[int] = field(default_factory=list)
    workers_restarted: int = 0
    memory_kills: int = 0
    error: str | None = None
    advice: str | None = None
    memory_limit_bytes: int | None = None
    n_workers: int | None = None
    threads_per_worker: int | None = None
    scheduler: str | None = None
    chunks_source: str | None = None
    plan: dict | None = None
    refine: bool = True
    observations_recorded: int = 0
    tasks_over_bound: int | None = None
    calibration: dict | None = None
    replanned_from: list[list[int]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        out = dict(self.__dict__)
        for key in ("seconds", "wall_seconds"):
            if out[key] is not None:
                out[key] = round(out[key], 3)
        return out


class _RunError(Exception):
    """Ends a run with ``status`` and a one-line message (never a traceback)."""

    def __init__(self, status: str, message: str, advice: str | None = None):
        super().__init__(message)
        self.status, self.advice = status, advice


# --------------------------------------------------------------------------- monitor


class _Monitor(threading.Thread):
    """Samples the workers' memory metrics every ``SAMPLE_SECONDS`` and keeps, per
    worker address, the maximum; also notices when every worker is paused or gone."""

    def __init__(self, client):
        super().__init__(name="explorer-worker-monitor", daemon=True)
        self.client = client
        self.peaks: dict[str, int] = {}
        self.limits: dict[str, int] = {}
        self.stalled_since: float | None = None
        self.stall_reason = ""
        self._halt = threading.Event()
        self._lock = threading.Lock()

    def sample(self) -> None:
        workers = self.client.scheduler_info(n_workers=-1).get("workers", {})
        with self._lock:
            self._fold(workers)

    def _fold(self, workers: dict) -> None:
        for address, info in workers.items():
            memory = int((info.get("metrics") or {}).get("memory") or 0)
            self.peaks[address] = max(self.peaks.get(address, 0), memory)
            self.limits[address] = int(info.get("memory_limit") or 0)
        statuses = [str(info.get("status", "running")).lower() for info in workers.values()]
        if not workers or all("paused" in s for s in statuses):
            if self.stalled_since is None:
                self.stalled_since = time.monotonic()
            self.stall_reason = ("no worker is connected" if not workers else
                                 "every worker is paused (memory above the pause threshold)")
        else:
            self.stalled_since = None

    def run(self) -> None:
        while not self._halt.wait(SAMPLE_SECONDS):
            try:
                self.sample()
            except Exception:  # the cluster is closing
                if self._halt.is_set():
                    return

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)


# --------------------------------------------------------------------------- helpers


def _output_kind(path: str) -> str:
    lower = path.lower().rstrip("/")
    if lower.endswith(ZARR_SUFFIXES):
        return "zarr"
    if lower.endswith(SEGY_SUFFIXES):
        return "segy"
    raise _RunError(ERROR, f"output {path!r} must end in .zarr, .sgy or .segy")


def _remove(path) -> None:
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _whole(op, shape, chunk):
    """The chunk shape with the operator's whole axes whole and every axis at most the shape."""
    return tuple(int(n) if axis in op.whole_axes else min(int(c), int(n))
                 for axis, (n, c) in enumerate(zip(shape, chunk)))


def _default_memory_limit(n_workers: int) -> int:
    import psutil

    return int(psutil.virtual_memory().total // max(1, n_workers))


def _suggestion(operator, shape, limit, threads, confidence, runs_dir) -> str:
    """The advice after a worker was lost to memory."""
    cmd = (f"explore chunks {operator} --shape {format_shape(shape)} "
           f"--memory-limit {format_bytes(limit).replace(' ', '')} --threads {threads}")
    try:
        from explorer.chunking import recommend_chunks

        plan = recommend_chunks(operator, shape, limit, threads_per_worker=threads,
                                confidence=confidence, runs_dir=runs_dir)
        lower = f"lower the chunk size ({cmd} suggests {format_shape(plan.chunks)} for this limit)"
    except Exception:
        lower = f"lower the chunk size (run `explore {operator}`, then `{cmd}`)"
    threads_part = f", or use fewer --threads (now {threads})" if threads > 1 else ""
    return f"a worker exceeded its memory limit: {lower}, or raise --memory-limit{threads_part}"


def _terminate_fraction() -> float:
    import dask.config

    value = dask.config.get("distributed.worker.memory.terminate", 0.95)
    return float(value) if value else 1.0


def _regular(chunks) -> bool:
    return all(len(set(c[:-1])) <= 1 and (len(c) < 2 or c[-1] <= c[0]) for c in chunks)


# --------------------------------------------------------------------------- run


def run(
    operator: str,
    input_path,
    output_path,
    *,
    memory_limit=None,
    workers: int = 2,
    threads_per_worker: int = 1,
    scheduler: str | None = None,
    chunks="model",
    runs_dir=None,
    storage: str | None = None,
    confidence: float = 0.99,
    refine: bool = True,
    progress=None,
    allowed_failures: int = 1,
    stall_seconds: float = 60.0,
    replan: bool = True,
) -> RunResult:
    """Run ``operator`` on the SEG-Y at ``input_path`` into ``output_path`` on Dask.

    ``memory_limit`` (bytes or ``"2GiB"``, per worker; default total RAM / ``workers``),
    ``workers`` and ``threads_per_worker`` shape the ``LocalCluster`` started here
    unless ``scheduler`` (an address) names an existing cluster.  ``chunks``: ``"model"``,
    ``"auto"``, ``"AxBxC"`` or a tuple.  ``progress(done, total)`` is called (from this
    thread) whenever more operator tasks have finished.  ``refine`` observes the tasks
    (``explorer.live``) into the store under ``runs_dir`` (or ``storage``), ``replan``
    allows one restart with a recalibrated plan, ``allowed_failures`` is the
    ``distributed.scheduler.allowed-failures`` of a cluster started here, and
    ``stall_seconds`` bounds how long every worker may stay paused or absent.  See the
    module docstring for every measured field; bad input and failures come back as
    ``status`` ``"error"``/``"failed"`` with a one-line ``error``, not as exceptions.
    """
    wall_started = time.perf_counter()
    result = RunResult(operator=str(operator), input=os.fspath(input_path), output=os.fspath(output_path),
                       status=OK, refine=bool(refine), scheduler=scheduler)
    cluster = client = None
    try:
        cluster, client = _execute(result, operator, input_path, output_path, memory_limit=memory_limit,
                                   workers=workers, threads_per_worker=threads_per_worker,
                                   scheduler=scheduler, chunks=chunks, runs_dir=runs_dir, storage=storage,
                                   confidence=confidence, refine=refine, progress=progress,
                                   allowed_failures=allowed_failures, stall_seconds=stall_seconds,
                                   replan=replan)
    except _RunError as exc:
        result.status, result.error = exc.status, str(exc)
        result.advice = result.advice or exc.advice
    except Exception as exc:  # anything unforeseen still ends as one line
        if os.environ.get("EXPLORER_DEBUG"):
            raise
        result.status, result.error = ERROR, _one_line(exc)
    finally:
        _close_quietly(client, cluster)
    result.wall_seconds = time.perf_counter() - wall_started
    return result


def _execute(result: RunResult, operator, input_path, output_path, *, memory_limit, workers,
             threads_per_worker, scheduler, chunks, runs_dir, storage, confidence, refine, progress,
             allowed_failures, stall_seconds, replan):
    import operators
    from explorer.plugins import load_plugins
    from operators.segy import SegyGeometryError, segy_geometry

    load_plugins()
    try:
        op = operators.get(operator)
    except KeyError as exc:
        raise _RunError(ERROR, exc.args[0]) from None
    input_path, output_path = os.fspath(input_path), os.fspath(output_path)
    kind = _output_kind(output_path)
    try:
        shape = segy_geometry(input_path).shape
    except (SegyGeometryError, OSError) as exc:
        raise _RunError(ERROR, str(exc) if isinstance(exc, SegyGeometryError) else _one_line(exc)) from None
    result.shape = list(shape)
    # The store (Optuna, SQLite: ~0.9 s of CPU to import and open) opens while the
    # cluster starts, so that no observation waits for it during the computation.
    store_future = _open_store(op.name, runs_dir, storage) if refine else None
    if chunks is None:
        chunks = "model"
    if not (isinstance(chunks, str) and chunks in ("model", "auto")):
        try:
            chunks = parse_shape(chunks)
        except ValueError as exc:
            raise _RunError(ERROR, f"--chunks: {exc}") from None
    try:
        requested_limit = parse_size(memory_limit) if memory_limit is not None else None
    except ValueError as exc:
        raise _RunError(ERROR, f"--memory-limit: {exc}") from None

    # ---- the cluster -----------------------------------------------------------------
    import dask
    from distributed import Client, LocalCluster

    cluster = client = None
    if scheduler:
        try:
            client = Client(scheduler, timeout="10s")
        except Exception as exc:
            raise _RunError(ERROR, f"cannot connect to scheduler {scheduler}: {_one_line(exc)}") from None
        info = client.scheduler_info(n_workers=-1).get("workers", {})
        if not info:
            client.close()
            raise _RunError(FAILED, f"scheduler {scheduler} has no workers")
        limits = [int(w.get("memory_limit") or 0) for w in info.values()]
        threads = max(int(w.get("nthreads") or 1) for w in info.values())
        if all(limits):
            limit = min(limits)
            if requested_limit is not None and requested_limit != limit:
                result.warnings.append(f"the cluster's workers have {format_bytes(limit)} each; "
                                       f"--memory-limit {memory_limit} is not applied to an existing cluster")
        else:
            limit = requested_limit or _default_memory_limit(len(info))
        result.n_workers, result.threads_per_worker, cluster_kind = len(info), threads, "external"
    else:
        limit = requested_limit or _default_memory_limit(workers)
        threads = int(threads_per_worker)
        with dask.config.set({"distributed.scheduler.allowed-failures": int(allowed_failures)}):
            cluster = LocalCluster(n_workers=int(workers), threads_per_worker=threads, memory_limit=limit,
                                   processes=True, dashboard_address=None, silence_logs=logging.CRITICAL,
                                   # no dashboard; its HTTP server (health checks) on a free port
                                   scheduler_kwargs={"dashboard_address": ":0"})
        client = Client(cluster)
        result.n_workers, result.threads_per_worker, cluster_kind = int(workers), threads, "LocalCluster"
    result.memory_limit_bytes = int(limit)
    try:
        _compute(result, client, op, input_path, output_path, kind, shape, limit, threads, chunks,
                 cluster_kind=cluster_kind, runs_dir=runs_dir, store_future=store_future, confidence=confidence,
                 refine=refine, progress=progress, stall_seconds=stall_seconds, replan=replan)
    except BaseException:
        if client is not None:
            _close_quietly(client, cluster)
        raise
    return cluster, client


def _open_store(operator, runs_dir, storage):
    """A future of the operator's opened ``Store`` (opened in a background thread)."""
    from concurrent.futures import Future

    future: Future = Future()

    def open_it():
        try:
            from explorer.store import Store

            store = Store(runs_dir, storage)
            store.study(operator)
            future.set_result(store)
        except BaseException as exc:  # reported when the run needs the store
            future.set_exception(exc)

    threading.Thread(target=open_it, name="explorer-store-open", daemon=True).start()
    return future


def _close_quietly(client, cluster) -> None:
    for closing in (client, cluster):
        if closing is not None:
            try:
                closing.close()
            except Exception:
                pass


def _plan(result, op, shape, limit, threads, chunks, confidence, runs_dir):
    """Chunk shape, and the model to check tasks against (or None)."""
    import operators

    model = None
    if isinstance(chunks, str) and chunks == "model":
        from explorer.chunking import ChunkPlanError, recommend_chunks
        from explorer.surrogate import ModelNotFoundError

        try:
            plan = recommend_chunks(op.name, shape, limit, threads_per_worker=threads,
                                    confidence=confidence, runs_dir=runs_dir, workers=result.n_workers or 1)
        except (ChunkPlanError, ModelNotFoundError) as exc:
            raise _RunError(ERROR, str(exc)) from None
        result.plan, result.chunks_source = plan.to_dict(), "model"
        chunk = tuple(plan.chunks)
    elif isinstance(chunks, str) and chunks == "auto":
        x = operators.read_segy(result.input, chunks="auto")
        chunk = tuple(int(c[0]) for c in x.chunks)
        result.chunks_source = "auto"
    else:
        chunk = tuple(int(c) for c in chunks)
        result.chunks_source = "explicit"
    whole = _whole(op, shape, chunk)
    if whole != chunk and result.chunks_source == "explicit":
        result.warnings.append(f"{op.name} needs axes {list(op.whole_axes)} whole: chunks "
                               f"{format_shape(chunk)} become {format_shape(whole)}")
    try:
        from explorer.live import calibrated_model

        model = calibrated_model(op.name, runs_dir)
    except Exception:  # no model yet: nothing to compare the tasks with
        model = None
    return whole, model


def _compute(result, client, op, input_path, output_path, kind, shape, limit, threads, chunks, *,
             cluster_kind, runs_dir, store_future, confidence, refine, progress, stall_seconds, replan):
    chunk, model = _plan(result, op, shape, limit, threads, chunks, confidence, runs_dir)
    result.chunks = list(chunk)

    monitor = _Monitor(client)
    try:
        monitor.sample()
    except Exception:
        pass
    monitor.start()
    run_started_at = time.time()

    observer = None
    replan_wanted = threading.Event()
    store = None
    if refine:
        try:
            store = store_future.result()
        except Exception as exc:
            result.warnings.append(f"observation off: the store did not open: {_one_line(exc)}")
            result.refine = refine = False
    if refine:
        from explorer.live import observe

        observer = observe(
            client, op.name, store=store, model=model, confidence=confidence,
            context={"cluster": cluster_kind, "n_workers": result.n_workers, "chunks": list(chunk),
                     "volume_shape": list(shape), "output": kind},
            on_over_bound=lambda _o: replan_wanted.set(), warn=False,
        ).start()

    def replan_now(done: int, total: int):
        """A new chunk shape to restart with, or None (decided at most once)."""
        nonlocal replan
        if not (replan and result.chunks_source == "model" and replan_wanted.is_set()
                and done <= REPLAN_MAX_DONE_FRACTION * total):
            return None
        replan = False
        return _replan(result, op, shape, limit, threads, confidence, runs_dir, observer)

    partials: list[Path] = []
    try:
        while True:
            partial = Path(f"{output_path}.partial" + (".zarr" if kind == "segy" else ""))
            if partials:
                partial = partial.with_name(partial.name + f"-{len(partials)}")
            partials.append(partial)
            new_chunk = _store(result, client, op, result.input, partial, chunk, monitor, progress,
                               stall_seconds, replan_now)
            if new_chunk is None:
                break
            result.replanned_from.append(list(chunk))
            chunk = new_chunk
            result.chunks = list(chunk)
            observer.context["chunks"] = list(chunk)
        if kind == "segy":
            import zarr

            from operators import write_segy

            started = time.perf_counter()
            write_segy(output_path, zarr.open_array(str(partials[-1]), mode="r"))
            result.seconds += time.perf_counter() - started
        else:
            _remove(output_path)
            os.replace(partials[-1], output_path)
    except _RunError as exc:
        result.status, result.error, result.advice = exc.status, str(exc), exc.advice
    finally:
        monitor.stop()
        for path in partials:
            _remove(path)
        _finish(result, client, op, shape, limit, threads, confidence, runs_dir, monitor, observer,
                model, run_started_at)


def _store(result, client, op, input_path, partial, chunk, monitor, progress, stall_seconds, replan_now):
    """Compute the operator into a zarr array at ``partial``.  None when complete, or the
    chunk shape to restart with when ``replan_now(done, total)`` gives one (the
    computation is then cancelled).  Raises :class:`_RunError` on failure."""
    import dask.array as da
    import zarr
    from distributed import KilledWorker, futures_of

    import operators

    x = operators.read_segy(input_path, chunks=chunk)
    y = op.dask(x)
    if not _regular(y.chunks):  # zarr chunks must not be shared by two tasks
        y = y.rechunk(tuple(c[0] for c in y.chunks))
    result.n_tasks = int(np.prod(y.numblocks))
    _remove(partial)
    target = zarr.create_array(store=str(partial), shape=y.shape, chunks=tuple(c[0] for c in y.chunks),
                               dtype=y.dtype, overwrite=True)
    stored = da.store(y, target, lock=False, compute=False, return_stored=True, load_stored=False)

    started = time.perf_counter()
    persisted = client.persist(stored)
    futures = futures_of(persisted)
    total, reported = len(futures), -1
    try:
        while True:
            done = 0
            failed = None
            for f in futures:
                status = f.status
                if status == "finished":
                    done += 1
                # "lost" is not an end: a finished block whose worker died (e.g. killed for
                # memory while running another task) is recomputed by the scheduler, and the
                # future finishes again (or errs, e.g. KilledWorker).
                elif status in ("error", "cancelled") and failed is None:
                    failed = f
            if done != reported:
                reported = done
                if progress is not None:
                    progress(done, total)
            if failed is not None:
                exc = failed.exception() if failed.status == "error" else None
                if isinstance(exc, KilledWorker):
                    raise _RunError(FAILED, f"workers died while running a task ({_killed_line(exc)})")
                raise _RunError(ERROR, _one_line(exc) if exc is not None else f"a task was {failed.status}")
            if done == total:
                break
            if monitor.stalled_since is not None and time.monotonic() - monitor.stalled_since > stall_seconds:
                raise _RunError(FAILED, f"no progress for {stall_seconds:g} s: {monitor.stall_reason}")
            new_chunk = replan_now(done, total)
            if new_chunk is not None:
                return new_chunk
            time.sleep(POLL_SECONDS)
    finally:
        result.seconds = (result.seconds or 0.0) + time.perf_counter() - started
        client.cancel(futures)
        del persisted, futures
    return None


def _killed_line(exc) -> str:
    text = " ".join(str(exc).split())
    return text[:200] + ("..." if len(text) > 200 else "")


def _replan(result, op, shape, limit, threads, confidence, runs_dir, observer):
    """After a task over its bound: recalibrate from the observations so far; if the
    running plan's worker footprint no longer fits its budget under the recalibrated
    model, plan again.  The new chunk shape, or None to carry on with the current one."""
    from explorer.chunking import recommend_chunks, worker_footprint
    from explorer.live import calibrated_model, calibration
    from explorer.surrogate import load_model

    observer.flush()
    try:
        cal = calibration(op.name, observer._store, load_model(op.name, runs_dir=runs_dir),
                          confidence=confidence, runs_dir=runs_dir)
        if cal is None:
            return None
        result.calibration = cal.to_dict()
        model = calibrated_model(op.name, runs_dir)
        observer.model = model  # later tasks are checked against the recalibrated bound
        old = result.plan
        upper = model.predict(old["block"], confidence)[1]
        footprint = worker_footprint(old["block"], upper, threads_per_worker=threads,
                                     output_itemsize=np.dtype(op.output_dtype).itemsize,
                                     chunk_shapes=old["chunks"], neighbour_chunks=old["neighbour_chunks"])
        if footprint.total <= old["budget_bytes"]:
            result.warnings.append("tasks exceeded their bound, but the running plan still fits its budget "
                                   "under the recalibrated model: not re-planned")
            return None
        plan = recommend_chunks(op.name, shape, limit, threads_per_worker=threads, confidence=confidence,
                                runs_dir=runs_dir, workers=result.n_workers or 1)
    except Exception as exc:
        result.warnings.append(f"re-planning failed, the run continues with its plan: {_one_line(exc)}")
        return None
    new = _whole(op, shape, plan.chunks)
    if new == tuple(result.chunks):
        result.warnings.append("the running plan exceeds its budget under the recalibrated model, but "
                               "recommend_chunks gives the same chunks (is the calibration applied?)")
        return None
    result.plan = plan.to_dict()
    result.warnings.append(f"a task exceeded its bound early: restarted with the recalibrated plan "
                           f"{format_shape(new)} (was {format_shape(result.chunks)})")
    return new


def _finish(result, client, op, shape, limit, threads, confidence, runs_dir, monitor, observer, model,
            run_started_at):
    """Worker peaks, restarts, observations and calibration, whatever the outcome."""
    try:
        monitor.sample()
    except Exception:
        pass
    result.workers = list(monitor.peaks)
    result.worker_peak_bytes = [monitor.peaks[a] for a in result.workers]
    try:
        from explorer.live import worker_high_water_bytes

        hwm = client.run(worker_high_water_bytes, on_error="ignore")
        result.worker_hwm_bytes = [int(hwm[a]) if isinstance(hwm.get(a), int) else None for a in result.workers]
    except Exception:
        pass
    try:
        removed = [msg for t, msg in client.get_events("all")
                   if t >= run_started_at - 1 and isinstance(msg, dict)
                   and msg.get("action") == "remove-worker" and not msg.get("expected")]
        kills = [msg for t, msg in client.get_events("worker-restart-memory") if t >= run_started_at - 1]
        result.workers_restarted, result.memory_kills = len(removed), len(kills)
    except Exception:
        pass
    if result.memory_kills:
        result.advice = _suggestion(op.name, shape, limit, threads, confidence, runs_dir)
        if result.status == FAILED and "workers died" in (result.error or ""):
            terminate = _terminate_fraction()
            result.error = (f"a worker was lost to memory: its nanny killed it {result.memory_kills} time(s) above "
                            f"{terminate:.0%} of its {format_bytes(limit)} limit while it ran "
                            f"{format_shape(result.chunks or [])} chunks, and the task was given up (KilledWorker)")
        if result.status == OK:
            result.warnings.append(
                f"{result.memory_kills} worker(s) exceeded their memory limit and were restarted; "
                f"the run recovered by retrying their tasks")
    elif result.status == FAILED and result.advice is None:
        remedy = _suggestion(op.name, shape, limit, threads, confidence, runs_dir).split(": ", 1)[1]
        if "paused" in (result.error or ""):
            from explorer.chunking import DEFAULT_WORKER_BASELINE_BYTES, worker_pause_fraction

            result.advice = (
                f"the workers' memory stayed above their pause threshold ({worker_pause_fraction():.0%} of "
                f"{format_bytes(limit)}) with no task finishing: raise --memory-limit (an idle worker alone "
                f"takes about {format_bytes(DEFAULT_WORKER_BASELINE_BYTES)}), or {remedy}")
        else:
            result.advice = ("workers died without their nanny reporting a memory kill (check the worker "
                             f"logs); if they ran out of memory: {remedy}")
    if observer is not None:
        expected = result.n_tasks if result.status == OK and result.error is None else None
        observer.close(expected=expected, timeout=2.0)
        result.observations_recorded = observer.recorded
        result.tasks_over_bound = observer.tasks_over_bound if model is not None else None
        result.warnings.extend(observer.warnings)
        if observer.tasks_over_bound > MAX_OVER_BOUND_WARNINGS:
            worst = max(o.peak_bytes / o.upper_bytes for o in observer.over_bound)
            result.warnings.append(f"{observer.tasks_over_bound} tasks exceeded their bound in all "
                                   f"(the worst by {worst - 1:.0%}); the first {MAX_OVER_BOUND_WARNINGS} are above")
        result.warnings.extend(observer.errors)
        if observer.recorded and model is not None:
            try:
                from explorer.live import calibration
                from explorer.surrogate import load_model

                cal = calibration(op.name, observer._store, load_model(op.name, runs_dir=runs_dir),
                                  confidence=confidence, runs_dir=runs_dir)
                result.calibration = cal.to_dict() if cal is not None else result.calibration
            except Exception as exc:
                result.warnings.append(f"calibration not updated: {_one_line(exc)}")
