"""Where operators come from besides this package: plug-in modules and ``module:attr`` references.

* The entry-point group ``memory_explorer.operators``: a distribution that declares its
  operators there is found by every process that looks one up (the CLI, the profiling
  server, Dask workers) with nothing set.  An entry point names a module (importing it
  registers its ``@register`` classes) or an attribute: an :class:`~operators.base.Operator`
  subclass or instance (one made by :func:`operators.functional.from_function`).
* ``$EXPLORER_PLUGINS``: comma-separated module names, imported the same way (kept for
  compatibility).
* ``module:attr`` (``mypkg.attrs:coherence``): the attribute of an importable module, wherever
  a spec names an operator (:func:`resolve`).

:func:`load_plugins` is idempotent and runs on a lookup that misses (``operators.get``), so a
library call finds a plug-in's operator without the CLI having loaded it first.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from importlib import metadata

from operators.base import Operator, register

__all__ = ["ENTRY_POINT_GROUP", "PLUGINS_ENV", "PluginError", "is_reference", "load_plugins", "LOADED_MODULES",
           "plugin_modules", "resolve"]

PLUGINS_ENV = "EXPLORER_PLUGINS"
ENTRY_POINT_GROUP = "memory_explorer.operators"
#: ``module:attr``: a dotted module path, a colon, a dotted attribute path.
_REFERENCE = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*\Z")

#: Modules and entry points already loaded in this process (a failure is raised again, not kept).
_LOADED: set[str] = set()
#: The modules plug-ins loaded here (``$EXPLORER_PLUGINS``' and the entry points'): every
#: process loads them itself (``operators.portable`` sends none of their operators).
LOADED_MODULES: set[str] = set()


class PluginError(ValueError):
    """A plug-in or ``module:attr`` that cannot be loaded (one line: which, why, what to fix)."""


def plugin_modules() -> list[str]:
    """The module names in ``$EXPLORER_PLUGINS``."""
    return [name.strip() for name in os.environ.get(PLUGINS_ENV, "").split(",") if name.strip()]


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: " + (" ".join(str(exc).split()) or "no message")


def load_plugins() -> list[str]:
    """Import every plug-in (``$EXPLORER_PLUGINS``'s modules, then the entry-point group's
    entries) not imported yet; return what is loaded.

    Raises :class:`PluginError` naming the module or entry point and where it was declared
    when one cannot be loaded."""
    loaded = []
    for name in plugin_modules():
        if name not in _LOADED:
            try:
                importlib.import_module(name)
            except Exception as exc:  # ImportError, or any error the module raises on import
                raise PluginError(f"{PLUGINS_ENV} names {name!r}, which cannot be imported ({_one_line(exc)}): fix "
                                  f"the module name in {PLUGINS_ENV} or its PYTHONPATH") from None
            _LOADED.add(name)
            LOADED_MODULES.add(name)
        loaded.append(name)
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        key = f"{entry.name}={entry.value}"
        if key not in _LOADED:
            dist = getattr(entry.dist, "name", None) or "a distribution"
            try:
                _register_object(entry.load(), entry.value)
            except Exception as exc:
                raise PluginError(f"entry point {entry.name!r} of {dist} in group {ENTRY_POINT_GROUP!r} "
                                  f"({entry.value}) cannot be loaded ({_one_line(exc)})") from None
            _LOADED.add(key)
            LOADED_MODULES.add(entry.value.partition(":")[0])
        loaded.append(entry.value)
    return loaded


def _register_object(obj, where: str) -> Operator | None:
    """Register what a plug-in reference names: a module (its classes registered themselves on
    import: None), an ``Operator`` subclass (an instance of it returned) or an instance."""
    if isinstance(obj, type(sys)):
        return None
    if isinstance(obj, type) and issubclass(obj, Operator):
        register(obj)
        return obj()
    if isinstance(obj, Operator):
        if not getattr(type(obj), "name", None):
            raise TypeError(f"{where} is an operator without a name")
        register(type(obj))
        return obj
    raise TypeError(f"{where} is a {type(obj).__name__}, not an Operator subclass or instance (wrap a function "
                    f"with operators.from_function)")


def is_reference(text: str) -> bool:
    """Whether ``text`` is a ``module:attr`` reference."""
    return isinstance(text, str) and bool(_REFERENCE.match(text))


def resolve(reference: str) -> Operator:
    """The operator ``module:attr`` names, registered under its own name (an instance).

    The module is imported as ``python -m`` would (the working directory on the path);
    :class:`PluginError` (one line) when the module or the attribute is missing or the
    attribute is not an operator."""
    if not is_reference(reference):
        raise PluginError(f"{reference!r} is not a module:attr reference (e.g. mypkg.attrs:coherence)")
    module_name, _, attribute = reference.partition(":")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())  # as `python -m` finds a module beside the user
    try:
        obj = importlib.import_module(module_name)
    except Exception as exc:
        raise PluginError(f"{reference}: module {module_name!r} cannot be imported ({_one_line(exc)})") from None
    for part in attribute.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise PluginError(f"{reference}: module {module_name!r} has no attribute {attribute!r}") from None
    try:
        op = _register_object(obj, reference)
    except (TypeError, ValueError) as exc:
        raise PluginError(f"{reference}: {exc}") from None
    if op is None:
        raise PluginError(f"{reference} is a module, not an operator: name its Operator subclass or instance")
    return op
