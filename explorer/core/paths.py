"""Where things live under the runs directory (one place for every path)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

#: Environment variable that overrides the default runs directory.
RUNS_ENV = "EXPLORER_RUNS"
#: The directory that holds the ``operators`` and ``explorer`` packages (a checkout, or site-packages).
PACKAGES_ROOT = Path(__file__).resolve().parents[2]


def runs_dir(path: str | os.PathLike | None = None) -> Path:
    """The runs directory: ``path``, else ``$EXPLORER_RUNS``, else ``./runs``."""
    if path is None:
        path = os.environ.get(RUNS_ENV) or "runs"
    return Path(path).expanduser()


def operator_dir(operator: str, runs: str | os.PathLike | None = None) -> Path:
    """``<runs>/<operator>/``: the operator's saved model fit and reports.  ``ValueError`` for a
    name that is not one path component inside the runs directory (a separator, ``.``, ``..``,
    a leading dot or a NUL): no name may lead a write outside it."""
    name = str(operator)
    if (not name or name in (".", "..") or name.startswith(".") or "\0" in name
            or any(sep in name for sep in {"/", os.sep, os.altsep} if sep)):
        raise ValueError(f"operator name {name!r} cannot name a directory inside the runs directory")
    return runs_dir(runs) / name


def model_path(operator: str, runs: str | os.PathLike | None = None) -> Path:
    """The saved surrogate fit, loadable without torch."""
    return operator_dir(operator, runs) / "model.npz"


def report_path(operator: str, runs: str | os.PathLike | None = None) -> Path:
    return operator_dir(operator, runs) / "report.png"


def explore_command(operator: str, verb: str = "") -> str:
    """``explore SPEC`` (or ``explore VERB SPEC``), quoted for a POSIX shell when the spec
    needs it (``explore 'gaussian(sigma=4),gst3d'``): the fix error messages name."""
    import shlex

    return " ".join(["explore", *([verb] if verb else []), shlex.quote(operator)])


def calibrate_command(operator: str) -> str:
    """``explore calibrate SPEC``, quoted like :func:`explore_command`: the in-worker probes alone."""
    return explore_command(operator, "calibrate")


def module_child(module: str, **env) -> tuple[list[str], dict]:
    """``(argv, environment)`` of a child that runs ``python -P -m module`` of this installation,
    with ``env`` added to this process's environment: ``PYTHONPATH`` led by
    :data:`PACKAGES_ROOT`, so a checkout that is not installed is found, and ``-P``, so no file in
    the working directory shadows a module the child imports (a ``grp.py`` there broke torch's)."""
    environment = dict(os.environ, **env)
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGES_ROOT), environment.get("PYTHONPATH")]))
    return [sys.executable, "-P", "-m", module], environment
