"""Exact, isolated peak-memory profiles of one operator at one shape.

``profile("gst3d", (200, 200, 200), repeat=3)`` returns a :class:`Measurement`.
Each repeat runs in a fresh child forked from a small preloaded server
(:mod:`explorer.measure.forkserver`), so no profile carries the parent's memory or a
previous profile's garbage into its figure.  ``peak_bytes`` is defined and
measured in one place, :mod:`explorer.measure.highwater`.

Statuses: ``ok``; ``exceeded`` (the operator hit the memory cap: ``peak_bytes``
is then a lower bound); ``timeout``; ``error`` (the child's last error line is
in ``error``).
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import json
import statistics
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

import psutil

import operators
from operators.plugins import load_plugins
from operators.portable import payloads
from explorer.core import paths
from explorer.core.units import parse_shape, parse_size

OK, EXCEEDED, TIMEOUT, ERROR = "ok", "exceeded", "timeout", "error"
STATUSES = (OK, EXCEEDED, TIMEOUT, ERROR)

#: Default memory cap of a profile: this share of the machine's physical memory.
DEFAULT_CAP_FRACTION = 0.5

#: One BLAS/OpenMP thread in the profiling child: a profile measures one task.
_CHILD_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


class ProfilerError(RuntimeError):
    """The profiling server itself failed (not the operator)."""


@dataclass
class Measurement:
    """One operator profiled at one shape (``repeats`` holds every run).

    ``peak_bytes`` is the highest per-run peak over the runs (memory planning
    wants the worst observed run); ``seconds`` is the median operator time.
    """

    operator: str
    shape: tuple[int, ...]
    peak_bytes: int | None
    input_bytes: int
    output_bytes: int | None
    process_peak_bytes: int | None
    seconds: float | None
    status: str
    repeats: list[dict] = field(default_factory=list)
    error: str | None = None
    dtype: str = "float32"
    seed: int = 0
    memory_cap_bytes: int | None = None
    timeout_seconds: float | None = None
    wall_seconds: float = 0.0
    gpu: dict | None = None

    @property
    def overhead_seconds(self) -> float:
        """Wall time of the whole profile beyond the operator's own run time."""
        spent = sum(r.get("seconds") or 0.0 for r in self.repeats)
        return self.wall_seconds - spent

    def to_dict(self) -> dict:
        out = asdict(self)
        out["shape"] = list(self.shape)
        out["overhead_seconds"] = self.overhead_seconds
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "Measurement":
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        known["shape"] = tuple(known["shape"])
        return cls(**known)


def default_memory_cap() -> int:
    return int(psutil.virtual_memory().total * DEFAULT_CAP_FRACTION)


def gpu_available() -> tuple[bool, str]:
    """Whether a CUDA device is visible to NVML, and a sentence saying so."""
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
    except Exception as exc:  # no driver, no library, no device
        return False, f"no GPU: NVML unavailable ({type(exc).__name__}); GPU peak not recorded"
    if count == 0:
        return False, "no GPU: NVML sees no device; GPU peak not recorded"
    return True, f"{count} CUDA device(s)"


class Profiler:
    """A handle on one profiling server; reuse it for many profiles.

    >>> with Profiler() as profiler:
    ...     m = profiler.profile("envelope", (100, 100, 200), repeat=3)
    """

    def __init__(self, *, gpu: bool | None = None):
        self._process: subprocess.Popen | None = None
        self._ready = False
        self._exit_requested = False
        self._stderr = None
        self._lock = threading.Lock()
        available, self.gpu_note = gpu_available() if gpu is not False else (False, "GPU profiling off")
        self.gpu = available if gpu is None else (gpu and available)
        self.startup_seconds: float | None = None

    # -- server lifecycle -------------------------------------------------
    def launch(self) -> "Profiler":
        """Start the server's process without waiting for it to be ready (its imports take about
        half a second): :meth:`start`, or the first profile, waits."""
        if self._process is not None and self._process.poll() is None:
            return self
        self._launched = time.perf_counter()
        argv, env = paths.module_child("explorer.measure.forkserver", **_CHILD_ENV)
        self._stderr = tempfile.TemporaryFile()
        self._process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=env,
            text=True,
            bufsize=1,
        )
        self._ready = False
        self._exit_requested = False
        return self

    def start(self) -> "Profiler":
        """The server, started (:meth:`launch`) and ready for profiles."""
        self.launch()
        if not self._ready:
            hello = self._process.stdout.readline()
            if not hello:
                raise ProfilerError(f"profiling server failed to start: {self._server_error()}")
            self._ready = True
            self.startup_seconds = time.perf_counter() - self._launched
        return self

    def _server_error(self) -> str:
        if self._stderr is None:
            return "unknown error"
        self._stderr.seek(0)
        lines = [l for l in self._stderr.read().decode(errors="replace").splitlines() if l.strip()]
        return lines[-1].strip() if lines else "no output"

    def request_exit(self) -> None:
        """Ask the server to exit, without waiting for it (:meth:`close` waits): servers asked
        together exit together."""
        process = self._process
        if process is None or process.poll() is not None or self._exit_requested:
            return
        self._exit_requested = True
        try:
            process.stdin.write(json.dumps({"cmd": "exit"}) + "\n")
            process.stdin.flush()
        except OSError:
            process.kill()

    def close(self) -> None:
        self.request_exit()
        process, self._process = self._process, None
        if process is None:
            return
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def __enter__(self) -> "Profiler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def _request(self, request: dict) -> dict:
        with self._lock:
            self.start()
            try:
                self._process.stdin.write(json.dumps(request) + "\n")
                self._process.stdin.flush()
                line = self._process.stdout.readline()
            except OSError:
                line = ""
            if not line:
                error = self._server_error()
                self.close()
                raise ProfilerError(f"profiling server died: {error}")
            return json.loads(line)

    def prepare(self, shape, *, dtype: str = "float32", seed: int = 0) -> bool:
        """Have the server build the input volume of ``shape`` now, ahead of its runs; whether it
        did (a server that fails here fails again, and says why, at the profile itself)."""
        with contextlib.suppress(ProfilerError):
            reply = self._request({"cmd": "prepare", "shape": list(parse_shape(shape)), "dtype": str(dtype),
                                   "seed": int(seed)})
            return reply.get("status") == OK
        return False

    # -- profiling --------------------------------------------------------
    def profile(
        self,
        operator: str,
        shape,
        *,
        repeat: int = 1,
        memory_cap=None,
        timeout: float | None = None,
        dtype: str = "float32",
        seed: int = 0,
    ) -> Measurement:
        """Profile ``operator`` on a synthetic volume of ``shape``, ``repeat`` times.

        ``memory_cap`` (bytes or a string like ``"2GiB"``; default half the
        machine's memory) caps the operator's working memory beyond its input.
        ``timeout`` (seconds) applies to each run.  Repeats stop at the first
        run that does not end ``ok``.
        """
        op = operators.get(operator)
        shape = parse_shape(shape)
        if repeat < 1:
            raise ValueError(f"repeat must be >= 1, got {repeat}")
        cap = default_memory_cap() if memory_cap is None else parse_size(memory_cap)
        if timeout is not None and timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        request = {
            "operator": op.name,
            "shape": list(shape),
            "dtype": str(dtype),
            "seed": int(seed),
            "memory_cap_bytes": cap,
            "timeout_seconds": timeout,
            "gpu": self.gpu,
        }
        sent = payloads(op)  # an operator the server cannot find by name (operators.portable)
        if sent:
            request["operators"] = [base64.b64encode(data).decode("ascii") for data in sent]
        self.start()  # server start-up is not part of any profile's overhead
        started = time.perf_counter()
        runs: list[dict] = []
        input_bytes = None
        for _ in range(repeat):
            reply = self._request(request)
            input_bytes = reply.pop("input_bytes", input_bytes)
            runs.append(reply)
            if reply["status"] != OK:
                break
        wall = time.perf_counter() - started
        return _summarise(op.name, shape, runs, input_bytes, request, wall, self.gpu_note)


class SessionProfiler:
    """Profiles whose repeats run in different profiling servers (sessions), in turn.

    Two forks of one server in one state often peak to the byte alike, while the same
    shape profiled in another server differs by an allocator's quantum (gst3d at 75x29x60:
    pairs within a server 0-176 KiB apart, four servers' means 12,288-12,460 KiB): repeats
    within one server understate the run noise a new run elsewhere has (the truth a bound is
    for), and what they miss is then taken for the model's misfit.  So repeat ``k`` of a
    profile runs in server ``k mod sessions``, one after the other (never two children at
    once), each server with its own history; every run records its ``session``.  The same
    interface as :class:`Profiler`.
    """

    def __init__(self, sessions: int = 2, *, gpu: bool | None = None):
        if sessions < 1:
            raise ValueError(f"sessions must be >= 1, got {sessions}")
        self.servers = [Profiler(gpu=gpu) for _ in range(sessions)]
        self.gpu_note = self.servers[0].gpu_note

    def launch(self) -> "SessionProfiler":
        """Start every server's process at once, waiting for none (:meth:`Profiler.launch`)."""
        for server in self.servers:
            server.launch()
        return self

    def start(self) -> "SessionProfiler":
        for server in self.launch().servers:
            server.start()
        return self

    def close(self) -> None:
        for server in self.servers:
            server.request_exit()
        for server in self.servers:
            server.close()

    def __enter__(self) -> "SessionProfiler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def _prepare(self, shape, repeat: int, dtype: str, seed: int) -> None:
        """Every server that runs a repeat builds its copy of the input at once, before any run
        (one at a time, they cost a profile of a small block more than its runs)."""
        servers = self.servers[:repeat]
        if len(servers) > 1:
            with ThreadPoolExecutor(max_workers=len(servers)) as pool:
                list(pool.map(lambda server: server.prepare(shape, dtype=dtype, seed=seed), servers))

    def profile(self, operator: str, shape, *, repeat: int = 1, **options) -> Measurement:
        """:meth:`Profiler.profile`, repeat ``k`` in server ``k mod sessions``; repeats stop at
        the first run that does not end ``ok``."""
        if repeat < 1:
            raise ValueError(f"repeat must be >= 1, got {repeat}")
        started = time.perf_counter()
        self._prepare(shape, repeat, options.get("dtype", "float32"), options.get("seed", 0))
        runs, parts = [], []
        for k in range(repeat):
            part = self.servers[k % len(self.servers)].profile(operator, shape, repeat=1, **options)
            parts.append(part)
            runs.extend(dict(run, session=k % len(self.servers)) for run in part.repeats)
            if part.status != OK:
                break
        first = parts[0]
        request = {"dtype": first.dtype, "seed": first.seed, "memory_cap_bytes": first.memory_cap_bytes,
                   "timeout_seconds": first.timeout_seconds}
        return _summarise(first.operator, first.shape, runs, first.input_bytes, request,
                          time.perf_counter() - started, self.gpu_note)


def _summarise(operator, shape, runs, input_bytes, request, wall, gpu_note) -> Measurement:
    """Fold the runs of one profile into a Measurement."""
    last = runs[-1]
    status = last["status"]
    measured = [r for r in runs if r.get("peak_bytes") is not None]
    ok_seconds = [r["seconds"] for r in runs if r["status"] == OK]
    gpu = last.get("gpu") or {"note": gpu_note}
    if input_bytes is None:  # the server could not even build the input
        import numpy as np

        input_bytes = int(np.prod(shape)) * np.dtype(request["dtype"]).itemsize
    return Measurement(
        operator=operator,
        shape=tuple(shape),
        peak_bytes=max(r["peak_bytes"] for r in measured) if measured else None,
        input_bytes=int(input_bytes),
        output_bytes=next((r["output_bytes"] for r in runs if r.get("output_bytes") is not None), None),
        process_peak_bytes=max(r["process_peak_bytes"] for r in measured) if measured else None,
        seconds=statistics.median(ok_seconds) if ok_seconds else (last.get("seconds")),
        status=status,
        repeats=runs,
        error=last.get("error"),
        dtype=request["dtype"],
        seed=request["seed"],
        memory_cap_bytes=request["memory_cap_bytes"],
        timeout_seconds=request["timeout_seconds"],
        wall_seconds=wall,
        gpu=gpu,
    )


_shared: Profiler | None = None


def profile(operator: str, shape, **options) -> Measurement:
    """Profile with a shared server (started on first use, closed at exit).

    Options as :meth:`Profiler.profile`: ``repeat``, ``memory_cap``,
    ``timeout``, ``dtype``, ``seed``.
    """
    global _shared
    load_plugins()
    if _shared is None:
        _shared = Profiler()
        atexit.register(_shared.close)
    return _shared.profile(operator, shape, **options)
