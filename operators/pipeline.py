"""Pipeline specs: chains and fan-outs of operators, accepted wherever an operator name is.

Grammar (shell-safe: no spaces, no quotes needed)::

    spec    := stage ("," stage)*          stages run in sequence
    stage   := call ("+" call)*            a fan-out: each branch an output of its own
    call    := NAME [ "(" param ("," param)* ")" ]
    param   := NAME "=" VALUE              e.g. sigma=4, sigma=1x1x2, window=5x5x11

``gaussian,gst3d`` smooths then computes the dip; ``gaussian,envelope+gst3d`` smooths,
then computes envelope and dip of the smoothed volume.  A fan-out is the last stage (its
branches are the pipeline's outputs).  A parameter is part of an operator's identity: the
canonical spec (:func:`canonical`) names its study and model, and a parameter equal to
the operator's default is dropped from it (``gaussian(sigma=2)`` *is* ``gaussian``).

The composed operator (:class:`Pipeline`)::

    halo        = sum over stages of the largest halo over the stage's branches (per axis)
    whole_axes  = the union of the members'
    run(block)  = the stages in order, each intermediate released as soon as the next
                  stage has consumed it

Its Dask form takes one of two strategies (:data:`STRATEGIES`):

* ``fused`` (the base class's form): one overlapped block per task with the pipeline's
  halo (``map_overlap`` on a Dask array, one windowed read from a source), every
  task running all stages, halo regions recomputed, no intermediate leaving the task.
  Stage ``s``'s values are exact at least ``sum_{t <= s} halo_t`` from a block's inner
  edges, so after the trim by the whole halo the result equals the NumPy composition on
  the whole volume, seams included; at the volume's edges the blocks are not padded and
  each stage's own edge handling applies as on the whole volume.
* ``staged``: each stage's own Dask form (its own halo) on the previous stage's output
  (the first stage's on the input: windowed reads from a source), a fan-out's branches
  each on the prefix's output: every intermediate is a Dask array held by the workers
  until its neighbours have sliced their halos.  Each stage's form equals its NumPy form on the whole volume, so their
  composition equals the pipeline's.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

import numpy as np

from operators.base import _REGISTRY, Operator, Shape, SpecError, alike, call_name, register, registered

__all__ = ["STRATEGIES", "Call", "Pipeline", "SpecError", "build", "call_name", "canonical", "parse",
           "parse_shape_value"]

#: The ways a pipeline runs on Dask (module docstring): one task per block for all stages,
#: or one ``map_overlap`` per stage.
STRATEGIES = ("fused", "staged")

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
#: An operator's name as a spec may write it: anything without the grammar's characters
#: (an unknown one is then "unknown operator", naming the known ones).
_OPERATOR = re.compile(r"[^(),+=\s]+\Z")


@dataclass(frozen=True)
class Call:
    """One operator with its parameters as written (``name``, ``((key, text), ...)``)."""

    name: str
    params: tuple[tuple[str, str], ...] = ()


def _split_top(text: str, sep: str, spec: str) -> list[str]:
    """``text`` split on ``sep`` outside parentheses; unbalanced parentheses are a SpecError."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
            if depth > 1:
                raise SpecError(f"nested parentheses in {spec!r}")
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise SpecError(f"unbalanced parentheses in {spec!r}: a ')' without its '('")
        elif ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise SpecError(f"unbalanced parentheses in {spec!r}: a '(' without its ')'")
    parts.append(text[start:])
    return parts


def _call(text: str, spec: str) -> Call:
    if not text:
        raise SpecError(f"empty stage or branch in {spec!r} (two separators in a row, or one at an end)")
    if "(" not in text:
        if not _OPERATOR.match(text):
            raise SpecError(f"malformed operator name {text!r} in {spec!r}")
        return Call(text)
    name, _, rest = text.partition("(")
    if not rest.endswith(")"):
        raise SpecError(f"text after ')' in {text!r} of {spec!r}")
    if not _OPERATOR.match(name):
        raise SpecError(f"malformed operator name {name!r} in {spec!r}")
    body = rest[:-1]
    if not body:
        raise SpecError(f"empty parentheses in {text!r}: write the operator without them, or name a parameter")
    params, seen = [], set()
    for item in body.split(","):
        key, eq, value = item.partition("=")
        if not eq or not key or not value:
            raise SpecError(f"malformed parameter {item!r} of {name}: write key=value (e.g. sigma=4)")
        if not _NAME.match(key):
            raise SpecError(f"malformed parameter name {key!r} of {name}")
        if key in seen:
            raise SpecError(f"parameter {key!r} of {name} given twice")
        seen.add(key)
        params.append((key, value))
    return Call(name, tuple(params))


def parse(spec: str) -> list[list[Call]]:
    """The stages of ``spec`` (module docstring), each a list of its branches' calls."""
    if not isinstance(spec, str) or not spec.strip():
        raise SpecError("empty operator spec")
    if any(ch.isspace() for ch in spec):
        raise SpecError(f"spaces in the spec {spec!r}: write it without them (e.g. gaussian,gst3d)")
    stages = [[_call(b, spec) for b in _split_top(stage, "+", spec)] for stage in _split_top(spec, ",", spec)]
    for stage in stages[:-1]:
        if len(stage) > 1:
            raise SpecError(f"a fan-out ('+') must be the last stage of {spec!r}: its branches are the outputs")
    return stages


def parse_shape_value(text: str, kind=float, what: str = "value") -> tuple:
    """``4`` -> ``(4, 4, 4)``; ``1x1x2`` -> ``(1, 1, 2)`` (three values, or one for all axes)."""
    parts = text.lower().split("x")
    if len(parts) not in (1, 3):
        raise SpecError(f"{what} {text!r}: one value or three joined by 'x' (e.g. 5x5x11)")
    try:
        values = tuple(kind(p) for p in parts)
    except ValueError:
        raise SpecError(f"{what} {text!r} is not {'an integer' if kind is int else 'a number'}") from None
    if not all(math.isfinite(v) for v in values):
        raise SpecError(f"{what} {text!r} is not finite")
    return values * 3 if len(values) == 1 else values


def canonical(spec: str) -> str:
    """The canonical spec: each member's canonical name (defaults dropped, parameters sorted)."""
    return build(spec).name


def build(spec: str) -> Operator:
    """The operator of a spec: one member when it has one stage of one call, else a
    :class:`Pipeline`.  ``KeyError`` for an unknown operator, :class:`SpecError` otherwise."""
    stages = [[_member(call) for call in stage] for stage in parse(spec)]
    if len(stages) == 1 and len(stages[0]) == 1:
        return stages[0][0]
    return Pipeline(stages)


def _member(call: Call) -> Operator:
    """The operator of one call: a registered name (a plug-in's loaded on a miss) or a
    ``module:attr`` reference (``operators.plugins.resolve``), with its parameters."""
    from operators import plugins

    if plugins.is_reference(call.name):
        op = plugins.resolve(call.name)
        return op if not call.params else type(op).from_parameters(dict(call.params))
    try:
        cls = registered(call.name)
    except KeyError:
        plugins.load_plugins()  # a plug-in's operator looked up before anything loaded them
        cls = registered(call.name)
    return cls.from_parameters(dict(call.params))


def get(spec) -> Operator:
    """The operator a spec names: a registered name, an operator with parameters
    (``gaussian(sigma=4)``), a pipeline (``gaussian,gst3d``; ``operators.pipeline``), a
    ``module:attr`` reference (``operators.plugins``), or an ``Operator`` (an instance is
    returned as it is, its class registered; a subclass is instantiated).

    ``KeyError`` naming the known operators for an unknown one; :class:`SpecError` (a
    ``ValueError``) naming the fault for a malformed spec; ``operators.plugins.PluginError``
    for a reference or plug-in that cannot be loaded."""
    if isinstance(spec, Operator) or (isinstance(spec, type) and issubclass(spec, Operator)):
        op = spec if isinstance(spec, Operator) else spec()
        for member in getattr(op, "members", None) or (op,):  # a pipeline's members, or the operator
            register(type(member))
        return op
    cls = _REGISTRY.get(spec) if isinstance(spec, str) else None
    if cls is not None:
        return cls()
    if not isinstance(spec, str):
        raise SpecError(f"an operator is a name, a spec string or an Operator, not {type(spec).__name__}")
    return build(spec)


def _stacked(block, run):
    """The branches' outputs of one block, stacked on a new first axis (one Dask chunk)."""
    return np.stack(run(block), axis=0)


def _lcm(values) -> int:
    out = 1
    for v in values:
        out = out * int(v) // math.gcd(out, int(v))
    return out


class Pipeline(Operator):
    """Operators in sequence, the last stage possibly a fan-out (module docstring)."""

    def __init__(self, stages: list[list[Operator]], branch_order=None):
        self.stages = [list(stage) for stage in stages]
        members = [op for stage in self.stages for op in stage]
        self.members = members
        self.branches = tuple(op.name for op in self.stages[-1]) if len(self.stages[-1]) > 1 else ()
        self.name = ",".join("+".join(op.name for op in stage) for stage in self.stages)
        self.halo = tuple(sum(max(op.halo[a] for op in stage) for stage in self.stages) for a in range(3))
        self.whole_axes = tuple(sorted({a for op in members for a in op.whole_axes}))
        self.block_multiple = tuple(_lcm(op.block_multiple[a] for op in members) for a in range(3))
        # Two axes are alike for the pipeline when they are for every member and every member's
        # halo and padding treat them alike (a stage runs on the block less the halos consumed
        # before it): the meet of the members' partitions, refined by halos and multiples.
        self.axis_classes = alike(tuple((op.axis_classes[a], op.halo[a], op.block_multiple[a]) for op in members)
                                  for a in range(3))
        self.output_dtype = np.dtype(self.stages[-1][0].output_dtype)
        self.description = "pipeline: " + " -> ".join(
            "{" + ", ".join(op.name for op in stage) + "}" if len(stage) > 1 else stage[0].name
            for stage in self.stages)
        #: The order a fan-out's branches run in (names; the spec's by default): it changes the
        #: peak, not the outputs (``explorer.model.composed.liu_order`` picks it).
        self.branch_order = self._checked_order(branch_order)

    def _checked_order(self, order) -> tuple[str, ...]:
        if order is None:
            return self.branches
        order = tuple(str(name) for name in order)
        if sorted(order) != sorted(self.branches):
            raise SpecError(f"branch order {', '.join(order)} is not an order of {self.name}'s branches "
                            f"{', '.join(self.branches) or '(none)'}")
        return order

    @property
    def spec_in_order(self) -> str:
        """The spec with the fan-out's branches written in ``branch_order``: the pipeline a
        profile of that spec runs is this one, order included."""
        last = self.branch_order or (self.stages[-1][0].name,)  # no branches: the last stage's one operator
        return ",".join(["+".join(op.name for op in stage) for stage in self.stages[:-1]] + ["+".join(last)])

    def in_order(self, branch_order) -> "Pipeline":
        """This pipeline with its fan-out's branches run in ``branch_order`` (names)."""
        return Pipeline(self.stages, branch_order)

    def run(self, block: np.ndarray):
        """The stages in order; a fan-out's branches run in ``branch_order`` and return a tuple
        of outputs in the spec's order.  Each intermediate is released once the next stage
        has it."""
        x = block
        for index, stage in enumerate(self.stages):
            if len(stage) == 1:
                y = stage[0].run(x)
                if index > 0:
                    del x
                x = y
                del y
            else:
                outputs = {}
                for name in self.branch_order:
                    outputs[name] = stage[self.branches.index(name)].run(x)
                return tuple(outputs[name] for name in self.branches)
        return x

    def output_shape(self, shape: Shape) -> Shape:
        for stage in self.stages:
            shape = stage[0].output_shape(shape)
        return tuple(int(n) for n in shape)

    def dask(self, array, *, wrap=None, strategy: str = "fused", chunks=None):
        """The pipeline's Dask form in ``strategy`` (module docstring).  A chain: one array.
        A fan-out: a dict of one Dask array per branch (``branches`` order).

        ``array`` and ``chunks`` as :meth:`Operator.dask`: from a source (a SEG-Y volume) the
        blocks that read it are windowed reads, nothing kept for a neighbour.  ``fused`` runs
        every stage in one task per block: a chain is the base class's form; a fan-out stacks
        the branches' outputs of each block (one graph, the shared stages run once per block),
        then trims by the halo and splits.  ``staged`` chains the members' own Dask forms (the
        first reads the source, the later ones ``map_overlap`` the intermediates).  ``wrap`` (a
        measuring hook around each task's ``run``) applies to fused tasks, which are the
        pipeline's; a staged graph's tasks are its members', so it takes none."""
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}: one of {', '.join(STRATEGIES)}")
        if strategy == "staged":
            if wrap is not None:
                raise ValueError("a staged pipeline's tasks are its members': no hook wraps them")
            x, first = array, chunks
            for stage in self.stages[:-1]:
                x, first = stage[0].dask(x, chunks=first), None
            if not self.branches:
                return self.stages[-1][0].dask(x, chunks=first)
            return {op.name: op.dask(x, chunks=first) for op in self.stages[-1]}
        if not self.branches:
            return super().dask(array, wrap=wrap, chunks=chunks)
        run = self.run if wrap is None else functools.partial(wrap, self.run)
        stacked = self.blockwise(functools.partial(_stacked, run=run), array, chunks, dtype=self.output_dtype,
                                 leading=(len(self.branches),))
        return {name: stacked[i] for i, name in enumerate(self.branches)}
