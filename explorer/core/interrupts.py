"""A Ctrl-C that Python delivered wrapped in another exception.

A ``KeyboardInterrupt`` raised while a module is being imported can reach the caller as another
exception: in a class body's ``__set_name__`` Python wraps it in ``RuntimeError("Error calling
__set_name__ ...")`` (seen with ``zarr``'s codecs, imported lazily at a run's first write). A
handler that turns errors into one line must not take that for the run's error: the user asked
to stop.
"""

from __future__ import annotations

__all__ = ["caused_by_interrupt"]


def caused_by_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` or an exception it was raised from or while handling (``__cause__``,
    ``__context__``) is a ``KeyboardInterrupt``."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False
