"""The mean basis, the feature map and the residual kernel of the model, in NumPy (mirrored in
torch by ``explorer.model.gp_torch``); the math is stated in ``explorer.model.memory_model``.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from explorer.model.stats import t_quantile

__all__ = [
    "BASIS_NAMES",
]


#: The mean basis, in the order of ``beta`` (physical units: bytes, bytes per voxel, ...).
BASIS_NAMES = ("constant", "volume", "face12", "face13", "face23", "edge1", "edge2", "edge3")
#: The basis itself, the one definition every form uses (NumPy here, torch in ``gp_torch``):
#: term ``j`` is the monomial ``prod_i u_i ** BASIS_EXPONENTS[j, i]``.
BASIS_EXPONENTS = np.array([[0, 0, 0], [1, 1, 1], [1, 1, 0], [1, 0, 1], [0, 1, 1], [1, 0, 0], [0, 1, 0], [0, 0, 1]])
#: The axes each term multiplies, in increasing order (``BASIS_EXPONENTS`` holds only 0 and 1).
_TERM_AXES = [tuple(int(a) for a in np.flatnonzero(row)) for row in BASIS_EXPONENTS]
assert set(np.unique(BASIS_EXPONENTS)) <= {0, 1}
#: Terms with a flat prior (the constant and the volume); the others get a vague Gaussian.
#: They stay the first two columns whatever ties :func:`basis_map` makes (each is its own orbit).
FLAT_TERMS = (0, 1)
#: No regime boundary (one row whose direction is all zero, :func:`regime_side`): every block is on side 0.
NO_REGIME = np.zeros((1, 5))


def basis_map(axis_classes=(0, 1, 2)) -> np.ndarray:
    """``(8, q)``: the mean's terms tied over axes that are alike (``Operator.axis_classes``).

    Axes of one class are interchangeable for the operator: permuting them leaves its peak
    unchanged, so two monomials that such a permutation maps onto each other (an *orbit*:
    ``n1 n2`` and ``n1 n3`` when axes 2 and 3 are alike) must carry one coefficient.  Column
    ``k`` averages the monomials of orbit ``k`` (so it is 1 at the design centre, like every
    raw term); orbits are numbered in the order of ``BASIS_EXPONENTS``, so the constant and
    the volume stay columns 0 and 1.  Two monomials share an orbit exactly when their
    multisets of ``(class, exponent)`` over the axes agree.  All axes distinct (the default):
    the identity, the full eight-term basis.  All alike: ``[1, V, mean of the faces, mean of
    the edges]``, four terms.
    """
    classes = tuple(int(c) for c in axis_classes)
    if len(classes) != BASIS_EXPONENTS.shape[1]:
        raise ValueError(f"axis_classes must give one class per axis, got {axis_classes}")
    orbits: dict[tuple, list[int]] = {}
    for j, exponents in enumerate(BASIS_EXPONENTS):
        key = tuple(sorted(zip(classes, (int(e) for e in exponents))))
        orbits.setdefault(key, []).append(j)
    mapping = np.zeros((len(BASIS_EXPONENTS), len(orbits)))
    for k, terms in enumerate(orbits.values()):
        mapping[terms, k] = 1.0 / len(terms)
    return mapping


def class_lengths(log_dims: np.ndarray, axis_classes) -> np.ndarray:
    """The basis's reference length per axis: the geometric mean of the profiled dims over
    every axis of the axis's class, so that alike axes share one unit (a tied coefficient
    is then one coefficient in physical units too)."""
    classes = np.asarray(axis_classes)
    per_axis = log_dims.mean(0)
    return np.exp(np.array([per_axis[classes == classes[a]].mean() for a in range(len(classes))]))


# --------------------------------------------------------------------------------------
# Feature map (pure NumPy; mirrored in torch inside the fitting code)
# --------------------------------------------------------------------------------------


def _as_dims(shapes) -> np.ndarray:
    """``(m, 3)`` float64 array of positive block dims from one shape or many."""
    dims = np.asarray(shapes, dtype=np.float64)
    if dims.ndim == 1:
        dims = dims[None, :]
    if dims.ndim != 2 or dims.shape[1] != 3:
        raise ValueError(f"expected shapes of 3 dims, got an array of shape {dims.shape}")
    if not np.all(dims > 0):
        raise ValueError("block dims must be positive")
    return dims


def effective_dims(dims: np.ndarray, multiple) -> np.ndarray:
    """``ceil(n / m) * m`` per axis: the dims an operator that pads its block to a multiple
    ``m`` (``Operator.block_multiple``) really computes on; ``m = 1`` leaves them alone."""
    multiple = np.asarray(multiple, dtype=np.float64)
    return np.ceil(dims / multiple) * multiple


def _raw_basis(dims: np.ndarray, axis_length: np.ndarray, multiple, mapping=None, regime=NO_REGIME,
               side=None) -> np.ndarray:
    """``[1, V, n1n2, n1n3, n2n3, n1, n2, n3]`` on ``u = effective_dims / axis_length``, (m, 8),
    tied by ``mapping`` (:func:`basis_map`, (8, q); None: untied) into (m, q); with ``B`` regime
    boundaries, the constant and the volume once more times the block's side of each (``side``,
    or :func:`regime_side`'s), (m, q + 2B): each side its own level and bytes per voxel."""
    u = effective_dims(dims, multiple) / axis_length
    raw = np.empty((len(u), len(BASIS_EXPONENTS)))
    for term, axes in enumerate(_TERM_AXES):  # exponents are 0 or 1: products of columns (hot path)
        if not axes:
            raw[:, term] = 1.0
            continue
        column = u[:, axes[0]].copy()
        for axis in axes[1:]:
            column *= u[:, axis]
        raw[:, term] = column
    tied = raw if mapping is None else raw @ mapping
    active = regime_rows(regime)[:, :3].any(axis=1)
    if not active.any():
        return tied
    side = (regime_side(dims, regime, multiple) if side is None else side)[:, active]
    flat = tied[:, list(FLAT_TERMS)]
    return np.column_stack([tied] + [side[:, [b]] * flat for b in range(side.shape[1])])


def alike_groups(axis_classes) -> tuple[np.ndarray, ...]:
    """The axes of each class that has more than one (``Operator.axis_classes``), as index arrays."""
    classes = np.asarray(axis_classes, dtype=np.int64)
    return tuple(np.flatnonzero(classes == c) for c in np.unique(classes) if np.sum(classes == c) > 1)


def canonical_dims(dims: np.ndarray, groups) -> np.ndarray:
    """The dims sorted ascending within each group of alike axes (:func:`alike_groups`): one
    representative of every permutation an alike-axes operator cannot tell apart, so a kernel
    on them is invariant under those permutations (a profile informs all of its permutations)."""
    if not groups:
        return dims
    dims = np.array(dims, dtype=np.float64, copy=True)
    for group in groups:
        dims[:, group] = np.sort(dims[:, group], axis=1)
    return dims


def regime_rows(regime) -> np.ndarray:
    """``regime`` as ``(B, 5)`` rows, one per boundary (a model saved with one boundary kept it as ``(5,)``)."""
    return np.atleast_2d(np.asarray(regime, dtype=np.float64))


def regime_side(dims: np.ndarray, regime, multiple) -> np.ndarray:
    """Which side of each of the model's regime boundaries each block lies on, ``(m, B)``: 0
    below, 1 above, 0.5 in the gap between the profiles either side (not determined).

    Each row of ``regime`` is ``(w1, w2, w3, g_lo, g_hi)``: the boundary is a level of
    ``w . log n`` (``w`` in ``{0, 1}^3``: a product of some of the block's effective dims, such
    as ``n1 n2``), known to lie between ``g_lo``, the largest value any profile below it had,
    and ``g_hi``, the smallest above it.  A row all zero (:data:`NO_REGIME`): every block is on
    side 0."""
    rows = regime_rows(regime)
    if not rows[:, :3].any():  # no boundary: the planner's hot path
        return np.zeros((len(dims), len(rows)))
    level = np.log(effective_dims(dims, multiple)) @ rows[:, :3].T
    side = np.where(level >= rows[:, 4], 1.0, np.where(level <= rows[:, 3], 0.0, 0.5))
    return np.where(rows[:, :3].any(axis=1), side, 0.0)


def regime_direction_name(direction) -> str:
    """The product of dims ``w . log n`` measures, e.g. ``"n1 n2"`` for ``w = (1, 1, 0)``."""
    return " ".join(f"n{axis + 1}" for axis in range(3) if direction[axis])


def regime_description(regime) -> str | None:
    """The boundaries of ``regime``, e.g. ``"n1 n2 between 4826 and 5406"``, ``"; "``-joined, or None."""
    rows = [row for row in regime_rows(regime) if row[:3].any()]
    return "; ".join(f"{regime_direction_name(row[:3])} between {math.exp(row[3]):.0f} and {math.exp(row[4]):.0f}"
                     for row in rows) or None


def _kernel_inputs(dims: np.ndarray, log_lo: np.ndarray, log_span: np.ndarray, multiple, groups=(),
                   regime=NO_REGIME, side=None) -> np.ndarray:
    """The kernel's inputs: the normalised log effective dims ``z = (log n - log n_lo) /
    span`` (the training box is [0, 1]^3) and the block's side of each regime boundary (``side``,
    or :func:`regime_side`'s), ``(m, 3 + B)``."""
    z = (np.log(canonical_dims(effective_dims(dims, multiple), groups)) - log_lo) / log_span
    return np.column_stack([z, regime_side(dims, regime, multiple) if side is None else side])


def _amplitude(raw: np.ndarray, gamma: np.ndarray, floor: float, slope: float) -> np.ndarray:
    """``s(x) = e(x) (e(x) / e_c)^-kappa`` with the envelope ``e = max(h^T gamma, floor)`` and
    ``e_c = max(sum gamma, floor)`` its value at the design centre (every raw term is 1 there)."""
    envelope = np.maximum(raw @ gamma, floor)
    return envelope * (envelope / max(float(gamma.sum()), floor)) ** -slope


def _matern52(za: np.ndarray, zb: np.ndarray, lengthscale: np.ndarray) -> np.ndarray:
    """Matern-5/2 correlation ``(1 + sqrt5 r + 5/3 r^2) exp(-sqrt5 r)``, ARD distance ``r``."""
    a = za / lengthscale
    return _matern52_scaled(a, (a * a).sum(1), zb / lengthscale)


def _matern52_scaled(a: np.ndarray, a_squared: np.ndarray, b: np.ndarray) -> np.ndarray:
    """:func:`_matern52` of inputs already divided by the lengthscales, with ``a_squared =
    (a * a).sum(1)`` given (a model's training side, computed once): ``r^2 = |a|^2 + |b|^2 -
    2 a.b``.  The same operations in the same order, in place on the ``(len(a), len(b))``
    result (the planner's hot path)."""
    sq = a_squared[:, None] + (b * b).sum(1)[None, :]
    cross = a @ b.T
    cross *= 2.0
    sq -= cross
    r = np.sqrt(np.maximum(sq, 0.0, out=sq), out=sq)
    s5r = math.sqrt(5.0) * r
    k = 1.0 + s5r
    quadratic = (5.0 / 3.0) * r
    quadratic *= r
    k += quadratic
    k *= np.exp(np.negative(s5r, out=s5r), out=s5r)
    return k


@lru_cache(maxsize=256)
def _bound_quantile(confidence: float, dof: float) -> float:
    """``t_nu(confidence)`` of a validated confidence (cached: ``predict_many`` is on the planner's hot path)."""
    from explorer.core import validate

    return t_quantile(validate.confidence(confidence), dof)
