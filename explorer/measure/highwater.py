"""The kernel's resident-set high-water mark: the one place ``peak_bytes`` is measured.

Definition (``docs/definitions.md``): ``peak_bytes`` is the highest resident set size
while ``operator.run(x)`` executes, minus the resident set size just before
the call, with the input ``x`` already resident::

    peak_bytes = VmHWM(after the call) - VmRSS(just before the call)

where ``VmHWM`` was reset to the current RSS just before the call by writing
``5`` to ``/proc/self/clear_refs`` (Linux).  The kernel updates ``VmHWM`` on
every page fault, so a spike between two samples is never missed, unlike a
polling sampler.

Used by the profiling child and by in-worker observation of Dask tasks.  With
several threads in one process the high-water mark covers all of them: it is
the process's peak, not one task's.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

_STATUS = "/proc/self/status"
_CLEAR_REFS = "/proc/self/clear_refs"
_FIELDS = ("VmRSS", "VmHWM", "VmData")


def read_status() -> dict[str, int]:
    """``VmRSS``, ``VmHWM`` and ``VmData`` of this process, in bytes."""
    values: dict[str, int] = {}
    with open(_STATUS, "rb") as status:
        for line in status:
            key, _, rest = line.partition(b":")
            name = key.decode()
            if name in _FIELDS:
                values[name] = int(rest.split()[0]) * 1024
    return values


def reset_high_water_mark() -> int:
    """Reset ``VmHWM`` to the current RSS; return that RSS in bytes."""
    with open(_CLEAR_REFS, "w") as clear_refs:
        clear_refs.write("5")
    return read_status()["VmRSS"]


def is_supported() -> bool:
    """True where the high-water mark can be reset (Linux with procfs)."""
    return os.path.exists(_CLEAR_REFS) and os.access(_CLEAR_REFS, os.W_OK)


_libc = None

#: glibc's ``mallopt`` parameter number for the mmap threshold.
_M_MMAP_THRESHOLD = -3
#: glibc's initial mmap threshold: allocations above it are mmapped and returned on free.
MMAP_THRESHOLD_BYTES = 128 * 1024


def _load_libc():
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c")
        _libc = ctypes.CDLL(name) if name else False
    return _libc


def fix_mmap_threshold(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Pin glibc's mmap threshold (it otherwise grows after each large free).

    With the dynamic threshold a process's allocation pattern, and so an
    operator's peak, depends on what the process freed before: a profile would
    carry its server's history.  Pinned at glibc's initial 128 KiB, every large
    array is mmapped and returned to the kernel when freed, in every child alike.
    """
    libc = _load_libc()
    return bool(libc and hasattr(libc, "mallopt") and libc.mallopt(_M_MMAP_THRESHOLD, int(threshold)))


def release_free_heap() -> None:
    """Return freed heap pages to the kernel (glibc ``malloc_trim(0)``), so the
    RSS before a measurement holds no garbage a later allocation could reuse."""
    libc = _load_libc()
    if libc and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


class PeakMeter:
    """Context manager measuring ``peak_bytes`` of the code inside it.

    >>> with PeakMeter() as meter:
    ...     y = operator.run(x)
    >>> meter.peak_bytes, meter.process_peak_bytes
    """

    rss_before: int
    process_peak_bytes: int
    peak_bytes: int

    def __enter__(self) -> "PeakMeter":
        self.rss_before = reset_high_water_mark()
        return self

    def __exit__(self, *exc) -> None:
        self.process_peak_bytes = read_status()["VmHWM"]
        self.peak_bytes = self.process_peak_bytes - self.rss_before
