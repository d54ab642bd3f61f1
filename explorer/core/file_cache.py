"""What a file holds, read once per (path, mtime): a small LRU cache that a rewritten file
invalidates and that never grows past its size."""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path
from typing import Callable, Generic, TypeVar

__all__ = ["MtimeCache"]

T = TypeVar("T")


class MtimeCache(Generic[T]):
    """``get(path, load)``: ``load(path)`` once per (path, modification time).

    One entry per path (a rewritten file replaces its entry), at most ``maxsize`` paths
    (the least recently used goes).  A missing file raises ``FileNotFoundError``; a ``load``
    that returns None is not cached (the caller's "not usable", asked again next time).
    """

    def __init__(self, maxsize: int = 64):
        if maxsize < 1:
            raise ValueError(f"maxsize must be at least 1, got {maxsize}")
        self.maxsize = int(maxsize)
        self._entries: OrderedDict[str, tuple[int, T]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, path, load: Callable[[Path], T | None]) -> T | None:
        path = Path(path)
        mtime = path.stat().st_mtime_ns
        key = str(path)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry[0] == mtime:
                self._entries.move_to_end(key)
                return entry[1]
        value = load(path)
        if value is not None:
            with self._lock:
                self._entries[key] = (mtime, value)
                self._entries.move_to_end(key)
                while len(self._entries) > self.maxsize:
                    self._entries.popitem(last=False)
        return value

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
