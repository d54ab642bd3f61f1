"""Every finished profile and production observation, persisted at once in Optuna;
and the claims that let several ``explore`` processes share one store.

One Optuna study per operator and environment (the library versions that
decide an operator's memory, and the dtype), by default in an SQLite file
under the runs directory, or in any Optuna storage: an RDB URL
(``postgresql://...``, ``sqlite:///...``) or a journal file shared by several
machines (``journal:/path/to/file.log``).  Any other URL raises
:class:`StorageError`, one line naming the URL and the accepted forms.

A trial's params are the shape (``n1``, ``n2``, ``n3``), its value is
``peak_bytes``, and everything else is a user attribute.  ``source`` says what a record
is: an isolated ``profile``, a task inside a Dask worker (``production``, or an
explore ``probe``), or a whole ``run`` (its shape the chunk, its value the largest
worker high-water mark).  Profiles that did
not end ``ok`` are kept as FAIL trials with their status (an ``exceeded``
profile carries its lower bound).  A record added by ``add_measurement`` or
``add_observation`` is written by one ``add_trial`` call, a single
transaction in an RDB storage and a single appended line in a journal, so an
interruption loses no finished record and leaves none half-written.

Claims
------
Before ``explore`` profiles a shape it claims it (:meth:`Store.claim`): a
RUNNING trial with the shape's params, ``source="profile"``,
``status="claimed"``, its owner (``host:pid``, plus the process's start time)
and an expiry time.  The claim then re-reads the study and gives itself up
(FAIL, status ``duplicate-claim`` or ``over-budget``) if an earlier trial
(lower number) holds the same shape, or if the finished profiles and live
claims numbered before it already fill the budget.  Trial numbers follow
commit order in SQLite (one writer at a time), in a journal (one appended
line at a time) and in Optuna's RDB storage (a trial is created under a
row lock on its study), so of two claims on one shape the later always sees
the earlier: while claims are live no shape is profiled twice and the
budget is never exceeded, however many processes share the store.  The finished profile is written
onto its own claim (:meth:`Store.finish`: user attributes first, then the
value and state in one last write), so there is one trial per profile;
until that last write it is a claim, never a record.  A claim whose profile
could not be made (an error in this process) is given up as ``released``.

A claim is live until it is finished or given up, its expiry time passes,
or (seen from its own machine) its process is gone, so a killed ``explore``
blocks nothing on its machine, and elsewhere nothing beyond the expiry.  :meth:`Store.records` never returns claims;
:meth:`Store.live_claims` does.

Creation
--------
Opening a fresh SQLite file or journal and creating a study are done under
an exclusive ``flock`` on ``<file>.create-lock`` beside it, so processes on
one machine (or on a file system with working ``flock``) can start together
on a fresh store.  On a server RDB the same steps are retried a few times
when a concurrent creator wins a race.
"""

from __future__ import annotations

import contextlib
import os
import platform
import random
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy

from explorer.core import paths

#: Isolated profiles (``explorer.measure.profiling``).
SOURCE_PROFILE = "profile"
#: Tasks observed inside Dask workers: production runs, and explore's in-worker probes.
SOURCE_PRODUCTION = "production"
SOURCE_PROBE = "probe"
#: One record per observed run: its wall time, slots and worker high-water mark
#: (``explorer.runner.daskrun``); the calibration learns the time model's overhead from them.
SOURCE_RUN = "run"

#: The status of a claim while its profile runs.
CLAIMED = "claimed"
#: Statuses of claims given up: never a record, never counted.
DUPLICATE_CLAIM = "duplicate-claim"
OVER_BUDGET = "over-budget"
RELEASED = "released"
GIVEN_UP = frozenset({DUPLICATE_CLAIM, OVER_BUDGET, RELEASED})
#: Why :meth:`Store.claim` did not claim a shape before creating anything.
TAKEN = "taken"
BUDGET_SPENT = "budget-spent"

#: The accepted ``--storage`` forms, as error messages name them.
STORAGE_FORMS = ("sqlite:///PATH, postgresql://USER:PASSWORD@HOST/DATABASE (or another SQLAlchemy "
                 "database URL whose driver is installed), or journal:PATH")
#: Attempts at opening a server RDB and creating a study before giving up on a race.
CREATE_ATTEMPTS = 5

_AXES = ("n1", "n2", "n3")
_DIM_MAX = 1 << 24


class StorageError(ValueError):
    """A storage URL that cannot be opened: one line, naming the URL and the accepted forms."""


def environment(dtype: str = "float32") -> dict[str, str]:
    """What an operator's memory depends on besides the shape."""
    return {
        "dtype": str(np.dtype(dtype)),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "python": ".".join(platform.python_version_tuple()[:2]),
    }


def study_name(operator: str, dtype: str = "float32") -> str:
    """The study of ``operator``'s profiles: its key (a function operator's carries its code's
    digest: ``operators.functional.study_key``) and what else its memory depends on."""
    import operators
    from operators.functional import study_key

    env = environment(dtype)
    return f"{study_key(operators.get(operator))}:{env['dtype']}:numpy-{env['numpy']}:scipy-{env['scipy']}:py{env['python']}"


def default_storage_url(runs_dir=None) -> str:
    path = paths.runs_dir(runs_dir) / "studies.sqlite3"
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path.resolve()}"


# -- opening a storage -------------------------------------------------------
def _display_url(url: str) -> str:
    """``url`` with any password hidden."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not an SQLAlchemy URL: nothing to hide
        return url


def storage_error(url: str, reason: str) -> StorageError:
    """A URL the user typed that names no storage: the reason and the accepted forms."""
    reason = (reason.strip().splitlines() or [""])[0]
    return StorageError(f"cannot open storage {_display_url(url)!r}: {reason}; expected {STORAGE_FORMS}")


#: What SQLite says, and what it means for the store's file (``store_problem``).
_SQLITE_PROBLEMS = (
    (("file is not a database", "database disk image is malformed", "file is encrypted"),
     "is not a readable SQLite database (corrupt, or another kind of file): move it aside (nothing in it is "
     "deleted) and run again, or choose another --runs-dir"),
    (("database is locked", "database table is locked"),
     "is locked by another process that kept it for over a minute: wait for that process, or stop it"),
    (("readonly database", "unable to open database file", "permission denied", "read-only file system"),
     "cannot be written (read-only, or its directory is not writable or not a directory): give it write "
     "permission, or choose another --runs-dir"),
)


def store_problem(url: str, local: Path | None, text: str) -> StorageError:
    """A storage that could not be opened, said for what it is: the store's file corrupt, locked or
    read-only (SQLite's messages), else the error with the accepted URL forms."""
    lower = text.lower()
    if local is not None:
        for needles, meaning in _SQLITE_PROBLEMS:
            if any(needle in lower for needle in needles):
                return StorageError(f"the store {local} {meaning}")
    return storage_error(url, text)


def local_file(url: str) -> Path | None:
    """The file a ``journal:PATH`` or ``sqlite:///PATH`` URL names, or None (a server).

    Raises :class:`StorageError` for a URL that is neither a journal nor an SQLAlchemy URL, and
    for an in-memory SQLite store (``sqlite://``, ``sqlite:///``, ``sqlite:///:memory:``): no
    finished measurement may be lost.
    """
    if url.startswith("journal:"):
        path = url[len("journal:"):]
        if not path.strip():
            raise storage_error(url, "a journal needs a file path")
        return Path(path).expanduser()
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        raise storage_error(url, "not a storage URL") from None
    if parsed.get_backend_name() == "sqlite":
        if parsed.database in (None, "", ":memory:"):
            raise storage_error(url, "an in-memory SQLite store would lose every measurement when the process "
                                     "ends; name a file (sqlite:///PATH)")
        return Path(parsed.database).expanduser()
    return None


@contextlib.contextmanager
def _creation_lock(path: Path | None):
    """An exclusive ``flock`` on ``<path>.create-lock`` (nothing for a server storage)."""
    if path is None:
        yield
        return
    import fcntl

    with open(path.with_name(path.name + ".create-lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _race_errors() -> tuple[type[BaseException], ...]:
    """What a concurrent creator of the same tables or study makes a server RDB raise."""
    import optuna
    import sqlalchemy.exc

    return (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.OperationalError,
            optuna.exceptions.DuplicatedStudyError, optuna.exceptions.StorageInternalError)


def _race_free(url: str, local: Path | None, action):
    """``action()`` under the creation lock of a local file, or retried on a server's creation races."""
    if local is not None:
        with _creation_lock(local):
            return action()
    for attempt in range(CREATE_ATTEMPTS):
        try:
            return action()
        except _race_errors() as exc:
            if attempt == CREATE_ATTEMPTS - 1:
                raise storage_error(url, str(exc)) from None
            time.sleep(0.2 * (attempt + 1) * (1 + random.random()))
    raise AssertionError("not reached")


def _open_storage(url: str):
    """The Optuna storage ``url`` names, created safely if several processes open it at once.

    Raises :class:`StorageError` when it cannot be opened (bad URL, missing driver,
    unreachable server, unwritable file).
    """
    import optuna
    import sqlalchemy.exc

    local = local_file(url)

    def open_it():
        if url.startswith("journal:"):
            from optuna.storages.journal import JournalFileBackend

            return optuna.storages.JournalStorage(JournalFileBackend(str(local)))
        sqlite = url.startswith("sqlite")
        return optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 60}} if sqlite else {})

    try:
        if local is not None:
            local.parent.mkdir(parents=True, exist_ok=True)
        return _race_free(url, local, open_it)
    except StorageError:
        raise
    except (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.OptunaError, ImportError, OSError, ValueError) as exc:
        cause = f" ({exc.__cause__})" if exc.__cause__ is not None else ""
        raise store_problem(url, local, (str(exc) or type(exc).__name__) + cause) from None


# -- records and claims --------------------------------------------------------
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
    #: What went wrong, for a profile that did not end ``ok`` or ``exceeded``.
    error: str | None = None


@dataclass(frozen=True)
class ClaimOwner:
    """The process a claim belongs to: its host, pid and start time (pids are reused)."""

    host: str
    pid: int
    started: float

    @classmethod
    def this_process(cls) -> "ClaimOwner":
        import psutil

        return cls(socket.gethostname(), os.getpid(), psutil.Process().create_time())

    def __str__(self) -> str:
        return f"{self.host}:{self.pid}"


@dataclass
class Claim:
    """A shape claimed for profiling: held (``refused is None``) or not, and why."""

    operator: str
    dtype: str
    shape: tuple[int, int, int]
    owner: str
    expires: float
    trial_id: int | None = None
    number: int | None = None
    refused: str | None = None
    finished: bool = False

    @property
    def held(self) -> bool:
        """Claimed by this process and not finished yet."""
        return self.refused is None and not self.finished


def _process_alive(pid: int, started: float) -> bool:
    """Whether the process ``pid`` started at ``started`` still runs on this machine."""
    import psutil

    try:
        process = psutil.Process(pid)
        return abs(process.create_time() - started) < 1.0 and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def is_live_claim(attrs: dict, running: bool, now: float, this_host: str, process_alive=_process_alive) -> bool:
    """Whether a trial (its user attributes, whether it is RUNNING) is a claim still in force.

    A claim ends when its trial finishes, at its expiry time, or when its process
    is gone (checked only for claims made on this host).
    """
    if not running or attrs.get("source") != SOURCE_PROFILE or "claim_expires" not in attrs:
        return False
    if float(attrs["claim_expires"]) <= now:
        return False
    host, _, pid = str(attrs.get("claim_owner", "")).rpartition(":")
    if host == this_host and pid.isdigit():
        return process_alive(int(pid), float(attrs.get("claim_process_started", 0.0)))
    return True


@dataclass(frozen=True)
class Entry:
    """What counts against the budget: a finished profile or a live claim, in trial-number order."""

    number: int
    shape: tuple[int, int, int]
    claim: bool


def claim_verdict(entries: list[Entry], ours: Entry, budget: int) -> str | None:
    """Why the claim ``ours`` must be given up (None: it holds).

    Only entries numbered before ours count: an earlier one on the same shape
    makes ours a duplicate; ``budget`` of them fill the budget.
    """
    earlier = [e for e in entries if e.number < ours.number]
    if any(e.shape == ours.shape for e in earlier):
        return DUPLICATE_CLAIM
    if len(earlier) + 1 > budget:
        return OVER_BUDGET
    return None


def _shape_of(trial) -> tuple[int, int, int] | None:
    try:
        return tuple(int(trial.params[a]) for a in _AXES)
    except KeyError:
        return None


def _is_record(trial) -> bool:
    """A finished trial that is not a given-up claim."""
    return trial.state.is_finished() and trial.user_attrs.get("status") not in GIVEN_UP


def _measurement_attrs(m, source: str, context: dict | None) -> dict:
    return {
        "source": source,
        "status": m.status,
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


def _distributions():
    from optuna.distributions import IntDistribution

    return {axis: IntDistribution(1, _DIM_MAX, log=True) for axis in _AXES}


def _state_for(status: str):
    import optuna

    return optuna.trial.TrialState.COMPLETE if status == "ok" else optuna.trial.TrialState.FAIL


class Store:
    """The operator studies in one storage (default: SQLite under ``runs/``)."""

    def __init__(self, runs_dir=None, storage: str | None = None):
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.runs_dir = paths.runs_dir(runs_dir)
        self.url = storage or default_storage_url(runs_dir)
        self._local = local_file(self.url)
        self._storage = _open_storage(self.url)
        self._studies: dict[tuple[str, str], object] = {}
        self.owner = ClaimOwner.this_process()

    def study(self, operator: str, dtype: str = "float32"):
        key = (operator, str(np.dtype(dtype)))
        if key not in self._studies:
            self._studies[key] = _race_free(self.url, self._local, lambda: self._create_study(operator, dtype))
        return self._studies[key]

    def _create_study(self, operator: str, dtype: str):
        import optuna

        study = optuna.create_study(study_name=study_name(operator, dtype), storage=self._storage,
                                    direction="minimize", load_if_exists=True)
        if not study.user_attrs:
            study.set_user_attr("operator", operator)
            for name, value in environment(dtype).items():
                study.set_user_attr(name, value)
        return study

    def _add(self, operator, dtype, shape, value, status, attrs):
        import optuna

        state = _state_for(status)
        trial = optuna.trial.create_trial(
            params={axis: int(n) for axis, n in zip(_AXES, shape)},
            distributions=_distributions(),
            value=float(value) if state == optuna.trial.TrialState.COMPLETE else None,
            user_attrs={"status": status, **attrs},
            state=state,
        )
        self.study(operator, dtype).add_trial(trial)

    def add_measurement(self, m, source: str = SOURCE_PROFILE, context: dict | None = None) -> None:
        """Persist one :class:`explorer.measure.profiling.Measurement` (any status) as a new trial."""
        self._add(m.operator, m.dtype, m.shape, m.peak_bytes, m.status, _measurement_attrs(m, source, context))

    def add_observation(self, operator: str, shape, peak_bytes: float, *, source: str = SOURCE_PRODUCTION,
                        dtype: str = "float32", context: dict | None = None, status: str = "ok") -> None:
        """Persist one observation made elsewhere (a production task's peak)."""
        attrs = {"source": source, "peak_bytes": peak_bytes, "repeats": [peak_bytes], "context": context or {}}
        self._add(operator, dtype, shape, peak_bytes, status, attrs)

    def _trials(self, operator: str, dtype: str):
        return self.study(operator, dtype).get_trials(deepcopy=False)

    def records(self, operator: str, dtype: str = "float32", source: str | None = None) -> list[Record]:
        """The finished records (claims and given-up claims are not records)."""
        out = []
        for trial in self._trials(operator, dtype):
            attrs = trial.user_attrs
            if not _is_record(trial) or (source is not None and attrs.get("source") != source):
                continue
            out.append(
                Record(
                    shape=_shape_of(trial),
                    peak_bytes=attrs.get("peak_bytes"),
                    status=attrs.get("status", "ok"),
                    source=attrs.get("source", SOURCE_PROFILE),
                    repeats=list(attrs.get("repeats") or []),
                    seconds=attrs.get("seconds"),
                    input_bytes=attrs.get("input_bytes"),
                    context=dict(attrs.get("context") or {}),
                    number=trial.number,
                    error=attrs.get("error"),
                )
            )
        return out

    # -- claims ------------------------------------------------------------
    def _entries(self, trials, now: float) -> list[Entry]:
        """The profiles and live claims among ``trials``: what the budget counts."""
        import optuna

        running = optuna.trial.TrialState.RUNNING
        entries = []
        for trial in trials:
            attrs = trial.user_attrs
            if attrs.get("source", SOURCE_PROFILE) != SOURCE_PROFILE:
                continue
            if _is_record(trial):
                entries.append(Entry(trial.number, _shape_of(trial), claim=False))
            elif is_live_claim(attrs, trial.state == running, now, self.owner.host):
                entries.append(Entry(trial.number, _shape_of(trial), claim=True))
        return entries

    def live_claims(self, operator: str, dtype: str = "float32", *, others_only: bool = True) -> list[Claim]:
        """Claims in force: shapes being profiled now (by other processes unless ``others_only=False``)."""
        import optuna

        me = str(self.owner)
        now = time.time()
        running = optuna.trial.TrialState.RUNNING
        claims = []
        for trial in self._trials(operator, dtype):
            attrs = trial.user_attrs
            if not is_live_claim(attrs, trial.state == running, now, self.owner.host):
                continue
            if others_only and attrs.get("claim_owner") == me:
                continue
            claims.append(Claim(operator, str(np.dtype(dtype)), _shape_of(trial), attrs["claim_owner"],
                                float(attrs["claim_expires"]), trial._trial_id, trial.number))
        return claims

    def profiles_and_claims(self, operator: str, dtype: str = "float32") -> int:
        """What a budget counts now: finished isolated profiles plus live claims, by anyone."""
        return len(self._entries(self._trials(operator, dtype), time.time()))

    def claim(self, operator: str, shape, *, budget: int, seconds: float, dtype: str = "float32") -> Claim:
        """Claim ``shape`` for ``seconds`` at most, if no one holds it and ``budget`` allows.

        Not claimed (``refused``): ``taken`` (a finished profile or a live claim has
        that shape), ``budget-spent`` (profiles plus live claims already number
        ``budget``), or, found after creating it, ``duplicate-claim`` /
        ``over-budget`` (see :func:`claim_verdict`; the claim is then marked given up).
        """
        import optuna

        shape = tuple(int(n) for n in shape)
        owner = self.owner
        study = self.study(operator, dtype)
        now = time.time()
        claim = Claim(operator, str(np.dtype(dtype)), shape, str(owner), now + seconds)
        entries = self._entries(study.get_trials(deepcopy=False), now)
        if any(e.shape == shape for e in entries):
            claim.refused = TAKEN
            return claim
        if len(entries) >= budget:
            claim.refused = BUDGET_SPENT
            return claim
        template = optuna.trial.create_trial(
            params=dict(zip(_AXES, shape)), distributions=_distributions(), state=optuna.trial.TrialState.RUNNING,
            user_attrs={"source": SOURCE_PROFILE, "status": CLAIMED, "claim_owner": str(owner),
                        "claim_process_started": owner.started, "claim_expires": claim.expires},
        )
        claim.trial_id = study._storage.create_new_trial(study._study_id, template_trial=template)
        trials = study.get_trials(deepcopy=False)
        claim.number = next(t.number for t in trials if t._trial_id == claim.trial_id)
        others = [e for e in self._entries(trials, time.time()) if e.number != claim.number]
        verdict = claim_verdict(others, Entry(claim.number, shape, claim=True), budget)
        if verdict is not None:
            self._give_up(claim, verdict)
        return claim

    def _give_up(self, claim: Claim, why: str) -> None:
        import optuna

        storage = self.study(claim.operator, claim.dtype)._storage
        storage.set_trial_user_attr(claim.trial_id, "status", why)
        storage.set_trial_state_values(claim.trial_id, optuna.trial.TrialState.FAIL)
        claim.refused = why

    def release(self, claim: Claim) -> None:
        """Give up a held claim without a profile (the profiling failed in this process)."""
        if claim.held:
            self._give_up(claim, RELEASED)

    def finish(self, claim: Claim, m, context: dict | None = None) -> None:
        """Write the finished profile ``m`` onto its claim: user attributes, then value and state.

        Until the last write the trial stays a claim, so an interruption leaves no
        half-written record.
        """
        if not claim.held:
            raise ValueError(f"the claim on {claim.shape} is not held ({claim.refused or 'finished'})")
        if tuple(m.shape) != claim.shape:
            raise ValueError(f"profile of {tuple(m.shape)} does not match the claim on {claim.shape}")
        storage = self.study(claim.operator, claim.dtype)._storage
        for key, value in _measurement_attrs(m, SOURCE_PROFILE, context).items():
            storage.set_trial_user_attr(claim.trial_id, key, value)
        state = _state_for(m.status)
        values = [float(m.peak_bytes)] if m.status == "ok" else None
        storage.set_trial_state_values(claim.trial_id, state, values=values)
        claim.finished = True
