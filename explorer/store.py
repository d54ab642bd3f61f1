"""Every finished profile and production observation, persisted at once in Optuna.

One Optuna study per operator and environment (the library versions that
decide an operator's memory, and the dtype), by default in an SQLite file
under the runs directory, or in any Optuna storage: an RDB URL
(``postgresql://...``, ``sqlite:///...``) or a journal file shared by several
machines (``journal:/path/to/file.log``).

A trial's params are the shape (``n1``, ``n2``, ``n3``), its value is
``peak_bytes``, and everything else is a user attribute.  ``source`` says what a record
is: an isolated ``profile``, a task inside a Dask worker (``production``, or an
explore ``probe``), or a whole ``run`` (its shape the chunk, its value the largest
worker high-water mark).  Profiles that did
not end ``ok`` are kept as FAIL trials with their status (an ``exceeded``
profile carries its lower bound).  Each record is written by one
``add_trial`` call, a single transaction in an RDB storage and a single
appended line in a journal, so an interruption loses no finished record and
leaves none half-written.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy

from explorer import paths

#: Isolated profiles (``explorer.profiling``).
SOURCE_PROFILE = "profile"
#: Tasks observed inside Dask workers: production runs, and explore's in-worker probes.
SOURCE_PRODUCTION = "production"
SOURCE_PROBE = "probe"
#: One record per observed run: its wall time, slots and worker high-water mark
#: (``explorer.daskrun``); the calibration learns the time model's overhead from them.
SOURCE_RUN = "run"

_AXES = ("n1", "n2", "n3")
_DIM_MAX = 1 << 24


def environment(dtype: str = "float32") -> dict[str, str]:
    """What an operator's memory depends on besides the shape."""
    return {
        "dtype": str(np.dtype(dtype)),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "python": ".".join(platform.python_version_tuple()[:2]),
    }


def study_name(operator: str, dtype: str = "float32") -> str:
    env = environment(dtype)
    return f"{operator}:{env['dtype']}:numpy-{env['numpy']}:scipy-{env['scipy']}:py{env['python']}"


def default_storage_url(runs_dir=None) -> str:
    path = paths.runs_dir(runs_dir) / "studies.sqlite3"
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path.resolve()}"


def _open_storage(url: str):
    import optuna

    if url.startswith("journal:"):
        from optuna.storages.journal import JournalFileBackend

        path = Path(url[len("journal:"):]).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        return optuna.storages.JournalStorage(JournalFileBackend(str(path)))
    return optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {})


@dataclass
class Record:
    """One stored observation of an operator's peak memory at one shape."""

    shape: tuple[int, int, int]
    peak_bytes: float | None
    status: str
    source: str
    repeats: list[float] = field(default_factory=list)
    seconds: float | None = None
    input_bytes: int | None = None
    context: dict = field(default_factory=dict)
    number: int | None = None


class Store:
    """The operator studies in one storage (default: SQLite under ``runs/``)."""

    def __init__(self, runs_dir=None, storage: str | None = None):
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.runs_dir = paths.runs_dir(runs_dir)
        self.url = storage or default_storage_url(runs_dir)
        self._storage = _open_storage(self.url)
        self._studies: dict[tuple[str, str], object] = {}

    def study(self, operator: str, dtype: str = "float32"):
        import optuna

        key = (operator, str(np.dtype(dtype)))
        if key not in self._studies:
            study = optuna.create_study(
                study_name=study_name(operator, dtype),
                storage=self._storage,
                direction="minimize",
                load_if_exists=True,
            )
            if not study.user_attrs:
                study.set_user_attr("operator", operator)
                for name, value in environment(dtype).items():
                    study.set_user_attr(name, value)
            self._studies[key] = study
        return self._studies[key]

    def _add(self, operator, dtype, shape, value, status, attrs):
        import optuna
        from optuna.distributions import IntDistribution

        state = optuna.trial.TrialState.COMPLETE if status == "ok" else optuna.trial.TrialState.FAIL
        trial = optuna.trial.create_trial(
            params={axis: int(n) for axis, n in zip(_AXES, shape)},
            distributions={axis: IntDistribution(1, _DIM_MAX, log=True) for axis in _AXES},
            value=float(value) if state == optuna.trial.TrialState.COMPLETE else None,
            user_attrs={"status": status, **attrs},
            state=state,
        )
        self.study(operator, dtype).add_trial(trial)

    def add_measurement(self, m, source: str = SOURCE_PROFILE, context: dict | None = None) -> None:
        """Persist one :class:`explorer.profiling.Measurement` (any status)."""
        attrs = {
            "source": source,
            "peak_bytes": m.peak_bytes,
            "repeats": [r.get("peak_bytes") for r in m.repeats if r.get("peak_bytes") is not None],
            "seconds": m.seconds,
            "input_bytes": m.input_bytes,
            "output_bytes": m.output_bytes,
            "process_peak_bytes": m.process_peak_bytes,
            "memory_cap_bytes": m.memory_cap_bytes,
            "error": m.error,
            "context": context or {},
        }
        self._add(m.operator, m.dtype, m.shape, m.peak_bytes, m.status, attrs)

    def add_observation(self, operator: str, shape, peak_bytes: float, *, source: str = SOURCE_PRODUCTION,
                        dtype: str = "float32", context: dict | None = None, status: str = "ok") -> None:
        """Persist one observation made elsewhere (a production task's peak)."""
        attrs = {"source": source, "peak_bytes": peak_bytes, "repeats": [peak_bytes], "context": context or {}}
        self._add(operator, dtype, shape, peak_bytes, status, attrs)

    def records(self, operator: str, dtype: str = "float32", source: str | None = None) -> list[Record]:
        out = []
        for trial in self.study(operator, dtype).get_trials(deepcopy=False):
            attrs = trial.user_attrs
            if source is not None and attrs.get("source") != source:
                continue
            out.append(
                Record(
                    shape=tuple(int(trial.params[a]) for a in _AXES),
                    peak_bytes=attrs.get("peak_bytes"),
                    status=attrs.get("status", "ok"),
                    source=attrs.get("source", SOURCE_PROFILE),
                    repeats=list(attrs.get("repeats") or []),
                    seconds=attrs.get("seconds"),
                    input_bytes=attrs.get("input_bytes"),
                    context=dict(attrs.get("context") or {}),
                    number=trial.number,
                )
            )
        return out
