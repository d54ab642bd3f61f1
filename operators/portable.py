"""Operators another process cannot find by name, sent to it as pickles.

The profiling server and Dask workers look operators up by name.  The package's own
operators, ``$EXPLORER_PLUGINS``' modules and the entry-point group's
(``operators.plugins``) are found there by themselves; an operator defined elsewhere (made by
``from_function``, a class in ``__main__``, a notebook or a module named by ``module:attr``)
is sent: :func:`payloads` pickles what a process needs (a function operator's instance with
its function by value, ``operators.functional``; another class with cloudpickle, by value in
``__main__``, by reference to its module otherwise) and :func:`install` registers it there.
"""

from __future__ import annotations

import hashlib

from operators.base import register
from operators.functional import FunctionOperator
from operators.plugins import LOADED_MODULES

__all__ = ["install", "payloads"]

#: The payloads installed in this process (each loaded once): digest -> operator name.
_INSTALLED: dict[str, str] = {}


def _travels(cls: type) -> bool:
    """Whether another process needs ``cls`` sent: not one of this package's own classes."""
    return issubclass(cls, FunctionOperator) or not cls.__module__.startswith("operators.")


def payloads(spec) -> list[bytes]:
    """Pickles of the operators ``spec`` (a name, a spec or an ``Operator``) uses that another
    process cannot find by name; empty for the package's own and its plug-ins'."""
    import cloudpickle

    import operators

    op = operators.get(spec)
    classes = [type(m) for m in (getattr(op, "members", None) or (op,))]
    out = []
    for cls in dict.fromkeys(classes):
        if _travels(cls) and cls.__module__ not in LOADED_MODULES:
            # a function operator travels as an instance (its class is made from it); a class as itself
            out.append(cloudpickle.dumps(cls() if issubclass(cls, FunctionOperator) else cls))
    return out


def install(pickles) -> list[str]:
    """Register the operators of :func:`payloads`' pickles in this process (each loaded once);
    their names.  ``ValueError`` (one line) when one cannot be loaded here (its module is not
    importable here)."""
    import pickle

    names = []
    for data in pickles:
        key = hashlib.sha256(data).hexdigest()
        if key not in _INSTALLED:
            try:
                obj = pickle.loads(data)
            except Exception as exc:
                reason = " ".join(str(exc).split()) or type(exc).__name__
                raise ValueError(f"an operator sent to this process cannot be loaded here ({type(exc).__name__}: "
                                 f"{reason}): its module must be importable here, or define it with "
                                 f"operators.from_function") from None
            cls = obj if isinstance(obj, type) else type(obj)
            register(cls)
            _INSTALLED[key] = cls.name
        names.append(_INSTALLED[key])
    return names
