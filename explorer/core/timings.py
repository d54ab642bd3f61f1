"""Where a command's wall time goes: seconds per named section (``explore --timings``)."""

from __future__ import annotations

import contextlib
import threading
import time

__all__ = ["Timings"]


class Timings:
    """Wall seconds and entries per named section, summed over every entry of that name.

    Sections may nest (``ask`` holds the ``ML-II fits`` it triggers): each name's seconds are
    its own entries' wall time, so nested names are parts of their parent, not additions to it.
    Safe to enter from several threads (each entry is timed on its own clock).
    """

    def __init__(self):
        self._seconds: dict[str, float] = {}
        self._count: dict[str, int] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:  # picklable (an ExplorationCore sent between processes): the lock is not
        return {"_seconds": dict(self._seconds), "_count": dict(self._count)}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def section(self, name: str):
        started = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - started)

    def add(self, name: str, seconds: float, count: int = 1) -> None:
        with self._lock:
            self._seconds[name] = self._seconds.get(name, 0.0) + float(seconds)
            self._count[name] = self._count.get(name, 0) + int(count)

    def to_dict(self) -> dict:
        """``{name: {"seconds": s, "count": n}}`` in the order the names first appeared."""
        with self._lock:
            return {name: {"seconds": round(s, 3), "count": self._count[name]} for name, s in self._seconds.items()}
