"""``load_model``: an operator's saved model, or a pipeline's composed from its members'."""

from __future__ import annotations

from explorer.core.paths import model_path
from explorer.model.composed import compose
from explorer.model.memory_model import MemoryModel
from explorer.model.saved import load_saved_model

__all__ = [
    "load_model",
]


def load_model(operator: str, runs_dir=None) -> MemoryModel:
    """The saved model of ``operator`` (``explorer.core.paths.model_path``), cached by (path, mtime).

    A pipeline (``operators.pipeline``) without a model of its own gets one composed from
    its members' models (``explorer.model.composed``).  Raises ``ModelNotFoundError`` naming
    the command that creates it, and
    ``ModelFileError`` naming the file and the command that rebuilds it when the file is
    not a readable model.  A model learnt in another environment (library versions,
    operator code, machine: ``explorer.core.environment``) is returned with a
    ``StaleModelWarning`` on first load; ``model.stale`` keeps the differences
    (``explorer.model.saved.load_saved_model``).
    """
    from explorer.core import validate

    operator = validate.operator(operator)
    if not model_path(operator, runs_dir).exists():
        import operators
        from operators.pipeline import Pipeline

        op = operators.get(operator)
        if isinstance(op, Pipeline):  # without a model of its own: its members'
            return compose(op, runs_dir)
    return load_saved_model(operator, runs_dir, stacklevel=4)
