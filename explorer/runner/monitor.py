"""Watching a running computation: the interrupt that stops it, the monitor of its workers'
memory and progress, and the re-planner that restarts it early with a plan that fits.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from explorer.runner.context import SAMPLE_SECONDS, _one_line

if TYPE_CHECKING:
    from explorer.runner.context import RunContext


# --------------------------------------------------------------------------- monitor


class _Interrupt:
    """Cancels a running computation from another thread, saying why (``stall`` or ``replan``)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.reason: str | None = None
        self.message = ""
        self.plan = None
        self._client = self._futures = None

    def arm(self, client, futures) -> None:
        with self._lock:
            self._client, self._futures = client, futures
            self.reason, self.message, self.plan = None, "", None

    def disarm(self) -> None:
        with self._lock:
            self._client = self._futures = None

    def __call__(self, reason: str, message: str = "", plan=None) -> bool:
        """Cancel the armed computation (first caller wins); False when none is armed."""
        with self._lock:
            if self._futures is None or self.reason is not None:
                return False
            self.reason, self.message, self.plan = reason, message, plan
            client, futures = self._client, self._futures
        client.cancel(futures)
        return True


class _Monitor(threading.Thread):
    """Samples the workers' memory metrics every ``SAMPLE_SECONDS`` and keeps, per worker
    address, the maximum; interrupts the computation when every worker stays paused or
    gone for ``stall_seconds``."""

    def __init__(self, client, interrupt: _Interrupt, stall_seconds: float):
        super().__init__(name="explorer-worker-monitor", daemon=True)
        self.client = client
        self.interrupt = interrupt
        self.stall_seconds = stall_seconds
        self.peaks: dict[str, int] = {}
        self.stalled_since: float | None = None
        self.stall_reason = ""
        self._halt = threading.Event()
        self._lock = threading.Lock()

    def sample(self) -> None:
        workers = self.client.scheduler_info(n_workers=-1).get("workers", {})
        with self._lock:
            for address, info in workers.items():
                memory = int((info.get("metrics") or {}).get("memory") or 0)
                self.peaks[address] = max(self.peaks.get(address, 0), memory)
            statuses = [str(info.get("status", "running")).lower() for info in workers.values()]
            if not workers or all("paused" in s for s in statuses):
                if self.stalled_since is None:
                    self.stalled_since = time.monotonic()
                self.stall_reason = ("no worker is connected" if not workers else
                                     "every worker is paused (memory above the pause threshold)")
            else:
                self.stalled_since = None
        if self.stalled_since is not None and time.monotonic() - self.stalled_since > self.stall_seconds:
            self.interrupt("stall", f"no progress for {self.stall_seconds:g} s: {self.stall_reason}")

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


class _Replanner(threading.Thread):
    """Decides whether tasks over their bound restart the run with a new plan (at most once).

    Woken by the observer's ``on_over_bound``: flushes the observations, recalibrates
    (every in-worker group of this environment, the run's own included), and asks
    ``explorer.plan.planner.replan`` (the policy); a new plan interrupts the computation.
    While the run's groups do not yet identify the in-worker excess
    (``explorer.plan.excess.fit_excess``), it waits for the next task over the bound.
    Runs beside the computation so the main thread only waits on it.
    """

    def __init__(self, ctx: RunContext, interrupt: _Interrupt):
        super().__init__(name="explorer-replanner", daemon=True)
        self.ctx = ctx
        self.interrupt = interrupt
        self.wanted = threading.Event()
        self._halt = threading.Event()

    def on_over_bound(self, _observation) -> None:
        self.wanted.set()

    def run(self) -> None:
        while not self._halt.is_set():
            if self.wanted.wait(0.1):
                self.wanted.clear()
                if self._decide():
                    return

    def stop(self) -> None:
        self._halt.set()

    def _decide(self) -> bool:
        """True once decided (restarted, carried on, or failed); False to wait for more evidence."""
        ctx = self.ctx
        from explorer.plan.task_model import TaskModel
        from explorer.plan.calibration import calibrate
        from explorer.plan.planner import REPLAN_MAX_DONE_FRACTION, replan
        from explorer.plan.chunk_plan import ChunkPlanError

        done_fraction = ctx.done / max(ctx.total, 1)
        if done_fraction > REPLAN_MAX_DONE_FRACTION:
            return True
        ctx.observer.flush()
        try:
            cal = calibrate(ctx.operator.name, ctx.observer.store, ctx.model.isolated, confidence=ctx.confidence,
                            runs_dir=ctx.runs_dir, environment=ctx.baseline.environment)
            if cal is None or cal.excess is None:
                return False
            ctx.result.calibration = cal.to_dict()
            model = TaskModel(ctx.model.isolated, cal, ctx.baseline.environment)
            ctx.observer.model = model  # later tasks are checked against the recalibrated bound
            new = replan(ctx.plan, model.predict_many, done_fraction=done_fraction)
        except (ChunkPlanError, ValueError, OSError) as exc:
            ctx.result.warnings.append(f"re-planning failed, the run continues with its plan: {_one_line(exc)}")
            return True
        if new is None:
            ctx.result.warnings.append("tasks exceeded their bound, but the running plan still fits its budget "
                                       "under the recalibrated model: not re-planned")
        else:
            self.interrupt("replan", plan=new)
        return True
