"""The worker baseline: an idle worker's resident memory with the operator loaded.

The ``baseline_bytes`` of the worker footprint is measured where the work runs, never a
constant:

* on a cluster, with :func:`measure_worker_baseline` (``client.run`` of
  ``explorer.measure.inworker.warm_worker`` on every worker, then a tiny graph of the operator's
  tasks on its smallest blocks: the largest resident set of an idle worker that has loaded the operator and
  run its tasks); ``explorer.runner.daskrun`` does this before every run and passes it to
  ``recommend_chunks`` as ``baseline_bytes``;
* without one (``baseline_bytes=None``), measured once per environment on this machine
  in a one-worker ``LocalCluster`` (:func:`local_worker_baseline`) and saved, with its
  environment stamp, in ``runs/<operator>/worker_baseline.json``; ``explore`` saves it
  with its in-worker probes, and a stamp that no longer matches (another version of
  Dask, NumPy, the operator, another machine) is measured again.

Dask and ``distributed`` are imported only to measure.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from explorer.core import paths
from explorer.core.atomic import atomic_write_text
from explorer.core.file_cache import MtimeCache

__all__ = [
    "WorkerBaseline",
    "local_worker_baseline",
    "measure_worker_baseline",
    "with_known_rate",
]


#: Baseline file name under ``runs/<operator>/``.
BASELINE_FILE = "worker_baseline.json"


class WorkerError(RuntimeError):
    """Workers cannot run the operator (one line naming the workers and the cause)."""


@dataclass
class WorkerBaseline:
    """Idle workers with the operator loaded: the footprint's ``baseline_bytes`` and more.

    ``bytes`` is the largest resident set over ``per_worker`` (address -> bytes);
    ``environment`` the workers' stamp (``explorer.core.environment``; the first worker's);
    ``source`` ``"cluster"`` or ``"local"``.  ``first_touch_seconds_per_byte``: what a worker
    pays per byte of memory its first task of a run touches beyond what the tasks after it
    pay, and ``first_touch_warm_bytes`` the memory each worker found warm when it was measured
    (:func:`_first_touch`; None when not measured); the time model charges each slot's first
    task with the rate for the bytes it touches beyond the warm ones
    (``explorer.plan.time_model.FirstTouch``).  Only the rate is saved: the warm bytes are the
    moment's.
    """

    bytes: int
    per_worker: dict = field(default_factory=dict)
    environment: dict | None = None
    threads: dict = field(default_factory=dict)
    source: str = "cluster"
    first_touch_seconds_per_byte: float | None = None
    first_touch_warm_bytes: int | None = None


def measure_worker_baseline(client, operator: str, *, readable=(), writable=(),
                            first_touch: bool = False) -> WorkerBaseline:
    """Load and warm ``operator`` on every worker of ``client`` and measure their resident sets.

    ``readable``/``writable``: paths every worker must be able to read / directories it
    must be able to write into.  ``first_touch``: also measure the workers'
    ``first_touch_seconds_per_byte`` and ``first_touch_warm_bytes`` (up to 512 MiB a worker,
    touched and freed: 0.05-0.1 s).  Raises :class:`WorkerError` (one line naming the first
    worker that cannot, and why) when a worker cannot load the operator (its plugin
    module missing there) or reach a path.
    """
    from explorer.measure.inworker import warm_worker
    from explorer.measure.workersetup import send_operators

    send_operators(client, operator)  # an operator of the caller's the workers cannot import
    try:
        replies = client.run(warm_worker, operator, tuple(map(str, readable)), tuple(map(str, writable)))
    except Exception as exc:  # a worker died (killed above its memory limit) or vanished meanwhile
        text = " ".join(str(exc).split())[:160]
        raise WorkerError(f"a worker was lost while loading {operator} ({type(exc).__name__}: {text}); if its "
                          f"memory limit is below an idle worker with the operator loaded, raise it") from None
    if not replies:
        raise WorkerError("the cluster has no workers")
    failed = {address: reply["error"] for address, reply in replies.items() if "error" in reply}
    if failed:
        address, error = next(iter(failed.items()))
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        hint = ""
        if "cannot load operator" in error:
            hint = "; the workers need the operator's module (EXPLORER_PLUGINS and the package) installed"
        elif "cannot read" in error or "cannot write" in error:
            hint = "; the workers must reach the input and the output's directory (a shared file system)"
        raise WorkerError(f"worker {address}{more}: {error}{hint}")
    rss = {}
    if not any(reply.get("paused") for reply in replies.values()):  # a paused worker runs no graph
        _run_warm_up_graph(client, operator, len(replies))
        from explorer.measure.inworker import resident_bytes

        rss = client.run(resident_bytes)
    rate, warm = _first_touch(client) if rss and first_touch else (None, None)
    per_worker = {address: int(rss.get(address, reply["rss_bytes"])) for address, reply in replies.items()}
    first = next(iter(replies.values()))
    return WorkerBaseline(bytes=max(per_worker.values()), per_worker=per_worker,
                          environment=first.get("environment"),
                          threads={a: r.get("threads") for a, r in replies.items()}, source="cluster",
                          first_touch_seconds_per_byte=rate, first_touch_warm_bytes=warm)


def _first_touch(client) -> tuple[float | None, int | None]:
    """``(seconds per byte, warm bytes)`` of the workers' memory
    (``explorer.measure.inworker.first_touch_seconds`` on every worker at once, so that they share
    the machine's warm pages as their first tasks will): the rate, the median over the workers
    that reached cold pages of their two cold segments' mean less a warm touch, per byte (None
    when none did); the warm bytes, the least over the workers of the bytes each touched (all
    freed at the end, so warm for the run's first tasks).  ``(None, None)`` when it could not be
    measured.  After the baseline's resident sets."""
    import numpy as np

    from explorer.measure.inworker import first_touch_seconds

    try:
        replies = client.run(first_touch_seconds)
    except Exception:  # a worker that cannot map the segments runs no plan worth timing
        return None, None
    rates, warm = [], []
    for reply in replies.values():
        warm.append(int(reply["touched_bytes"]))
        if reply["cold"]:
            cold_seconds = float(np.mean(reply["segments"][-2:])) - float(reply["warm"])
            rates.append(max(0.0, cold_seconds) / int(reply["segment_bytes"]))
    return (float(np.median(rates)) if rates else None), (min(warm) if warm else None)


#: Chunks per worker of the warm-up graph (:func:`_run_warm_up_graph`), their edge, and
#: how long it may take (it is milliseconds of work; a paused or saturated cluster is not).
WARM_UP_CHUNKS_PER_WORKER = 4
WARM_UP_CHUNK_EDGE = 16
WARM_UP_TIMEOUT_SECONDS = 60.0


def _warm_up_task(block, operator: str):
    """One warm-up task: ``operator.run`` on ``block``, reduced to one value (a fan-out's
    branches summed), so that nothing of the result stays in the worker."""
    import numpy as np

    import operators

    out = operators.get(operator).run(block)
    arrays = list(out.values()) if isinstance(out, dict) else [out]
    return np.full((1, 1, 1), sum(float(np.asarray(a, dtype=np.float64).sum()) for a in arrays))


def _run_warm_up_graph(client, operator: str, n_workers: int) -> None:
    """Run ``operator`` as tasks on a tiny random volume, a few chunks of
    ``WARM_UP_CHUNK_EDGE``^3 per worker, each chunk's task ``operator.run`` on it.

    A worker that has executed tasks holds a few MiB more than one that has only
    imported the operator (its task thread pool, the task path's buffers and lazy
    imports): the baseline is measured after this, as a production run sees it.  The
    chunks are the operator's smallest blocks, without its halo: a warm-up never runs a
    block larger than a plan's (the operator's Dask form would gather ``3 h`` per axis around
    each chunk, a 193^3 block for unet3d's halo of 48, larger than its plans' blocks and
    enough to kill a worker a plan would fit).  The volume is generated on the workers;
    nothing is stored.
    """
    import dask.array as da

    edge = WARM_UP_CHUNK_EDGE
    per_axis = max(2, round((WARM_UP_CHUNKS_PER_WORKER * n_workers) ** (1 / 3) + 0.5))
    shape = (edge * per_axis,) * 3
    x = da.random.default_rng(0).random(shape, chunks=edge, dtype="f4")
    y = x.map_blocks(_warm_up_task, operator, chunks=(1, 1, 1), dtype="f8")
    future = client.compute(y.sum())
    try:
        future.result(timeout=WARM_UP_TIMEOUT_SECONDS)
    except TimeoutError:
        future.cancel()
        raise WorkerError(f"the workers did not run a {'x'.join(map(str, shape))} warm-up volume of {operator} "
                          f"in {WARM_UP_TIMEOUT_SECONDS:.0f} s: are they paused, or busy with other work?") from None
    except Exception as exc:  # the operator's own failure, or a worker lost, on a tiny volume
        first = (str(exc).strip().splitlines() or [""])[0]
        raise WorkerError(f"{operator} failed on a {'x'.join(map(str, shape))} warm-up volume in the workers: "
                          f"{type(exc).__name__}: {first}") from None


def baseline_path(operator: str, runs_dir=None) -> Path:
    return paths.operator_dir(operator, runs_dir) / BASELINE_FILE


def with_known_rate(operator: str, baseline: WorkerBaseline, runs_dir=None) -> WorkerBaseline:
    """``baseline`` with the first-touch rate saved for its workers' machine when it measured none.

    A measurement that found no cold page (``explorer.measure.inworker.first_touch_seconds``)
    touched its capped bytes, a quarter of a worker's limit at most, all warm: its
    ``first_touch_warm_bytes`` are a lower bound of the warm memory, and say nothing of the pages
    beyond them, which a plan of larger tasks touches.  The rate is the machine's (on a VM, what
    backing a page the guest gave back costs): the one measured before on the same machine and
    environment (this machine's saved baseline, :func:`local_worker_baseline`, whose stamp and
    host match the workers') is charged beyond the warm bytes, instead of nothing.  Unchanged
    when it measured a rate, when its workers' machine is unknown or another, or when no rate
    is saved."""
    if baseline.first_touch_seconds_per_byte is not None:
        return baseline
    saved = _load_local(operator, runs_dir)
    if saved is None or saved.first_touch_seconds_per_byte is None:
        return baseline
    from explorer.core.environment import stamp_differences

    if baseline.environment is None or stamp_differences(saved.environment, baseline.environment, _baseline_keys()):
        return baseline
    from dataclasses import replace

    return replace(baseline, first_touch_seconds_per_byte=saved.first_touch_seconds_per_byte)


def save_worker_baseline(operator: str, baseline: WorkerBaseline, runs_dir=None) -> Path:
    """Save ``baseline`` as this machine's; a first-touch rate it did not measure (its workers
    found no cold page) keeps the one saved before in this environment (:func:`with_known_rate`)."""
    baseline = with_known_rate(operator, baseline, runs_dir)
    return atomic_write_text(baseline_path(operator, runs_dir), json.dumps(
        {"operator": operator, "baseline_bytes": baseline.bytes, "per_worker": baseline.per_worker,
         "environment": baseline.environment, "measured": time.time(),
         "first_touch_seconds_per_byte": baseline.first_touch_seconds_per_byte}, indent=2))


def _optional_rate(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and value >= 0 else None


def _baseline_keys() -> tuple[str, ...]:
    from explorer.core.environment import WORKER_KEYS

    return WORKER_KEYS + ("hostname",)


_LOCAL: MtimeCache[WorkerBaseline] = MtimeCache()


def _load_local(operator: str, runs_dir) -> WorkerBaseline | None:
    """The saved local baseline when it was measured in this environment, else None."""
    from explorer.core.environment import environment_stamp, stamp_differences

    def load(path):
        try:
            with open(path) as f:
                data = json.load(f)
            baseline = WorkerBaseline(bytes=int(data["baseline_bytes"]), per_worker=dict(data.get("per_worker") or {}),
                                      environment=data.get("environment"), source="local",
                                      first_touch_seconds_per_byte=_optional_rate(data.get("first_touch_seconds_per_byte")))
        except (OSError, ValueError, KeyError, TypeError):
            return None  # not ours to trust: measured again and overwritten below
        return baseline if baseline.bytes > 0 else None

    try:
        baseline = _LOCAL.get(baseline_path(operator, runs_dir), load)
    except FileNotFoundError:
        return None
    if baseline is None:
        return None
    if stamp_differences(baseline.environment, environment_stamp(operator), _baseline_keys()):
        return None
    return baseline


def local_worker_baseline(operator: str, runs_dir=None, *, measure: bool = True) -> WorkerBaseline | None:
    """This machine's worker baseline for ``operator``: saved, or measured now and saved.

    Measuring starts a one-worker ``LocalCluster`` (a few seconds, once per environment),
    its worker set up as every worker that runs our plans (``explorer.measure.workersetup``).
    ``measure=False``: None instead of measuring.
    """
    saved = _load_local(operator, runs_dir)
    if saved is not None or not measure:
        return saved
    from distributed import Client

    from explorer.measure.local_cluster import local_cluster
    from explorer.measure.workersetup import prepare_workers

    with local_cluster(1) as cluster, Client(cluster) as client:
        prepare_workers(client, operator)  # the worker the plans describe: the profiling server's allocator
        baseline = measure_worker_baseline(client, operator, first_touch=True)
    baseline.source = "local"
    save_worker_baseline(operator, baseline, runs_dir)
    return baseline

