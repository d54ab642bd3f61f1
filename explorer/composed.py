r"""A pipeline's peak memory from its members' models, with no profile of the pipeline.

Core: arithmetic on the members' saved models (``explorer.surrogate.load_model``), no
process, no torch.  ``load_model(spec)`` returns a :class:`ComposedModel` when the
pipeline has no model of its own and every member has one.

What is alive while a stage runs
--------------------------------
``operators.pipeline.Pipeline.run`` applies every stage to the whole block ``b`` (the
fused task's block: each stage sees the same shape) and releases an intermediate once the
next stage has produced its output.  A member's isolated ``peak_bytes`` ``P_s(b)`` is its
growth over its input, its own output included (``docs/definitions.md``).  The pipeline's
growth over *its* input is therefore, while stage ``s`` runs, the previous stage's output
(the stage's input, allocated by the pipeline) plus the stage's own peak::

    peak(b) = max( P_1(b),  max_{s >= 2} ( O_{s-1}(b) + P_s(b) ) )

with ``O_s(b)`` the bytes of stage ``s``'s output (deterministic: its shape and dtype).
In a fan-out last stage the branches run in the order written on the prefix's output
``y``, and the outputs of the branches already run stay alive::

    while branch j runs:  O_prefix(b) + sum_{i < j} O_{B_i}(b) + P_{B_j}(b)

(``O_prefix = 0`` when the fan-out is the first stage: the input is the caller's).

Uncertainty
-----------
Each member's model gives a Student-t bound ``U_s`` at a confidence.  The peak is the
largest of ``S`` stage terms; with each ``U_s`` at ``c_s = 1 - (1 - c) / S`` (Bonferroni),
``P(every stage term <= its bound) >= c`` whatever their dependence, so::

    upper(b) = max_s ( alive_s(b) + U_s(b; c_s) )   holds with probability >= c
    mean(b)  = max_s ( alive_s(b) + mean_s(b) )

A member's own uncertainty (too few profiles, a model learnt elsewhere) is carried into the
pipeline's bound unchanged; ``stale`` lists every member's.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ComposedModel", "bonferroni_confidence", "compose", "stage_terms"]


def stage_terms(pipeline) -> list[tuple[object, list]]:
    """``[(member, alive), ...]`` in the order the members run: each member operator with
    the list of operators whose outputs are alive while it runs (module docstring)."""
    terms, previous = [], None
    for stage in pipeline.stages:
        if len(stage) == 1:
            terms.append((stage[0], [previous] if previous is not None else []))
            previous = stage[0]
            continue
        done = []
        for branch in stage:
            alive = ([previous] if previous is not None else []) + list(done)
            terms.append((branch, alive))
            done.append(branch)
    return terms


def _output_bytes(op, shapes: np.ndarray) -> np.ndarray:
    """Bytes of ``op``'s output on each block (vectorised for the same-shape outputs of the
    base class; one call per row for an operator that changes the shape)."""
    from operators import Operator

    if type(op).output_shape is Operator.output_shape:
        out = shapes.astype(np.float64)
    else:
        out = np.asarray([op.output_shape(tuple(int(n) for n in s)) for s in shapes], dtype=np.float64)
    return out.prod(axis=1) * float(np.dtype(op.output_dtype).itemsize)


class ComposedModel:
    """A pipeline's isolated peak from its members' models (module docstring).  Offers what
    the planner and ``TaskModel`` use of a ``MemoryModel``: ``predict_many``, ``predict``,
    ``operator``, ``halo``, ``info``, ``stale``."""

    composed = True

    def __init__(self, pipeline, members: dict):
        self.pipeline = pipeline
        self.members = members  # member name -> its MemoryModel
        self.operator = pipeline.name
        self.halo = tuple(pipeline.halo)
        self.terms = stage_terms(pipeline)
        speeds = [m.info.get("seconds_per_voxel") for m in members.values()]
        self.info = {
            "composed_from": sorted(members),
            "seconds_per_voxel": (sum(float(s) for s in speeds) if all(s is not None for s in speeds) else None),
        }
        self.stale = [f"{name}: {reason}" for name, m in members.items() for reason in (getattr(m, "stale", None) or [])]

    def predict_many(self, shapes, confidence: float = 0.99) -> tuple[np.ndarray, np.ndarray]:
        """``(mean, upper)`` bytes of the pipeline's isolated peak on blocks ``shapes``."""
        shapes = np.asarray(shapes, dtype=np.int64).reshape(-1, 3)
        per_stage = bonferroni_confidence(confidence, len(self.terms))
        outputs = {}
        mean = np.full(len(shapes), -np.inf)
        upper = np.full(len(shapes), -np.inf)
        for member, alive in self.terms:
            m, u = self.members[member.name].predict_many(shapes, per_stage)
            held = np.zeros(len(shapes))
            for op in alive:
                if op.name not in outputs:
                    outputs[op.name] = _output_bytes(op, shapes)
                held = held + outputs[op.name]
            mean = np.maximum(mean, held + np.asarray(m, dtype=np.float64))
            upper = np.maximum(upper, held + np.asarray(u, dtype=np.float64))
        return mean, upper

    def predict(self, shape, confidence: float = 0.99) -> tuple[float, float]:
        mean, upper = self.predict_many(np.asarray(shape).reshape(1, 3), confidence)
        return float(mean[0]), float(upper[0])

    def __repr__(self) -> str:
        return f"<ComposedModel {self.operator} from {', '.join(sorted(self.members))}>"


def compose(pipeline, runs_dir=None) -> ComposedModel:
    """The composed model of ``pipeline`` from its members' saved models.  Raises
    ``ModelNotFoundError`` naming every member without a model and the command to explore
    each."""
    from explorer import paths
    from explorer.surrogate import ModelNotFoundError, load_model

    members, missing = {}, []
    for op in pipeline.members:
        if op.name in members:
            continue
        try:
            members[op.name] = load_model(op.name, runs_dir=runs_dir)
        except ModelNotFoundError:
            missing.append(op.name)
    if missing:
        commands = "; ".join(paths.explore_command(name) for name in missing)
        raise ModelNotFoundError(
            f"no explored model for {pipeline.name!r} and none for its member(s) {', '.join(missing)}: run "
            f"{commands} (the pipeline's model is then composed from its members'), or "
            f"{paths.explore_command(pipeline.name)} to learn the pipeline itself")
    return ComposedModel(pipeline, members)


def bonferroni_confidence(confidence: float, n_terms: int) -> float:
    """``1 - (1 - c) / S``: each of ``S`` bounds' confidence so that all hold with ``>= c``."""
    return 1.0 - (1.0 - float(confidence)) / max(1, int(n_terms))

