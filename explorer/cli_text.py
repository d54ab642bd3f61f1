"""How the ``explore`` command reads results as text: probe progress, in-worker probes, the
strategies a plan weighed (``explorer.cli`` prints them)."""

from __future__ import annotations

import sys

from explorer.core.units import format_bytes, format_shape


def probe_progress(index, total, block, r) -> None:
    if r.status != "ok":
        line = f"{r.status}: {r.error}"
    else:
        line = (f"{r.n_tasks} tasks in a Dask worker, {r.seconds:.1f} s, worker baseline "
                f"{format_bytes(r.worker_baseline_bytes)}")
    print(f"[probe {index}/{total}] {format_shape(block):>15}  {line}", file=sys.stderr, flush=True)


def print_probes(probes: dict | None) -> None:
    if not probes:
        return
    if probes.get("skipped"):
        print(f"in-worker probes: skipped ({probes['skipped']})")
        return
    for line in probes.get("warnings", []):
        print(f"warning: {line}", file=sys.stderr)
    cal = probes.get("calibration")
    excess = (cal or {}).get("excess")
    if excess is None:
        print(f"in-worker probes: {len(probes['runs'])} in {probes['seconds']:.1f} s; the excess is not identified")
        return
    timing = cal["timing"]
    print(f"in-worker probes: {len(probes['runs'])} in {probes['seconds']:.1f} s; a task in a worker needs the "
          f"isolated peak {excess['intercept_bytes'] / 2**20:+.2f} MiB {excess['bytes_per_voxel']:+.2f} B/voxel "
          f"(residual sd {format_bytes(excess['residual_sd'])}, {excess['method']} quantile)"
          + within_text(cal.get("within")) + f"; idle worker {format_bytes(probes['baseline_bytes'])}")
    if timing.get("seconds_per_voxel") is not None:
        g, fixed = timing.get("graph_task_seconds"), timing.get("run_fixed_seconds")
        print(f"in-worker time: {timing['operator_seconds_per_voxel'] * 1e9:.0f} ns/voxel in the operator, "
              f"{timing['io_seconds_per_voxel'] * 1e9:.0f} ns/voxel around it"
              + (f", {g * 1e3:.1f} ms per graph task" if g is not None else "")
              + (f", {fixed:.2f} s per run" if fixed is not None else ""))


def within_text(within: dict | None) -> str:
    """How much equal tasks of one run differ (``explorer.plan.excess.WithinFit``)."""
    if not within:
        return ""
    return (f", tasks of one run within sd {format_bytes(within['alpha_bytes'])} + {within['beta']:.1%} "
            f"({within['method']} quantile)")


def considered_text(plan) -> str:
    """The strategies weighed, one phrase each: chunks and predicted seconds, or why none."""
    parts = []
    for name, c in plan.considered.items():
        if "error" in c:
            parts.append(f"{name}: none fits" if "fits" in c["error"] else f"{name}: {c['error']}")
        else:
            parts.append(f"{name}: {format_shape(c['chunks'])} ~{c['predicted_seconds']:.3g} s, "
                         f"bound {format_bytes(c['upper_bytes'])}"
                         + ("" if c.get("in_worker_calibrated", True) else " without in-worker calibration"))
    return "; ".join(parts)


def print_timings(timings: dict, total_seconds: float) -> None:
    """``explore --timings``: each section's seconds, entries and share of the wall time, to stderr
    (nested sections are parts of their parent: ``ExploreResult.timings``)."""
    print(f"\nwhere the {total_seconds:.1f} s went:", file=sys.stderr)
    for name, t in timings.items():
        share = t["seconds"] / total_seconds if total_seconds > 0 else 0.0
        print(f"  {name:<38} {t['seconds']:>8.2f} s  {share:>6.1%}  ({t['count']}x)", file=sys.stderr)
