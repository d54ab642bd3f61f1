r"""A pipeline's peak memory from its members' models, with no profile of the pipeline.

Core: arithmetic on the members' saved models (``explorer.model.saved.load_saved_model``), no
process, no torch.  ``load_model(spec)`` (``explorer.model.load``) returns a :class:`ComposedModel` when the
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
In a fan-out last stage the branches run one after another on the prefix's output ``y``,
and the outputs of the branches already run stay alive::

    while branch j runs:  O_prefix(b) + sum_{i before j} O_{B_i}(b) + P_{B_j}(b)

(``O_prefix = 0`` when the fan-out is the first stage: the input is the caller's).

The order the branches run in
-----------------------------
The largest of those terms depends on the order.  Running the branches in decreasing
``P_j - O_j`` minimises it (Liu 1987, the post-order rule for trees; an exchange argument:
swapping two neighbours out of that order never lowers the larger of their two terms), so
the composed model predicts the pipeline run in that order at each block
(:func:`liu_order` on the branches' upper bounds), and ``recommend_chunks`` puts the order
of the plan's block in the plan (``ChunkPlan.branch_order``) for the run to use
(``Pipeline.in_order``).

Uncertainty
-----------
Each member's model gives a Student-t bound ``U_s`` at a confidence.  The peak is the
largest of ``S`` stage terms; with each ``U_s`` at ``c_s = 1 - (1 - c) / S`` (Bonferroni),
``P(every stage term <= its bound) >= c`` whatever their dependence, so::

    upper(b) = max_s ( alive_s(b) + U_s(b; c_s) )   holds with probability >= c
    mean(b)  = max_s ( alive_s(b) + mean_s(b) )

A member's own uncertainty (too few profiles, a model learnt elsewhere) is carried into the
pipeline's bound unchanged; ``stale`` lists every member's.

A lower bound from one member
-----------------------------
Every stage term is at least what one of its members adds to what is held before it (the
outputs of a fan-out's earlier branches are >= 0), so member ``X``'s bound alone gives::

    upper(b) >= max_{s containing X} ( O_{s-1}(b) + U_X(b; c_s) )      (O_0 = 0)

A planner that only needs to know whether ``upper(b)`` exceeds a ceiling (a block whose
footprint cannot fit: ``explorer.plan.chunk_plan``'s ``ceiling``) predicts the members one at a
time, heaviest first, and stops on a block as soon as one member's bound exceeds it.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ComposedModel", "bonferroni_confidence", "compose", "liu_order", "sequence_peak"]


def liu_order(peak: np.ndarray, output: np.ndarray) -> np.ndarray:
    """Per row, the branch indices in decreasing ``peak - output`` (Liu's rule): the order
    that minimises :func:`sequence_peak`.  ``peak``, ``output``: ``(m, B)`` bytes."""
    return np.argsort(-(np.asarray(peak, np.float64) - np.asarray(output, np.float64)), axis=1, kind="stable")


def sequence_peak(held: np.ndarray, peak: np.ndarray, output: np.ndarray, order: np.ndarray) -> np.ndarray:
    """``max_j (held + sum_{i before j} O_i + P_j)`` per row, the branches run in ``order``
    (``(m, B)`` indices): the peak of a fan-out over what its prefix holds."""
    p = np.take_along_axis(np.asarray(peak, np.float64), order, axis=1)
    o = np.take_along_axis(np.asarray(output, np.float64), order, axis=1)
    return np.asarray(held, np.float64) + (np.cumsum(o, axis=1) - o + p).max(axis=1)


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
    ``predictive_t``, ``operator``, ``halo``, ``info``, ``stale``, ``warnings``."""

    composed = True

    def __init__(self, pipeline, members: dict):
        self.pipeline = pipeline
        self.members = members  # member name -> its MemoryModel
        self.operator = pipeline.name
        self.halo = tuple(pipeline.halo)
        speeds = [m.info.get("seconds_per_voxel") for m in members.values()]
        self.info = {
            "composed_from": sorted(members),
            "seconds_per_voxel": (sum(float(s) for s in speeds) if all(s is not None for s in speeds) else None),
        }
        self.stale = [f"{name}: {reason}" for name, m in members.items() for reason in (getattr(m, "stale", None) or [])]
        #: The members' own warnings (a member whose loop did not converge).
        self.warnings = [w for m in members.values() for w in getattr(m, "warnings", [])]
        #: The members' names in decreasing bound, once a call with a ``ceiling`` has ranked them.
        self._heaviest_first: list[str] | None = None

    def _stage_terms(self, stage, shapes, per_stage, seen: dict):
        """``(means, uppers, outputs)``, each ``(m, len(stage))``: the stage's members' bounds at
        ``per_stage`` and their output bytes; a member met before in ``seen`` is not predicted
        again (``gaussian,envelope,gaussian``)."""
        for op in stage:
            if op.name not in seen:
                m, u = self.members[op.name].predict_many(shapes, per_stage)
                seen[op.name] = (np.asarray(m, dtype=np.float64), np.asarray(u, dtype=np.float64),
                                 _output_bytes(op, shapes))
        return tuple(np.stack([seen[op.name][k] for op in stage], axis=1) for k in range(3))

    def predict_many(self, shapes, confidence: float = 0.99, *, branch_order=None,
                     ceiling=None) -> tuple[np.ndarray, np.ndarray]:
        """``(mean, upper)`` bytes of the pipeline's isolated peak on blocks ``shapes``, a
        fan-out's branches run in ``branch_order`` (names), by default Liu's order at each
        block (module docstring).

        ``ceiling`` (``(m,)`` bytes, optional): a block whose upper is shown above its ceiling
        by one member's bound (module docstring, :meth:`_bounded_rows`) is not predicted
        further: its ``mean`` is NaN and its ``upper`` that lower bound (> the ceiling)."""
        shapes = np.asarray(shapes, dtype=np.int64).reshape(-1, 3)
        per_stage = bonferroni_confidence(confidence, len(self.pipeline.members))
        if ceiling is None:
            return self._composed(shapes, per_stage, branch_order, {})
        rows, floor, seen = self._bounded_rows(shapes, per_stage, np.asarray(ceiling, dtype=np.float64))
        mean = np.full(len(shapes), np.nan)
        upper = floor
        if len(rows):
            mean[rows], upper[rows] = self._composed(shapes[rows], per_stage, branch_order, seen)
        return mean, upper

    predict_many.takes_ceiling = True  # the planner's Predictor protocol (explorer.plan.predictor)

    def _bounded_rows(self, shapes, per_stage: float, ceiling: np.ndarray):
        """``(rows, floor, seen)``: the members predicted one at a time on the blocks not yet
        shown above their ceiling, ``floor`` each block's lower bound of ``upper`` so far
        (module docstring), ``rows`` the blocks left at or below their ceiling and ``seen``
        every member's ``(mean, upper, output)`` at them (:meth:`_stage_terms`).  Heaviest
        member first: the first call predicts every member on every block (``rows`` all of
        them) and ranks the members by their mean bound there."""
        stages, ranking = self.pipeline.stages, self._heaviest_first is None
        members = {op.name: op for op in self.pipeline.members}
        rows = np.arange(len(shapes))
        floor = np.full(len(shapes), -np.inf)
        seen, weight = {}, {}
        for name in members if ranking else self._heaviest_first:
            if not len(rows):
                break
            at = shapes[rows]
            m, u = self.members[name].predict_many(at, per_stage)
            u = np.asarray(u, dtype=np.float64)
            seen[name] = (np.asarray(m, dtype=np.float64), u, _output_bytes(members[name], at))
            bound = np.full(len(rows), -np.inf)
            for s, stage in enumerate(stages):
                if any(op.name == name for op in stage):
                    held = _output_bytes(stages[s - 1][0], at) if s else 0.0
                    bound = np.maximum(bound, held + u)
            floor[rows] = np.maximum(floor[rows], bound)
            if ranking:
                weight[name] = float(np.mean(bound)) if len(bound) else 0.0
                continue
            keep = ~(floor[rows] > ceiling[rows])
            rows = rows[keep]
            seen = {k: tuple(x[keep] for x in v) for k, v in seen.items()}
        if ranking:
            self._heaviest_first = sorted(members, key=lambda n: -weight[n])
        return rows, floor, seen

    def _composed(self, shapes, per_stage: float, branch_order, seen: dict) -> tuple[np.ndarray, np.ndarray]:
        """The module docstring's ``(mean, upper)`` at ``shapes``, the members' predictions
        already in ``seen`` reused."""
        mean = np.full(len(shapes), -np.inf)
        upper = np.full(len(shapes), -np.inf)
        held = np.zeros(len(shapes))
        for stage in self.pipeline.stages:
            means, uppers, outputs = self._stage_terms(stage, shapes, per_stage, seen)
            if len(stage) == 1:  # sequence_peak of one branch: held + its peak, no order to choose
                mean = np.maximum(mean, held + means[:, 0])
                upper = np.maximum(upper, held + uppers[:, 0])
            else:
                order = self._order(uppers, outputs, branch_order)
                mean = np.maximum(mean, sequence_peak(held, means, outputs, order))
                upper = np.maximum(upper, sequence_peak(held, uppers, outputs, order))
            held = outputs[:, 0]  # only a fan-out's stage has several outputs, and it is the last
        return mean, upper

    def _order(self, uppers, outputs, branch_order) -> np.ndarray:
        if branch_order is None or uppers.shape[1] == 1:
            return liu_order(uppers, outputs)
        index = [self.pipeline.branches.index(name) for name in self.pipeline.in_order(branch_order).branch_order]
        return np.broadcast_to(np.asarray(index), uppers.shape)

    def branch_order(self, shape, confidence: float = 0.99) -> tuple[str, ...]:
        """The fan-out's branches in Liu's order on a block of ``shape`` (empty: no fan-out)."""
        branches = self.pipeline.branches
        if not branches:
            return ()
        shapes = np.asarray(shape, dtype=np.int64).reshape(1, 3)
        per_stage = bonferroni_confidence(confidence, len(self.pipeline.members))
        _, uppers, outputs = self._stage_terms(self.pipeline.stages[-1], shapes, per_stage, {})
        return tuple(branches[i] for i in liu_order(uppers, outputs)[0])

    def predict(self, shape, confidence: float = 0.99) -> tuple[float, float]:
        mean, upper = self.predict_many(np.asarray(shape).reshape(1, 3), confidence)
        return float(mean[0]), float(upper[0])

    def predictive_t(self, shapes, confidence: float = 0.99) -> tuple[np.ndarray, np.ndarray, float]:
        """``(location, scale, dof)`` of a Student-t matched to the composed bound at
        ``confidence``: ``location`` the composed mean, ``dof`` the members' fewest (the
        heaviest tail among them), ``scale = (upper(c) - mean) / t_dof(c)``, so that
        ``upper(c) = location + scale t_dof(c)`` as for a member (``MemoryModel.predictive_t``).
        The composed bound is a largest of Bonferroni bounds, not a Student-t: away from
        ``confidence`` this is an approximation.  What the in-worker task model builds on
        (``explorer.plan.excess.task_bound``), which takes the scale from the bound it is
        given and only the dof from here."""
        from explorer.model.stats import t_quantile

        shapes = np.asarray(shapes, dtype=np.int64).reshape(-1, 3)
        dofs = [float(m.predictive_t(shapes[:1])[2]) if hasattr(m, "predictive_t") else float("inf")
                for m in self.members.values()]
        dof = min(dofs) if dofs else float("inf")
        mean, upper = self.predict_many(shapes, confidence)
        return mean, np.maximum(upper - mean, 0.0) / t_quantile(float(confidence), dof), dof

    def in_order(self, branch_order) -> "_InOrder":
        """This model predicting the fan-out run in ``branch_order`` (names) at every block, not
        Liu's order: what a pipeline's own profiles run (``Pipeline.branch_order``, the order
        written), so what their prior must predict (``explorer.search.core.composed_prior``)."""
        return _InOrder(self, tuple(branch_order))

    @property
    def source(self) -> str:
        """Where this prediction comes from, in words (a prior's ``source``)."""
        return f"composed from the models of {', '.join(sorted(self.members))}"

    def __repr__(self) -> str:
        return f"<ComposedModel {self.operator} from {', '.join(sorted(self.members))}>"


class _InOrder:
    """A :class:`ComposedModel` whose fan-out runs in one fixed order (:meth:`ComposedModel.in_order`)."""

    def __init__(self, model: ComposedModel, branch_order: tuple[str, ...]):
        self.model, self.branch_order_fixed = model, branch_order

    def predict_many(self, shapes, confidence: float = 0.99):
        order = self.branch_order_fixed if self.model.pipeline.branches else None
        return self.model.predict_many(shapes, confidence, branch_order=order)

    @property
    def source(self) -> str:
        if not self.model.pipeline.branches:
            return self.model.source
        return f"{self.model.source}, branches run as {', '.join(self.branch_order_fixed)}"

    def __repr__(self) -> str:
        return f"<ComposedModel {self.model.operator} in the order {', '.join(self.branch_order_fixed)}>"


def compose(pipeline, runs_dir=None) -> ComposedModel:
    """The composed model of ``pipeline`` from its members' saved models.  Raises
    ``ModelNotFoundError`` naming every member without a model and the command to explore
    each."""
    from explorer.core import paths
    from explorer.model.memory_model import ModelNotFoundError
    from explorer.model.saved import load_saved_model

    members, missing = {}, []
    for op in pipeline.members:
        if op.name in members:
            continue
        try:
            members[op.name] = load_saved_model(op.name, runs_dir=runs_dir)
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

