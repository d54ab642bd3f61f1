"""Operators from plain functions: :func:`from_function`.

A user's ``func(block) -> block`` becomes an :class:`~operators.base.Operator` whose
properties (halo, whole axes, axis classes, block multiple, output dtype) are those given.
Its identity is its name and a digest of its code (:func:`code_digest`): the digest is the
class's ``version`` (so a saved model's environment stamp carries it) and part of its study's
key (``explorer.search.store.study_name``), so a changed function is a new study, never a
stale model's profiles.

The function travels with the operator: an instance pickles as its name, properties and the
function pickled by value (cloudpickle), so a function defined in ``__main__``, a notebook or a
test module runs in the profiling server and on Dask workers that cannot import its module.
Unpickling an instance registers it in that process, under its name.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import marshal
import sys

import numpy as np

from operators.base import _REGISTRY, MAX_HALO, Operator, check_name, register

__all__ = ["FunctionOperator", "code_digest", "from_function"]


def code_digest(func, properties: dict) -> str:
    """12 hex digits of SHA-256 over the function's source (its compiled code where the
    source cannot be read), its defaults and ``properties``: what decides its results and
    its memory.  A helper it calls is not read: give ``version=`` to say that one changed."""
    try:
        code = inspect.getsource(func)
    except (OSError, TypeError):
        code = marshal.dumps(func.__code__).hex()
    text = json.dumps({"code": code, "defaults": repr(getattr(func, "__defaults__", None)),
                       "kwdefaults": repr(getattr(func, "__kwdefaults__", None)), **properties},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _pickled_by_value(func) -> bytes:
    """``func`` pickled with its own module's code by value (cloudpickle), so that a process
    which cannot import that module (a test module, a script) still runs it."""
    import cloudpickle

    module = sys.modules.get(getattr(func, "__module__", None) or "")
    by_value = (module is not None and module.__name__ != "__main__"
                and module.__name__ not in cloudpickle.list_registry_pickle_by_value())
    if by_value:
        cloudpickle.register_pickle_by_value(module)
    try:
        return cloudpickle.dumps(func)
    finally:
        if by_value:
            cloudpickle.unregister_pickle_by_value(module)


#: Classes made here by (name, digest): one per function in a process, however often unpickled.
_CLASSES: dict[tuple[str, str], type] = {}


class FunctionOperator(Operator):
    """An operator whose ``run`` is a user's function (made by :func:`from_function`)."""

    #: The function pickled by value; ``version`` is its :func:`code_digest`.
    function_bytes: bytes = b""

    def run(self, block: np.ndarray) -> np.ndarray:
        cls = type(self)
        func = cls.__dict__.get("_function")
        if func is None:
            import cloudpickle

            func = cloudpickle.loads(cls.function_bytes)
            cls._function = func  # one load per class, in each process
        out = np.asarray(func(block))
        expected = self.output_shape(block.shape)
        if out.shape != expected:
            raise ValueError(f"operator {self.name} returned shape {out.shape} for a block of {tuple(block.shape)}: "
                             f"it must return the block's shape, {expected}")
        return out.astype(self.output_dtype, copy=False)

    def __reduce__(self):
        cls = type(self)
        return _rebuild, (cls.name, cls.version, cls.function_bytes, _properties(cls))


def _properties(cls) -> dict:
    return {"halo": tuple(cls.halo), "whole_axes": tuple(cls.whole_axes), "axis_classes": tuple(cls.axis_classes),
            "block_multiple": tuple(cls.block_multiple), "output_dtype": np.dtype(cls.output_dtype).str,
            "description": cls.description}


def _rebuild(name: str, version: str, function_bytes: bytes, properties: dict) -> FunctionOperator:
    """Unpickling: an instance of the operator (name, version), its class made once per process
    and registered when the name is free here (a newer definition under the name is kept;
    ``operators.portable.install`` replaces it when the caller sends one)."""
    cls = _class(name, version, function_bytes, properties)
    if name not in _REGISTRY:
        register(cls)
    return cls()


def _class(name: str, version: str, function_bytes: bytes, properties: dict) -> type:
    """The class of the operator (name, version): made once per process, its name checked first."""
    cls = _CLASSES.get((name, version))
    if cls is None:
        attributes = dict(properties, output_dtype=np.dtype(properties["output_dtype"]))
        cls = type(f"FunctionOperator_{name}", (FunctionOperator,), {
            **attributes, "name": name, "version": version, "function_bytes": function_bytes,
            "__module__": __name__, "__qualname__": f"from_function.{name}",
            "__doc__": attributes["description"]})
        check_name(name)
        _CLASSES[(name, version)] = cls
    return cls


def _axes(value, what: str, *, minimum: int = 0, maximum: int = MAX_HALO) -> tuple[int, ...]:
    values = tuple(value) if isinstance(value, (tuple, list)) else (value,) * 3
    if len(values) != 3 or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values):
        raise ValueError(f"{what} must be three integers (one per axis: inline, crossline, samples); got {value!r}")
    if not all(minimum <= int(v) <= maximum for v in values):
        raise ValueError(f"{what} must be integers in [{minimum}, {maximum}]; got {value!r}")
    return tuple(int(v) for v in values)


def from_function(func=None, *, name: str, halo=(0, 0, 0), whole_axes=(), axis_classes=None,
                  block_multiple=(1, 1, 1), output_dtype="float32", version: str | None = None):
    """An :class:`~operators.base.Operator` that runs ``func(block) -> block`` on each block.

    Parameters
    ----------
    func : callable
        Takes a 3D NumPy block (inline, crossline, samples) and returns an array of the same
        shape.  Omitted, ``from_function`` returns a decorator (``@from_function(name=...)``).
    name : str
        Letters, digits and underscores, not starting with a digit (it names the operator's
        study and its directory under the runs directory).
    halo : three ints
        Neighbour samples per axis one output sample depends on (``Operator.halo``).
    whole_axes : ints
        Axes the function needs whole (e.g. ``(2,)`` for a transform along samples).
    axis_classes : three ints, optional
        Axes whose permutation leaves the memory unchanged share a class; the default claims
        nothing (every axis its own).
    block_multiple : three ints
        The function pads each block up to a multiple of these per axis.
    output_dtype : dtype
        The result's dtype (the function's result is cast to it).  The operator's description
        (``explore operators``) is the first line of the function's docstring.
    version : str, optional
        Replaces the code digest as the operator's version: say when something the digest
        cannot see (a helper the function calls, a file it reads) changed.

    Returns
    -------
    Operator
        Registered under ``name`` in this process (a redefinition replaces the previous one);
        its ``version`` is :func:`code_digest`, or ``version`` when given.
    """
    if func is None:
        return lambda f: from_function(f, name=name, halo=halo, whole_axes=whole_axes, axis_classes=axis_classes,
                                       block_multiple=block_multiple, output_dtype=output_dtype, version=version)
    if not callable(func):
        raise TypeError(f"from_function needs a function of a block, got {type(func).__name__}")
    whole = tuple(sorted({int(a) for a in whole_axes}))
    if not all(0 <= a <= 2 for a in whole):
        raise ValueError(f"whole_axes must be axes 0, 1 or 2; got {whole_axes!r}")
    try:
        dtype = np.dtype(output_dtype)
    except TypeError:
        raise ValueError(f"output_dtype {output_dtype!r} is not a NumPy dtype") from None
    properties = {
        "halo": _axes(halo, "halo"),
        "whole_axes": whole,
        "axis_classes": (0, 1, 2) if axis_classes is None else _axes(axis_classes, "axis_classes", maximum=2),
        "block_multiple": _axes(block_multiple, "block_multiple", minimum=1),
        "output_dtype": dtype.str,
        "description": (inspect.getdoc(func) or "").split("\n")[0] or f"from_function({name})",
    }
    if version is not None and not (isinstance(version, str) and version.strip()):
        raise ValueError(f"version must be a non-empty string; got {version!r}")
    cls = _class(name, version or code_digest(func, properties), _pickled_by_value(func), properties)
    register(cls)  # a redefinition under the name replaces the previous one
    return cls()


def study_key(operator) -> str:
    """The operator's name, with ``@<digest>`` for each member made from a function: the key of
    its profiles, so that a changed function starts a new study (``gaussian,my_op@3fa2...``)."""
    members = getattr(operator, "members", None) or (operator,)
    return operator.name + "".join(f"@{m.version}" for m in members if isinstance(m, FunctionOperator))
