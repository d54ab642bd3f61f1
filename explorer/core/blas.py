"""One BLAS thread for the model's small linear algebra.

The model's matrices have as many rows as there are profiles (tens).  At that size a second
OpenBLAS thread costs more than it gives, and far more when the cores are busy: ``eigh`` of a
30 x 30 matrix took 0.24 ms on one thread and 7.8 ms on two on this 2-core machine under load
(``numpy.linalg``, OpenBLAS), and a regime scan (``explorer.model.regimes``) makes hundreds of
them per fit.  The limit applies only inside :func:`one_blas_thread` and is restored on exit, so
the operators, which run in other processes, keep their libraries' defaults.
"""

from __future__ import annotations

import contextlib
import functools

__all__ = ["one_blas_thread", "with_one_blas_thread"]


@contextlib.contextmanager
def one_blas_thread():
    """Inside: the process's BLAS libraries limited to one thread (``threadpoolctl``)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield


def with_one_blas_thread(function):
    """``function`` run inside :func:`one_blas_thread`."""

    @functools.wraps(function)
    def wrapped(*args, **kwargs):
        with one_blas_thread():
            return function(*args, **kwargs)

    return wrapped
