"""User operators: modules named in ``$EXPLORER_PLUGINS`` (comma-separated) are
imported wherever operators are looked up, so that their ``@operators.register``
classes exist in the CLI, the profiling server and Dask workers alike."""

from __future__ import annotations

import importlib
import os

PLUGINS_ENV = "EXPLORER_PLUGINS"


def plugin_modules() -> list[str]:
    return [name.strip() for name in os.environ.get(PLUGINS_ENV, "").split(",") if name.strip()]


def load_plugins() -> list[str]:
    """Import every plugin module (idempotent); return their names."""
    modules = plugin_modules()
    for name in modules:
        importlib.import_module(name)
    return modules
