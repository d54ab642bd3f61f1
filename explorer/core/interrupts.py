"""A Ctrl-C that Python delivered wrapped in another exception, or swallowed.

A ``KeyboardInterrupt`` raised while a module is being imported can reach the caller as another
exception: in a class body's ``__set_name__`` Python wraps it in ``RuntimeError("Error calling
__set_name__ ...")`` (seen with ``zarr``'s codecs, imported lazily at a run's first write). A
handler that turns errors into one line must not take that for the run's error: the user asked
to stop.

One raised inside a garbage-collector callback, a ``__del__`` or a weakref callback is not
raised at all: Python prints "Exception ignored in ..." and goes on (seen with the probes'
LocalCluster, whose scheduler, in this process, hooks ``distributed.gc``'s diagnosis into every
collection: once in a test of a Ctrl-C during the probes, the probes then ran to their end).
:func:`redeliver_swallowed_interrupts` delivers it again.
"""

from __future__ import annotations

import sys

__all__ = ["caused_by_interrupt", "redeliver_swallowed_interrupts"]


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


#: Seconds after a swallowed Ctrl-C before it is sent again: time for the main thread to leave
#: the callback (a signal that lands inside the hook itself would be swallowed once more).
REDELIVERY_DELAY = 0.05


def redeliver_swallowed_interrupts() -> None:
    """Install a ``sys.unraisablehook`` that answers a swallowed ``KeyboardInterrupt`` with a new
    SIGINT to the main thread, :data:`REDELIVERY_DELAY` seconds later from a thread of its own
    (by then the main thread has left the callback, and a blocking call it is in is interrupted
    as by a Ctrl-C); any other unraisable exception goes to the hook that was there.  Nothing is
    sent once SIGINT is no longer Python's to handle (ignored: a shutdown under way)."""
    import signal
    import threading

    previous = sys.unraisablehook
    if getattr(previous, "redelivers_interrupts", False):
        return
    main = threading.main_thread().ident

    def send_again():
        if callable(signal.getsignal(signal.SIGINT)):
            signal.pthread_kill(main, signal.SIGINT)

    def hook(unraisable):
        if unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt):
            timer = threading.Timer(REDELIVERY_DELAY, send_again)
            timer.daemon = True
            timer.start()
        else:
            previous(unraisable)

    hook.redelivers_interrupts = True
    sys.unraisablehook = hook
