"""What the planner asks of a task's memory: a :class:`Predictor`, and the optional keywords
it declares it takes (:func:`takes_keywords`, :func:`takes`).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

__all__ = [
    "OPTIONAL_KEYWORDS",
    "Predictor",
    "takes",
    "takes_keywords",
]


#: The keywords a predictor may take beyond ``confidence``, each declared (:func:`takes_keywords`).
OPTIONAL_KEYWORDS = ("tasks", "ceiling", "cold")


class Predictor(Protocol):
    """``predict(block_shapes (m, ndim) int64, confidence=...) -> (mean_bytes (m,), upper_bytes (m,))``:
    a task's peak bytes on each block, its mean and its upper bound at ``confidence``.

    Beyond ``confidence`` a predictor may take three keywords; the planner passes one only
    when the predictor declares it, by a true ``takes_tasks``, ``takes_ceiling`` or
    ``takes_cold`` attribute (:func:`takes_keywords` on a function or method; a class
    attribute of a callable object; a method of a model below ``explorer.plan`` sets the
    attribute itself):

    * ``tasks`` (``(m,)``: the tasks of each row's plan): ``upper`` bounds the largest of that
      many tasks (``explorer.plan.task_model.TaskModel``: a plan's footprint must hold for
      every task it runs).
    * ``ceiling`` (``(m,)`` bytes: the largest task peak with which each row's plan still
      fits): the predictor may stop short on a row once it has shown that the row's ``upper``
      exceeds its ceiling: it returns ``mean = nan`` there and, as ``upper``, a lower bound of
      the row's upper that is above the ceiling (``explorer.model.composed.ComposedModel``: one
      member's term bounds the pipeline's peak from below; ``TaskModel``: the isolated bound, or
      its quantile's lower bound), and where it has shown that the row's upper is at or below
      its ceiling it may return, also with ``mean = nan``, an upper bound of it (``TaskModel``:
      a Bonferroni bound, a few table lookups instead of the quantile's quadrature):
      ``plan_chunks`` predicts the candidates the upper footprint ranks, and its plan, again
      without a ceiling where they were not solved (``explorer.plan.planner._rank_on_own_bounds``).
    * ``cold`` (``(m,)``, passed only with ``tasks``): how many of each row's tasks are their
      slot's first of the run, ``min(tasks, slots)``: a worker's first task finds none of the
      run's freed memory to reuse (the task model's cold offset).  A one-shape predictor
      (``TaskModel.predict``, the live observer's) takes 1 for a worker's first task, 0 for a
      later one.
    """

    def __call__(self, block_shapes: np.ndarray, *, confidence: float) -> tuple[np.ndarray, np.ndarray]:
        ...


def takes_keywords(*keywords: str):
    """Declare that the decorated predictor function (or method) takes ``keywords``, some of
    :data:`OPTIONAL_KEYWORDS`: sets its ``takes_<keyword>`` attributes to True (a bound
    method reads its function's)."""
    unknown = sorted(set(keywords) - set(OPTIONAL_KEYWORDS))
    if unknown:
        raise ValueError(f"unknown predictor keyword(s) {', '.join(unknown)}: one of {', '.join(OPTIONAL_KEYWORDS)}")

    def declare(function):
        for keyword in keywords:
            setattr(function, f"takes_{keyword}", True)
        return function

    return declare


def takes(predict, keyword: str) -> bool:
    """Whether ``predict`` declared that it takes ``keyword`` (its ``takes_<keyword>``
    attribute; False without one)."""
    return bool(getattr(predict, f"takes_{keyword}", False))
