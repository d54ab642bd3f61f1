"""The loop's profiling side: claim each shape in the store, profile the claimed ones (each an
isolated child), write each measurement onto its claim at once, and keep the steps, the
operator's seconds and the loop's own seconds per profile (``explorer.exploration.explore``).

Several processes may share one store: a shape another process holds or has profiled is not
claimed, and none once the finished profiles plus the live claims number the budget.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass

import numpy as np

from explorer.measure.profiling import SessionProfiler
from explorer.search import acquisition
from explorer.search.core import DEFAULT_LOOP_OVERHEAD
from explorer.search.store import SOURCE_PROFILE, Record, Store

#: Profiling servers a profile's repeats take turns in (``profiling.SessionProfiler``): the run
#: noise the repeats measure is then that of a new run in another process.
PROFILE_SESSIONS = 2
#: Seconds a claim on a shape holds at least (longer for a profile with a longer timeout):
#: another process's expired claim is ignored, so a killed explore elsewhere blocks nothing for ever.
CLAIM_SECONDS = 2 * 3600.0


@dataclass
class Step:
    """One profile as the loop saw it (for progress and the report)."""

    index: int
    shape: tuple[int, ...]
    status: str
    peak_bytes: float | None
    seconds: float | None
    max_relative_uncertainty: float | None
    #: The worker that profiled it (``explore --scheduler``), or None: this machine.
    profiled_on: str | None = None


def local_profilers(jobs: int | None) -> list[SessionProfiler]:
    """One :class:`SessionProfiler` per job, its servers started (not waited for)."""
    return [SessionProfiler(PROFILE_SESSIONS, gpu=False).launch() for _ in range(jobs or 1)]


def close_all(profilers) -> None:
    for profiler in profilers or ():
        profiler.close()


class ProfileBatches:
    """The loop's profiling side: claim shapes in the store, profile them (one profiling
    session per job), write each measurement onto its claim at once, and keep the steps, the
    operator's seconds, the loop's own seconds per profile and the cost model of a profile."""

    def __init__(self, store: Store, operator: str, *, budget: int, repeat: int, memory_cap: int, jobs: int,
                 on_start=None, progress=None, profilers=None):
        """``profilers``: one per job, each with ``profile`` and ``close`` (default: ``jobs``
        :class:`SessionProfiler` here; ``explorer.measure.worker_profiling.WorkerProfiler`` on a
        cluster, whose ``profile`` returns None when its worker was lost)."""
        self.store, self.operator, self.budget, self.repeat, self.memory_cap = store, operator, budget, repeat, memory_cap
        self.on_start, self.progress = on_start, progress
        self.profilers = list(profilers) if profilers else local_profilers(jobs)
        self.cost_model = acquisition.CostModel(DEFAULT_LOOP_OVERHEAD + repeat * 0.01, repeat * 5e-8)
        self.steps: list[Step] = []
        self.operator_seconds = 0.0
        #: The model's half-width when the latest profile finished (the steps' uncertainty).
        self.metric: float | None = None
        self.loop_overhead: list[float] = []  # seconds per profile the loop spends outside the operator
        self._last_batch_end = time.perf_counter()

    @property
    def metric(self) -> float | None:
        return self._metric

    @metric.setter
    def metric(self, value) -> None:
        self._metric = value
        if self.steps:
            self.steps[-1].max_relative_uncertainty = value

    def stored_profiles(self) -> list[Record]:
        """Everyone's finished profiles, re-read: other processes may share the store."""
        return [r for r in self.store.records(self.operator) if r.source == SOURCE_PROFILE]

    def run(self, shapes, purpose: str = "design") -> int:
        """Claim each shape in the store, profile the claimed ones, write each onto its claim at once.

        Returns how many were claimed: a shape another process holds or has profiled is
        skipped, and none is claimed once profiles plus live claims reach the budget.
        """
        store = self.store
        profilers = [p for p in self.profilers if not getattr(p, "lost", None)]
        if not profilers:
            raise RuntimeError("every worker profiling was lost: "
                               + "; ".join(f"{p.address} {p.lost}" for p in self.profilers))
        claims = [c for c in (store.claim(self.operator, s, budget=self.budget, seconds=self.claim_seconds(s))
                              for s in shapes[:len(profilers)]) if c.held]
        if not claims:
            return 0
        spent_before = self.operator_seconds
        if self.on_start:
            for c in claims:
                predicted = self.cost_model.predict(np.asarray([c.shape]))[0] if self.cost_model.fitted else None
                self.on_start(c.shape, purpose, predicted)
        try:
            with ThreadPoolExecutor(max_workers=len(claims)) as pool:
                futures = {pool.submit(profilers[i].profile, self.operator, c.shape, repeat=self.repeat,
                                       memory_cap=self.memory_cap, timeout=self.timeout_for(c.shape)): (c, profilers[i])
                           for i, c in enumerate(claims)}
                for future in as_completed(futures):
                    m = future.result()
                    claim, profiler = futures[future]
                    where = getattr(profiler, "address", None)
                    if m is None:  # its worker was lost: this profile only; the claim is released below
                        self.steps.append(Step(len(self.stored_profiles()), claim.shape, f"lost ({profiler.lost})",
                                               None, None, self.metric, where))
                    else:
                        # at once: nothing finished is lost
                        store.finish(claim, m, context={"profiled_on": where} if where else None)
                        self.operator_seconds += sum(r.get("seconds") or 0.0 for r in m.repeats)
                        self.steps.append(Step(len(self.stored_profiles()), m.shape, m.status, m.peak_bytes,
                                               m.seconds, self.metric, where))
                    if self.progress:
                        self.progress(self.steps[-1], self.budget)
        finally:
            for c in claims:  # claims left unfinished by an error: free them for others now
                store.release(c)
        now = time.perf_counter()
        self.loop_overhead.append(max(0.0, (now - self._last_batch_end)
                                      - (self.operator_seconds - spent_before) / len(claims)))
        self._last_batch_end = now
        return len(claims)

    @property
    def environment(self) -> dict | None:
        """The environment stamp of the workers that profiled (None: profiled on this machine)."""
        return next((p.environment for p in self.profilers if getattr(p, "environment", None)), None)

    def timeout_for(self, shape) -> float | None:
        """A profile's timeout: 20 times its predicted seconds, at least a minute; none before
        any profile was timed."""
        predicted = self.cost_model.predict(np.asarray([shape]))[0] if self.cost_model.fitted else None
        return None if predicted is None else max(60.0, 20 * float(predicted))

    def claim_seconds(self, shape) -> float:
        timeout = self.timeout_for(shape)
        return CLAIM_SECONDS if timeout is None else max(CLAIM_SECONDS, 2 * self.repeat * timeout)

    def close(self) -> None:
        close_all(self.profilers)
