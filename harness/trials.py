"""What a run's trials tried before it ran (``explorer.runner.daskrun``, Trials), for the benchmarks' reports."""

from explorer.core.units import format_shape


def trials_note(trials) -> str:
    """One phrase: the chunks each trial timed, its measured and by-volume seconds per voxel,
    and the trials' seconds in all (``RunResult.trials``)."""
    tried = ", ".join((f"{t['operator']} of staged " if t.get("strategy") == "staged" else "")
                      + f"{format_shape(t['chunks'])} {1e9 * t.get('measured_seconds_per_voxel', float('nan')):.0f} "
                      f"ns/voxel (by volume {1e9 * (t.get('predicted_seconds_per_voxel') or float('nan')):.0f})"
                      for t in trials)
    return f"first run's trials ({sum(t['seconds'] for t in trials):.1f} s before it ran): {tried}"


def trials_text(trials) -> str:
    """Shorter: each tried chunk shape, and the trials' seconds in all ("none" without any)."""
    if not trials:
        return "none"
    return (", ".join("x".join(map(str, t["chunks"])) for t in trials)
            + f" ({sum(t['seconds'] for t in trials):.1f} s)")
