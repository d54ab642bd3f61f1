"""A benchmark's own operators, registered as a user registers theirs (``EXPLORER_PLUGINS``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def use_plugin(module: str, directory: Path) -> None:
    """Add ``module`` (importable from ``directory``) to ``EXPLORER_PLUGINS``, and ``directory`` to
    this process's ``sys.path`` and to the ``PYTHONPATH`` its children (profiling servers, Dask
    workers) inherit.  Call before anything starts a child; ``operators.plugins.load_plugins()``
    then registers it here."""
    os.environ["EXPLORER_PLUGINS"] = ",".join(
        [m for m in os.environ.get("EXPLORER_PLUGINS", "").split(",") if m and m != module] + [module])
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(directory)]
    os.environ["PYTHONPATH"] = os.pathsep.join([str(directory), *paths])
    if str(directory) not in sys.path:
        sys.path.insert(0, str(directory))
