"""User operators: modules named in ``$EXPLORER_PLUGINS`` (comma-separated) are
imported wherever operators are looked up, so that their ``@operators.register``
classes exist in the CLI, the profiling server and Dask workers alike."""

from __future__ import annotations

import importlib
import os

PLUGINS_ENV = "EXPLORER_PLUGINS"


def plugin_modules() -> list[str]:
    return [name.strip() for name in os.environ.get(PLUGINS_ENV, "").split(",") if name.strip()]


class PluginError(ValueError):
    """A plugin module that cannot be imported (one line: which, why, what to fix)."""


def load_plugins() -> list[str]:
    """Import every plugin module (idempotent); return their names.

    Raises :class:`PluginError` naming the module and ``$EXPLORER_PLUGINS`` when one
    cannot be imported (not found, or failing on import).
    """
    modules = plugin_modules()
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # ImportError, or any error the module raises on import
            reason = " ".join(str(exc).split()) or type(exc).__name__
            raise PluginError(f"{PLUGINS_ENV} names {name!r}, which cannot be imported ({type(exc).__name__}: "
                              f"{reason}): fix the module name in {PLUGINS_ENV} or its PYTHONPATH") from None
    return modules
