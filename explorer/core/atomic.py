"""Writing a file so that a reader never sees half of it: a temporary file of this process's
own in the same directory, flushed to disk, then renamed over the target (``os.replace``)."""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path

__all__ = ["atomic_path", "atomic_write_text"]


@contextlib.contextmanager
def atomic_path(path):
    """Yield a temporary path beside ``path`` to write the whole file to; on leaving, fsync
    it and rename it over ``path``.  On an exception the temporary file is removed and
    ``path`` is untouched (the old file, or none).

    The temporary name (``.NAME.PID.XXXXXXXX.tmp.SUFFIX``) is this process's own, so
    processes sharing a runs directory never write into each other's; it keeps ``path``'s
    suffix, for writers that choose a format by it (``np.savez``, ``savefig``).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp{path.suffix}")
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)


def atomic_write_text(path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (:func:`atomic_path`); return ``path``."""
    path = Path(path)
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        f.write(text)
    return path
