"""An operator's saved model (``model.npz``), loaded once per (path, mtime), its staleness warned."""

from __future__ import annotations

from explorer.core import paths
from explorer.core.file_cache import MtimeCache
from explorer.core.paths import model_path
from explorer.model.memory_model import MemoryModel, ModelFileError, ModelNotFoundError

__all__ = [
    "load_saved_model",
]


_CACHE: MtimeCache[MemoryModel] = MtimeCache()


def load_saved_model(operator: str, runs_dir=None, *, stacklevel: int = 3) -> MemoryModel:
    """The saved model of ``operator`` (``explorer.core.paths.model_path``), cached by (path, mtime).

    Raises ``ModelNotFoundError`` naming the command that creates it when there is no file
    (a pipeline's model composed from its members' is ``explorer.model.load.load_model``'s),
    and ``ModelFileError`` naming the file and the command that rebuilds it when the file is
    not a readable model.  A model learnt in another environment (library versions,
    operator code, machine: ``explorer.core.environment``) is returned with a
    ``StaleModelWarning`` when it first reads so (``stacklevel`` as ``warnings.warn``'s, from the
    caller); ``model.stale`` keeps the differences.
    """
    from explorer.core import validate

    operator = validate.operator(operator)
    path = model_path(operator, runs_dir)

    def load(path):
        try:
            model = MemoryModel.load(path)
        except Exception as exc:  # truncated, not an npz, wrong layout: name the file and the fix
            reason = " ".join(str(exc).split()) or type(exc).__name__
            raise ModelFileError(f"{path} is not a readable model ({reason[:160]}): "
                                 f"run `{paths.explore_command(operator)}` to rebuild it") from None
        return model

    try:
        model = _CACHE.get(path, load)
    except FileNotFoundError:
        where = path.parent.parent
        raise ModelNotFoundError(
            f"no explored model for {operator!r} in {where}/ — run: {paths.explore_command(operator)}") from None
    # Read at every load, not cached with the file: the operator's code may change in this
    # process (a function operator defined again), and then the same file is stale.
    from explorer.core.environment import warn_stale

    stale = model.stale_reasons()
    if stale != model.stale:
        model.stale = stale
        warn_stale(f"{operator}'s model ({path})", stale, f"explore {operator}", stacklevel=stacklevel)
    return model
