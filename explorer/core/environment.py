"""The environment a model or a calibration was learnt in, and how it differs from this one.

Peak memory depends on more than the block shape: the operator's code, the libraries it
calls (NumPy, SciPy, torch), and, inside a Dask worker, Dask, distributed, zarr and segyio.
Everything ``explore`` saves for reuse (``model.npz``, ``calibration.json``, the worker
baseline) carries an :func:`environment_stamp`; :func:`stamp_differences` says what
changed since, so that a stale file is a warning naming the fix (``explore OPERATOR``),
never a silent reuse.

Versions are read from the installed distributions' metadata, never by importing the
packages (``recommend_chunks`` must not import torch), and cached for the process.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import platform
import sys
import warnings
from pathlib import Path

from explorer.core import paths

__all__ = [
    "ISOLATED_KEYS",
    "WORKER_KEYS",
    "StaleModelWarning",
    "environment_digest",
    "environment_stamp",
    "operator_code_version",
    "stamp_differences",
    "task_code_version",
    "warn_stale",
]

#: What an isolated profile depends on: compared for ``model.npz``.
ISOLATED_KEYS = ("operator_code", "python", "numpy", "scipy", "torch", "machine")
#: What a task inside a Dask worker depends on besides: compared for the calibration and
#: the worker baseline.
WORKER_KEYS = ISOLATED_KEYS + ("dask", "distributed", "zarr", "segyio", "task_code")
#: The files whose code runs in a worker's task around the operator's ``run``, relative to the
#: directory that holds the ``operators`` and ``explorer`` packages: the window's read (a SEG-Y,
#: a Zarr or MDIO array), the windowed task that trims the output, the store, and the hook that
#: measures the task.  What a task holds at its peak is theirs as much as the operator's: until
#: fd0c090 the windowed task kept a trimmed view of the block's output alive into the store, one
#: block more at each task's peak (first_derivative's cube tasks: 3 blocks, 2 since).
TASK_CODE_FILES = ("operators/base.py", "operators/segy.py", "explorer/runner/inputs.py",
                   "explorer/runner/writing.py", "explorer/measure/inworker.py")

_DISTRIBUTIONS = ("numpy", "scipy", "torch", "dask", "distributed", "zarr", "segyio")


class StaleModelWarning(UserWarning):
    """A saved model or calibration was learnt in another environment."""


@functools.lru_cache(maxsize=None)
def _version(distribution: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=1)
def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or ``platform.processor()`` elsewhere."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _machine() -> str:
    """``<arch> <CPU model>``: the CPU decides BLAS/oneDNN code paths and thread pools."""
    return f"{platform.machine()} {cpu_model()}".strip()


@functools.lru_cache(maxsize=None)
def _module_digest(module_name: str) -> str:
    module = sys.modules.get(module_name)
    try:
        source = inspect.getsource(module) if module is not None else module_name
    except (OSError, TypeError):
        source = module_name
    return hashlib.sha256(source.encode()).hexdigest()[:12]


def task_code_version(root: Path | None = None) -> str:
    """A digest of :data:`TASK_CODE_FILES` under ``root`` (default: this installation's), read as
    bytes, never imported: the code of memory-explorer that runs in a worker's task around the
    operator.  A calibration learnt by other task code is stale like one learnt under another
    Dask; a missing file counts by its name."""
    if root is None:
        return _installed_task_code()
    digest = hashlib.sha256()
    for name in TASK_CODE_FILES:
        path = Path(root) / name
        digest.update(name.encode() + b"\0")
        digest.update(path.read_bytes() if path.is_file() else b"missing")
    return digest.hexdigest()[:12]


@functools.lru_cache(maxsize=1)
def _installed_task_code() -> str:
    return task_code_version(paths.PACKAGES_ROOT)


def operator_code_version(operator) -> str:
    """``<module>.<class>:<version>``: the operator class's own ``version`` when it sets
    one, else a digest of the source of the module that defines it (any change to that
    module, helpers included, counts as a new operator); for a pipeline, its members'."""
    members = getattr(operator, "members", None)
    if members is not None and not isinstance(operator, type):  # a pipeline: its members' code
        return "pipeline[" + ";".join(f"{m.name}={operator_code_version(m)}" for m in members) + "]"
    cls = operator if isinstance(operator, type) else type(operator)
    version = getattr(cls, "version", None)
    return f"{cls.__module__}.{cls.__qualname__}:{version or _module_digest(cls.__module__)}"


def environment_stamp(operator=None) -> dict:
    """The environment of this process: library versions, Python, machine, the task code
    (:func:`task_code_version`), and the operator's code version when ``operator`` (a name or
    an ``Operator``) is given."""
    stamp = {name: _version(name) for name in _DISTRIBUTIONS}
    stamp["python"] = ".".join(platform.python_version_tuple()[:2])
    stamp["machine"] = _machine()
    stamp["task_code"] = task_code_version()
    stamp["hostname"] = platform.node()
    if operator is not None:
        if isinstance(operator, str):
            stamp["operator"], stamp["operator_code"] = _spec_code(operator)
        else:
            stamp["operator"], stamp["operator_code"] = operator.name, operator_code_version(operator)
    return stamp


def _spec_code(spec: str) -> tuple[str, str]:
    """A spec's operator name and code version, read at each call: a function operator defined
    again under its name has another version (a module's digest is read once: ``_module_digest``)."""
    import operators

    operator = operators.get(spec)
    return operator.name, operator_code_version(operator)


def restamped(stamp: dict | None, operator: str) -> dict | None:
    """``stamp`` (the workers' environment, measured for one operator or spec) as it reads for
    ``operator``: the same libraries and machine, ``operator``'s own name and code version (a
    pipeline's member was calibrated under its own).  None stays None."""
    if stamp is None:
        return None
    own = environment_stamp(operator)
    return {**stamp, "operator": own["operator"], "operator_code": own["operator_code"]}


def stamp_differences(saved: dict | None, current: dict, keys=ISOLATED_KEYS) -> list[str]:
    """``["numpy 2.4.6 -> 2.5.0", ...]`` over ``keys``; one line when nothing was saved."""
    if not saved:
        return ["it carries no environment stamp (saved by an older memory-explorer)"]
    return [f"{key} {saved.get(key)} -> {current.get(key)}" for key in keys
            if key in current and saved.get(key) != current.get(key)]


def warn_stale(what: str, differences: list[str], fix: str, stacklevel: int = 3) -> str | None:
    """Warn (:class:`StaleModelWarning`) that ``what`` was learnt elsewhere; return the line."""
    if not differences:
        return None
    line = f"{what} was learnt in another environment ({'; '.join(differences)}): run `{fix}` again"
    warnings.warn(line, StaleModelWarning, stacklevel=stacklevel)
    return line


def environment_digest(stamp: dict) -> str:
    """A short digest of the worker-relevant part of an environment stamp, kept with each
    in-worker observation so that a calibration uses its own environment's evidence."""
    text = json.dumps({k: stamp.get(k) for k in WORKER_KEYS}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]
