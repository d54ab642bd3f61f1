"""The operator interface and the registry.

An operator is a block-wise computation on a 3D volume with axes
(inline, crossline, samples).  It has two forms that must agree exactly:

* ``run(block)``: the NumPy form on one in-memory block;
* ``dask(array)``: the Dask form, each task's block overlapping its neighbours
  by the halo (``map_overlap``'s pieces from a Dask array, or one windowed read
  per task from a source: :func:`windowed_map`) after making the axes that
  must stay whole one chunk, so that the chunked result equals ``run`` on the
  whole volume, seams included.

``halo[i]`` is the number of neighbour samples along axis ``i`` that one
output sample depends on.  A Dask task on a chunk ``c`` therefore sees a
block of ``c[i] + 2 * halo[i]`` samples along each axis that is not whole.
"""

from __future__ import annotations

import functools
import re
from typing import Callable, ClassVar

import numpy as np

Shape = tuple[int, ...]


class SpecError(ValueError):
    """A malformed operator spec or parameter; the message is one line naming the fault."""


def alike(values) -> Shape:
    """Axis classes (``Operator.axis_classes``) from a per-axis parameter: axes whose values
    are equal share a class, numbered in order of first appearance (``(2, 2, 4)`` -> ``(0, 0, 1)``)."""
    labels: dict = {}
    return tuple(labels.setdefault(v, len(labels)) for v in values)


class Operator:
    """Base class of all operators.

    Subclasses set ``name``, ``halo``, ``whole_axes``, ``description`` and
    implement ``run``.  ``output_shape`` and ``output_dtype`` default to a
    same-shape float32 result.
    """

    name: ClassVar[str]
    description: ClassVar[str] = ""
    halo: ClassVar[Shape] = (0, 0, 0)
    whole_axes: ClassVar[tuple[int, ...]] = ()
    output_dtype: ClassVar[np.dtype] = np.dtype(np.float32)
    #: The operator pads each block up to a multiple of these per axis before computing
    #: (a U-Net's ``2^levels``); its memory then steps with ``ceil(n / m) * m``, which the
    #: surrogate takes as its input (``explorer.model.basis.effective_dims``).
    block_multiple: ClassVar[Shape] = (1, 1, 1)
    #: Axes with one class are alike: permuting them leaves the operator's peak memory
    #: unchanged (an isotropic stencil: ``(0, 0, 0)``; inline and crossline alike, samples
    #: apart: ``(0, 0, 1)``).  The surrogate is then invariant under those permutations (its
    #: mean's terms tied, ``explorer.model.basis.basis_map``; its kernel on the dims sorted
    #: within a class, ``canonical_dims``): one profile informs every permutation of its block.
    #: Declare only what is measured (``tests/test_operators.py`` profiles every declared
    #: permutation); the default, every axis its own, claims nothing.
    axis_classes: ClassVar[Shape] = (0, 1, 2)
    #: A version string for the operator's code; when None, the environment stamp of a
    #: saved model uses a digest of the module that defines the class.
    version: ClassVar[str | None] = None
    #: What a spec may set in parentheses (``gaussian(sigma=4)``): parameter name -> a
    #: parser of its text that returns the value or raises :class:`SpecError`.  A set
    #: parameter becomes an instance attribute, :meth:`configure` derives the rest (the
    #: halo), and the operator's ``name`` carries it (its study, its model).
    parameters: ClassVar[dict[str, Callable[[str], object]]] = {}

    def configure(self) -> None:
        """Derive what depends on the parameters (``halo``, ``description``) after they are set."""

    @classmethod
    def from_parameters(cls, given: dict[str, str]) -> "Operator":
        """An instance with the parameters of a spec set (texts parsed by ``parameters``)."""
        op = cls()
        if not given:
            return op
        for key in given:
            if key not in cls.parameters:
                known = ", ".join(sorted(cls.parameters)) or "none"
                raise SpecError(f"{cls.name} has no parameter {key!r} (its parameters: {known})")
        try:
            values = {key: cls.parameters[key](text) for key, text in given.items()}
        except SpecError as exc:
            raise SpecError(f"{cls.name}: {exc}") from None
        for key, value in values.items():
            setattr(op, key, value)
        written = f"{cls.name}(" + ",".join(f"{key}={text}" for key, text in given.items()) + ")"
        try:
            op.configure()
        except (ArithmeticError, ValueError) as exc:  # e.g. a halo int(truncate * sigma) of sigma=1e308
            raise SpecError(f"{written}: its parameters give no usable operator ({type(exc).__name__}: {exc})") from None
        if not all(0 <= int(h) <= MAX_HALO for h in op.halo):
            raise SpecError(f"{written}: its halo is beyond {MAX_HALO} samples, longer than any volume's axis")
        op.name = call_name(cls.name, values, {key: getattr(cls, key) for key in values})
        return op

    def run(self, block: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def output_shape(self, shape: Shape) -> Shape:
        return tuple(int(n) for n in shape)

    def dask(self, array, *, wrap=None, chunks=None):
        """The Dask form: equal to ``run`` on the whole volume, seams included.

        ``array`` is a Dask array (its chunks are the tasks' chunks), or any source that
        slices like a NumPy array (``shape``, ``dtype``, ``source[i0:i1, j0:j1, k0:k1]``:
        a :class:`operators.segy.SegyVolume`, a zarr or NumPy array) with ``chunks``.

        Axes in ``whole_axes``, and axes no longer than their halo, are made one chunk
        first; the other axes see ``halo`` samples of their neighbours when they have
        several chunks.  From a Dask array that is ``map_overlap``: each chunk is sliced
        into pieces that its neighbours gather, so a chunk stays resident until its last
        neighbour has run.  From a source, each task reads its block (its chunk and the
        halo, not past the volume's edges), runs and trims it (:func:`windowed_map`): no
        chunk is kept for a neighbour, at the price of reading the halos twice.

        ``wrap(run, block)``, when given, is called instead of ``run(block)`` for
        every block, with this operator's bound ``run``: a hook that must return
        ``run(block)`` (e.g. a measuring one, which then travels with the graph).
        """
        block_function = self.run if wrap is None else functools.partial(wrap, self.run)
        return self.blockwise(block_function, array, chunks, dtype=self.output_dtype)

    def blockwise(self, function, array, chunks=None, *, dtype, leading: tuple[int, ...] = ()):
        """``function`` on every block of ``array`` (a Dask array, or a source read in windows on
        ``chunks``: :meth:`dask`), its result trimmed by the depth back to the chunk.
        ``leading``: lengths of axes ``function`` puts before the volume's (one chunk each)."""
        import dask.array as da
        from dask.array.overlap import overlap, trim_internal

        meta = np.empty((0,) * (len(leading) + array.ndim), dtype=dtype)
        if not isinstance(array, da.Array):
            if chunks is None:
                raise ValueError("the Dask form of a source that is not a Dask array needs its chunks")
            layout, depth = self.windowed_layout(array.shape, chunks)
            return windowed_map(array, layout, depth, function, dtype=dtype, leading=leading)
        if chunks is not None:
            array = array.rechunk(chunks)
        array, depth = self.overlap_depth(array)
        # boundary="none": blocks at the volume's edges are not padded, so run() applies its
        # own edge handling exactly as on the whole volume.
        extended = overlap(array, depth=depth, boundary="none") if any(depth.values()) else array
        new_axis = list(range(len(leading))) or None
        out = extended.map_blocks(function, dtype=dtype, meta=meta, new_axis=new_axis,
                                  chunks=tuple((n,) for n in leading) + extended.chunks)
        if not any(depth.values()):
            return out
        return trim_internal(out, {**{a: 0 for a in range(len(leading))},
                                   **{a + len(leading): d for a, d in depth.items()}}, boundary="none")

    def windowed_layout(self, shape, chunks) -> tuple[tuple, dict]:
        """``(chunks, depth)`` of the windowed form on a volume of ``shape``: :meth:`overlap_depth`'s
        (whole axes one chunk), and, as ``overlap`` does, a chunk shorter than the depth merged
        with its neighbour, so that a window never reaches past the next chunk."""
        import dask.array as da
        from dask.array.overlap import ensure_minimum_chunksize

        layout, depth = self.overlap_depth(da.empty(shape, chunks=chunks, dtype=np.uint8))
        return tuple(ensure_minimum_chunksize(depth[a], c) if depth[a] else c
                     for a, c in enumerate(layout.chunks)), depth

    def overlap_depth(self, array):
        """``(array, depth)``: ``array`` rechunked so that the axes that must be whole are,
        and the ``map_overlap`` depth per axis (0 on an axis in one chunk)."""
        # An axis no longer than its halo is kept whole too: every output sample along it
        # depends on all of it, and map_overlap refuses a depth larger than the array.
        whole = set(self.whole_axes) | {a for a, h in enumerate(self.halo) if h and array.shape[a] <= h}
        if any(array.numblocks[a] > 1 for a in whole):
            array = array.rechunk({axis: -1 for axis in sorted(whole)})
        # An axis in one chunk has no neighbours: no depth (and none larger than the array).
        depth = {axis: (0 if axis in whole or array.numblocks[axis] == 1 else h) for axis, h in enumerate(self.halo)}
        return array, depth

    def __repr__(self) -> str:
        return f"<operator {self.name} halo={self.halo} whole_axes={self.whole_axes}>"


def windowed_map(source, chunks, depth, function, *, dtype, leading: tuple[int, ...] = (), name: str | None = None):
    """A Dask array of ``function`` on ``source``'s blocks, each read, computed and trimmed in one task.

    The chunk grid is ``chunks`` (per-axis lengths, Dask's normal form).  Along an axis of
    ``k`` chunks with depth ``d``, block ``j`` is the window ``[start_j - d [j > 0], stop_j +
    d [j < k - 1])`` of ``source``: the block ``dask.array.overlap.overlap(x, depth,
    boundary="none")`` gives the same task.  The task reads it (``source[window]``), applies
    ``function`` and trims the depth off the block's inner sides (a contiguous copy, the
    untrimmed result freed: :func:`_windowed_task`).  ``overlap`` instead slices every chunk
    into pieces that its neighbours gather, so a chunk read from the file stays resident until
    its last neighbour has run, and a worker that reads ahead of its slow tasks holds many
    (``scripts/results/run_trace_survey.md``: one worker held about 15 chunks' worth of
    pieces).  Here a task depends on nothing (the source travels in it, unless it is a NumPy
    array): nothing is kept for a neighbour, and a task not yet started holds nothing.
    ``source`` slices like a NumPy array (``shape``, ``dtype``, basic slices) and is cheap to
    pickle unless it is a NumPy array; ``depth`` per axis (a dict); ``leading``: lengths of
    axes ``function`` puts before the volume's.
    """
    import itertools

    from dask.array.core import Array
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph

    ndim = len(chunks)
    depth = [int(depth.get(a, 0)) for a in range(ndim)]
    windows, trims = [], []
    for lengths, d in zip(chunks, depth):
        edges = np.concatenate([[0], np.cumsum(lengths)]).astype(int).tolist()
        k = len(lengths)
        windows.append([(edges[j] - (d if j > 0 else 0), edges[j + 1] + (d if j < k - 1 else 0)) for j in range(k)])
        trims.append([(d if j > 0 else 0, int(lengths[j])) for j in range(k)])
    name = name or f"windowed-{tokenize(source, tuple(map(tuple, chunks)), tuple(depth), function, leading)}"
    # A reader of a file (a few KiB pickled) travels inside every task, so that a task depends
    # on nothing and the scheduler spreads the tasks over the workers: as a key of its own it
    # would live on one worker, which Dask then favours for every task that needs it (4 tasks
    # of gst3d on 2 workers ran 3 + 1).  An array in memory is kept once, as a key.
    graph = {}
    original = source
    if isinstance(source, np.ndarray):
        original = f"source-{name}"
        graph[original] = source
    lead = (0,) * len(leading)
    for index in itertools.product(*(range(len(w)) for w in windows)):
        window = tuple(slice(*windows[a][j]) for a, j in enumerate(index))
        trim = (Ellipsis,) + tuple(slice(t[j][0], t[j][0] + t[j][1]) for t, j in zip(trims, index))
        graph[(name, *lead, *index)] = (_windowed_task, original, window, function, trim)
    meta = np.empty((0,) * (len(leading) + ndim), dtype=dtype)
    out_chunks = tuple((int(n),) for n in leading) + tuple(tuple(int(c) for c in axis) for axis in chunks)
    return Array(HighLevelGraph.from_collections(name, graph, dependencies=()), name, out_chunks, meta=meta)


def _windowed_task(source, window, function, trim) -> np.ndarray:
    """The block read, computed and trimmed to its chunk: a contiguous copy, so that the block's
    whole output is freed when the task returns.  A trimmed view would keep it alive, and the
    store would then copy the view again before encoding: one block more at the task's peak
    (``zarr``'s ``array[...] = view`` of a 160^3 float32 chunk: 2 chunks beside it, 1 for a
    contiguous array; first_derivative's in-worker tasks: 3 blocks on cubes, 2 on whole traces)."""
    result = function(np.asarray(source[window]))
    return np.ascontiguousarray(result[trim])


_REGISTRY: dict[str, Callable[[], Operator]] = {}

#: Names no operator may take: filled by :func:`reserve_names`, not written here.  The
#: ``explore`` command reserves its subcommands (``explorer.cli.COMMANDS``) before it loads
#: any plugin, so this list cannot drift from the CLI's (operators know nothing of it).
RESERVED_NAMES: set[str] = set()
#: The longest halo an operator may have: no volume's axis is longer (``explorer.core.units.MAX_DIM``,
#: the same bound; ``tests/test_operators.py`` checks that they agree).
MAX_HALO = 1 << 24


def reserve_names(names, why: str = "a CLI subcommand") -> None:
    """Keep ``names`` from operators from now on (``register`` raises naming ``why``);
    a name an operator already has raises ``ValueError`` here instead."""
    taken = sorted(set(names) & set(_REGISTRY))
    if taken:
        raise ValueError(f"operator name(s) {', '.join(map(repr, taken))} clash with {why}: rename the operator")
    RESERVED_NAMES.update(names)


#: What an operator's name may be: it names its directory under the runs directory and its study.
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def check_name(name) -> None:
    """``ValueError`` (one line) unless ``name`` may name an operator: letters, digits and
    underscores, not starting with a digit, and not a CLI subcommand."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"operator name {name!r} must be letters, digits and underscores, not starting with a "
                         "digit (it names the operator's directory under the runs directory)")
    if name in RESERVED_NAMES:
        raise ValueError(f"operator name {name!r} is reserved for a CLI subcommand")


def register(cls: type[Operator]) -> type[Operator]:
    """Class decorator adding an operator to the registry under ``cls.name``.

    The name is letters, digits and underscores, not starting with a digit (it becomes a
    directory under the runs directory: nothing a name says may lead outside it).  Registering
    the same class again is a no-op, and a class of the same module and qualified name replaces
    the one registered (a notebook cell or a script run again); another class under a taken
    name is an error."""
    name = cls.name
    check_name(name)
    existing = _REGISTRY.get(name)
    if existing is not None and existing is not cls and (
            (existing.__module__, existing.__qualname__) != (cls.__module__, cls.__qualname__)):
        raise ValueError(f"operator {name!r} is registered twice: by {existing.__module__}.{existing.__qualname__} "
                         f"and {cls.__module__}.{cls.__qualname__}")
    _REGISTRY[name] = cls
    return cls


def _format_value(value) -> str:
    """The canonical text of a parameter value: ``4``, ``1.5``, ``1x1x2``."""
    if isinstance(value, (tuple, list)):
        if len(set(value)) == 1:
            return _format_value(value[0])
        return "x".join(_format_value(v) for v in value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return repr(value) if isinstance(value, float) else str(value)


def call_name(name: str, params: dict, defaults: dict) -> str:
    """``name(key=value,...)`` with the parameters that differ from ``defaults``, sorted."""
    differ = {k: v for k, v in params.items() if _format_value(v) != _format_value(defaults.get(k))}
    if not differ:
        return name
    return f"{name}(" + ",".join(f"{k}={_format_value(differ[k])}" for k in sorted(differ)) + ")"


def names() -> list[str]:
    """Sorted names of all registered operators."""
    return sorted(_REGISTRY)


def registered(name: str) -> type[Operator]:
    """The class registered under ``name``; ``KeyError`` with the known names otherwise."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown operator {name!r}; known operators: {', '.join(names())}") from None
