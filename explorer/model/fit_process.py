"""ML-II fits in a process of their own: ``FitProcess()(*args, **kwargs)`` is
``explorer.model.fit.fit(*args, **kwargs)``, computed by a child (``python -m
explorer.model.fit_process``) that imported torch, GPyTorch and BoTorch once
(``explore``'s loop, ``explorer.search.core.ExplorationCore``).

Why a process.  The loop fits beside its profiles (``ExplorationCore.prefit``).  In a thread of
the loop's process, the fit's Python (GPyTorch's modules, BoTorch's closures, SciPy's L-BFGS-B)
holds the GIL that the profiles' IPC threads and the store's writes wait for (a thread spinning
in Python beside ten gst3d profiles took each from 45 to 129 ms beyond the operator, on this
2-core machine).  In a child of its own, the fit uses the core the profile leaves free, and the
loop's process never imports torch (2 s).

The child is a plain ``python -P -m`` server, not a ``multiprocessing`` one, so a user's script
that calls ``explorer.explore`` is never re-imported in it (and, ``-P``, no file in the working
directory shadows a module it imports: a ``grp.py`` there broke torch's import).  Nothing of
the caller's process is assumed there: the operator's padding and alike axes reach ``fit`` as arguments
(``block_multiple``, ``axis_classes``), so an operator registered only in the caller fits as it
would here.  A child that dies costs nothing but speed: the fits go on in the caller.
"""

from __future__ import annotations

import pickle
import signal
import struct
import subprocess
import sys
import threading

from explorer.core import paths
from explorer.model.fit import fit

__all__ = ["FitProcess"]

_HEADER = struct.Struct("!Q")


class FitProcess:
    """:func:`explorer.model.fit.fit` in a child process, started by :meth:`start` (its imports
    begin at once) or by the first fit; callable from any thread, one fit at a time."""

    def __init__(self):
        self._process: subprocess.Popen | None = None
        self._done = False  # closed, or its child died: fits run in the caller from then on
        self._lock = threading.Lock()

    def start(self) -> "FitProcess":
        """Start the child, which imports torch and fits once (:func:`warm_up`) at once; waits for
        neither: the first real fit then finds it ready."""
        with self._lock:
            if self._process is None and not self._done:
                argv, env = paths.module_child("explorer.model.fit_process")
                self._process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                 stderr=subprocess.DEVNULL, env=env)
        return self

    def __call__(self, *args, **kwargs):
        self.start()
        with self._lock:
            if self._process is not None:
                try:
                    _send(self._process.stdin, (args, kwargs))
                    ok, value = _receive(self._process.stdout)
                except (OSError, EOFError, pickle.UnpicklingError):  # the child died: fit here from now on
                    self._close_locked()
                else:
                    if ok:
                        return value
                    raise value
        return fit(*args, **kwargs)

    def close(self) -> None:
        """Stop the child: it exits at the end of its input; its exit, torch's teardown (0.6 s), is
        waited for in a thread, not here.  A fit asked for later runs in the caller."""
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
        process, self._process, self._done = self._process, None, True
        if process is None:
            return
        for stream in (process.stdin, process.stdout):
            try:
                stream.close()
            except OSError:
                pass
        threading.Thread(target=_reap, args=(process,), daemon=True).start()

    def __enter__(self) -> "FitProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _reap(process: subprocess.Popen) -> None:
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _send(stream, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _receive(stream):
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError("the fit process closed its output")
    (size,) = _HEADER.unpack(header)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("the fit process closed its output mid-reply")
    return pickle.loads(data)


def warm_up() -> None:
    """Import torch, GPyTorch and BoTorch, then fit made-up profiles once: torch's first
    optimisation pays about 0.2 s of lazy set-up, which the first real fit then does not."""
    import numpy as np

    from explorer.model import torch_fit

    torch_fit.warm_up()
    shapes = np.array([[20, 30, 40], [60, 40, 30], [90, 80, 70], [40, 120, 60], [150, 60, 90]])
    peaks = 12.0 * shapes.prod(axis=1) + 2**20
    try:
        fit("warm-up", shapes, peaks, (0.003 * peaks) ** 2, np.zeros(len(shapes), bool))
    except Exception:  # a warm-up that fails costs nothing: the first fit pays the set-up
        pass


def _serve() -> None:
    """The child: warm up, then answer each ``(args, kwargs)`` with ``(True, fit(...))`` or
    ``(False, the exception)`` until the caller closes the pipe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the caller's to handle (one line there)
    requests, replies = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing printed may corrupt the replies
    warm_up()
    while True:
        try:
            args, kwargs = _receive(requests)
        except EOFError:
            return
        try:
            reply = (True, fit(*args, **kwargs))
        except Exception as exc:  # noqa: BLE001 (raised again in the caller)
            reply = (False, exc)
        _send(replies, reply)


if __name__ == "__main__":
    _serve()
