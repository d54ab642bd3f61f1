"""The quantile of the largest of ``n`` tasks' peaks (``explorer.plan.excess`` states the model):
tabulated standard distributions, quadrature over the shared error, Newton's method for the
bound (:func:`max_task_quantile`).
"""

from __future__ import annotations

import functools
import math

import numpy as np

__all__ = [
    "StandardDistribution",
    "max_task_quantile",
    "student_t_distribution",
]


# --------------------------------------------------------------------------- the largest of n tasks


#: The standardised distributions below are tabulated on one grid, uniform in
#: ``y = z / (1 + |z| / Z0)``: spacing 0.0078 near 0, wider in the tails, ``|z|`` up to ~8,000.
_Z0 = 16.0
_TABLE_SIZE = 4096
_Y_MAX = _Z0 * (1.0 - 1.0 / 512.0)
_TABLE_Y = np.linspace(-_Y_MAX, _Y_MAX, _TABLE_SIZE)
_TABLE_Z = _TABLE_Y / (1.0 - np.abs(_TABLE_Y) / _Z0)
_INV_DY = 1.0 / (_TABLE_Y[1] - _TABLE_Y[0])
_LAST = _TABLE_SIZE - 1.000001


def _grid_index(z) -> tuple[np.ndarray, np.ndarray]:
    """``(i, frac)``: where ``z`` falls on the tables' grid (clipped to its ends)."""
    p = np.abs(z)
    p *= 1.0 / _Z0
    p += 1.0
    np.divide(z, p, out=p)
    p += _Y_MAX
    p *= _INV_DY
    np.maximum(p, 0.0, out=p)
    np.minimum(p, _LAST, out=p)
    i = p.astype(np.intp)
    p -= i
    return i, p


def _lerp(table, i, frac):
    low = table[i]
    return low + (table[i + 1] - low) * frac


def _pairs(first, second) -> np.ndarray:
    """``(N, 4)``: each grid point's ``first``, its step to the next, ``second``, its step:
    one gather (``np.take`` along rows) interpolates both (:func:`_log_terms`)."""
    return np.stack([first, np.diff(first, append=first[-1]), second, np.diff(second, append=second[-1])], axis=1)


class StandardDistribution:
    """A standardised distribution tabulated on the grid: ``F``, the density ``f``, ``log F``,
    ``f / F`` (for the largest of ``n``: ``G = F^n``, ``log G = n log F``), and its quantile
    at ``logit p`` (a second table, uniform in ``logit p`` on [-60, 60])."""

    _LOGIT = 60.0
    _N_LOGIT = 8192

    def __init__(self, cdf, density):
        F = np.clip(np.maximum.accumulate(np.asarray(cdf, dtype=np.float64)), 1e-300, 1.0)
        self.F, self.f = F, np.maximum(np.asarray(density, dtype=np.float64), 0.0)
        self.log_F = np.log(F)
        self.dlog_F = self.f / F
        self.log_pairs = _pairs(self.log_F, self.dlog_F)
        #: :class:`_Tables`' layout of this distribution alone (float32: one gather's temporary
        #: stays small; ``log F`` to a relative 6e-8), and ``d(f / F) / dz`` with its step in the
        #: columns a table's ``theta`` differences take (for :func:`_max_nodes`' Halley steps).
        self.rows = np.zeros((_TABLE_SIZE, 8), dtype=np.float32)
        self.rows[:, :4] = self.log_pairs
        curvature = np.gradient(self.dlog_F, _TABLE_Z)
        self.rows[:, 4:6] = _pairs(curvature, curvature)[:, :2]
        logit = self.log_F - np.log(np.clip(1.0 - F, 1e-300, 1.0))
        rising = np.concatenate([[True], np.diff(logit) > 0])
        levels = np.linspace(-self._LOGIT, self._LOGIT, self._N_LOGIT)
        self._q_of_logit = np.interp(levels, logit[rising], _TABLE_Z[rising])
        self._q_scale = (self._N_LOGIT - 1) / (2 * self._LOGIT)

    def quantile_at_logit(self, logit) -> np.ndarray:
        """``F^{-1}(p)`` at ``logit p`` (elementwise)."""
        p = np.clip((np.asarray(logit, dtype=np.float64) + self._LOGIT) * self._q_scale, 0.0,
                    self._N_LOGIT - 1.000001)
        i = p.astype(np.intp)
        return _lerp(self._q_of_logit, i, p - i)

    def max_quantiles(self, levels: tuple, count) -> np.ndarray:
        """``(m, len(levels))``: the ``levels``-quantiles of the largest of ``count`` draws (per row;
        tabulated at ``count = 2^0 .. 2^30``, linear in ``log2 count`` between: within about
        ``0.01`` of the standard scale, a starting point, not an answer)."""
        tables = self.__dict__.setdefault("_max_quantiles", {})
        table = tables.get(levels)
        if table is None:
            log_q = np.log(np.asarray(levels, dtype=np.float64))[:, None] / 2.0 ** np.arange(31)[None, :]
            table = tables[levels] = self.quantile_at_logit(log_q - np.log(-np.expm1(log_q))).T.copy()
        position = np.minimum(np.log2(np.maximum(np.asarray(count, dtype=np.float64), 1.0)), 29.999999)
        j = position.astype(np.intp)
        low = table[j]
        return low + (table[j + 1] - low) * (position - j)[:, None]

    def max_quantiles_above(self, levels: tuple, count) -> np.ndarray:
        """:meth:`max_quantiles` at the next power of two at or above ``count``: the largest of
        more draws, so no less (for an upper bound)."""
        self.max_quantiles(levels, [1.0])
        table = self.__dict__["_max_quantiles"][levels]
        j = np.minimum(np.ceil(np.log2(np.maximum(np.asarray(count, dtype=np.float64), 1.0)) - 1e-9), 30.0)
        return table[j.astype(np.intp)]

    def max_range(self, count) -> np.ndarray:
        """The 10-90% range of the largest of ``count`` draws (elementwise; tabulated at
        ``count = 2^0 .. 2^30``, linear in ``log2 count`` between)."""
        table = getattr(self, "_max_range", None)
        if table is None:
            powers = 2.0 ** np.arange(31)
            spread = [self.quantile_at_logit(lq - np.log(-np.expm1(lq))) for lq in
                      (math.log(0.9) / powers, math.log(0.1) / powers)]
            table = self._max_range = spread[0] - spread[1]
        return np.interp(np.log2(np.maximum(count, 1.0)), np.arange(31.0), table)


@functools.lru_cache(maxsize=64)
def student_t_distribution(dof: float) -> StandardDistribution:
    """The standard Student-t with ``dof`` degrees of freedom (``inf``: the normal), tabulated."""
    from scipy.special import gammaln, ndtr, stdtr

    dof = float(dof)
    z = _TABLE_Z
    if math.isinf(dof):
        return StandardDistribution(ndtr(z), np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi))
    log_c = gammaln((dof + 1.0) / 2.0) - gammaln(dof / 2.0) - 0.5 * math.log(dof * math.pi)
    return StandardDistribution(stdtr(dof, z), np.exp(log_c - (dof + 1.0) / 2.0 * np.log1p(z * z / dof)))


#: Columns of the shared error's table: ``theta`` in ``[0, pi/2]`` in this many steps (``log F``
#: linear in ``theta`` between them: the quantile's error about ``(pi/32)^2 / 8 = 1e-3`` of it).
THETA_STEPS = 16


@functools.lru_cache(maxsize=256)
def _sum_column(dof1: float, dof2: float, j: int) -> StandardDistribution:
    """``Z = cos(theta) T_1 + sin(theta) T_2`` at ``theta = j pi / (2 THETA_STEPS)`` (independent
    standard Student-t's with ``dof1``, ``dof2``): ``F(z) = E[F_a((z - s T_b) / c)]`` over the
    component with the smaller weight ``s`` (the other's ``c >= s``: its cdf is the smoother), at
    its quantiles: 24 Gauss-Hermite nodes in the normal score with 10 or more dof, else the
    trapezoid rule in ``logit p`` on 61 nodes (a column costs 5-15 ms, once per process)."""
    t1, t2 = (student_t_distribution(d) for d in (dof1, dof2))
    if j == 0:
        return t1
    if j == THETA_STEPS:
        return t2
    theta = j * (math.pi / 2.0) / THETA_STEPS
    cos, sin = math.cos(theta), math.sin(theta)
    (big, wide), (small, narrow, small_dof) = ((t1, cos), (t2, sin, dof2)) if cos >= sin else \
        ((t2, sin), (t1, cos, dof1))
    rule = _Rule(24, gauss_hermite=True) if small_dof >= 10.0 else _Rule(61, -30.0, 30.0)
    i, frac = _grid_index((_TABLE_Z[:, None] - narrow * small.quantile_at_logit(rule.logit)[None, :]) / wide)
    return StandardDistribution(_lerp(big.F, i, frac) @ rule.w, (_lerp(big.f, i, frac) @ rule.w) / wide)


#: The slot of the within-group distribution in :class:`_Tables` (after the shared error's columns).
_WITHIN_SLOT = THETA_STEPS + 1


class _Tables:
    """What a bound's evaluation gathers from, in one array of 8-wide rows per grid point:
    ``log F`` and ``f / F`` with their steps to the next grid point (:func:`_pairs`), then the
    same of the next slot's minus this one's (``log F`` linear in ``theta`` between two columns
    in one gather).  Slots ``0 .. THETA_STEPS``: the shared error's columns (:func:`_sum_column`,
    copied in when first needed, with their neighbour); slot :data:`_WITHIN_SLOT`: the
    within-group distribution (its differences zero).  And each built column's quantiles at
    levels asked before (memoised)."""

    def __init__(self, dof1: float, dof2: float, within: StandardDistribution):
        self.dofs = (float(dof1), float(dof2))
        self.rows = np.zeros(((_WITHIN_SLOT + 1) * _TABLE_SIZE, 8), dtype=np.float32)
        self.rows[_WITHIN_SLOT * _TABLE_SIZE:, :4] = within.rows[:, :4]
        self.F = np.zeros((THETA_STEPS + 1, _TABLE_SIZE))
        self.built = np.zeros(THETA_STEPS + 1, dtype=bool)
        self.version = 0  # bumped when a column is built (the quantiles' memo is then refilled)
        self._quantiles: dict = {}

    def _slot(self, j: int) -> np.ndarray:
        return self.rows[j * _TABLE_SIZE:(j + 1) * _TABLE_SIZE]

    def build(self, columns) -> None:
        """Columns ``columns`` and, for each, the next one (its ``theta`` difference)."""
        columns = np.asarray(columns)
        if self.built[columns].all() and self.built[np.minimum(columns + 1, THETA_STEPS)].all():
            return
        for j in np.unique(np.minimum(np.concatenate([np.asarray(columns), np.asarray(columns) + 1]), THETA_STEPS)):
            if not self.built[j]:
                column = _sum_column(*self.dofs, int(j))
                self.F[j] = column.F
                self._slot(j)[:, :4] = column.rows[:, :4]
                self.built[j] = True
                self.version += 1
                for lower in (j - 1, j):
                    if 0 <= lower < THETA_STEPS and self.built[lower] and self.built[lower + 1]:
                        upper, here = _sum_column(*self.dofs, lower + 1), _sum_column(*self.dofs, lower)
                        self._slot(lower)[:, 4:] = upper.log_pairs - here.log_pairs

    def quantiles(self, levels: tuple) -> np.ndarray:
        """``(THETA_STEPS + 1, len(levels))``: each built column's quantiles at ``levels``."""
        entry = self._quantiles.get(levels)
        if entry is not None and entry[1] == self.version:
            return entry[0]
        table = np.full((THETA_STEPS + 1, len(levels)), np.nan) if entry is None else entry[0]
        for j in np.flatnonzero(self.built & np.isnan(table[:, 0])):
            table[j] = np.interp(levels, self.F[j], _TABLE_Z)
        self._quantiles[levels] = (table, self.version)
        return table


@functools.lru_cache(maxsize=8)
def _tables(dof1: float, dof2: float, within: StandardDistribution) -> _Tables:
    return _Tables(dof1, dof2, within)


class _Rule:
    """A quadrature over an integrated variable's quantiles ``p_k`` (``logit`` their log-odds)
    with weights ``w_k``: the
    trapezoid rule in ``v = logit p`` on ``[v_lo, v_hi]`` (weights ``p_k (1 - p_k)`` normalised),
    or, with ``gauss_hermite``, Gauss-Hermite in the normal score ``Phi^{-1}(p)`` with that many
    nodes (spectrally accurate when the variable's quantile is smooth in its normal score: light
    tails)."""

    def __init__(self, nodes: int, v_lo: float = 0.0, v_hi: float = 0.0, *, gauss_hermite: bool = False):
        if gauss_hermite:
            from numpy.polynomial.hermite_e import hermegauss
            from scipy.special import log_ndtr, ndtr

            z, w = hermegauss(nodes)
            self.p = ndtr(z)
            self.logit = log_ndtr(z) - log_ndtr(-z)
        else:
            v = np.linspace(v_lo, v_hi, nodes)
            self.p = 1.0 / (1.0 + np.exp(-v))
            self.logit = v
            w = self.p * (1.0 - self.p)
        self.w = w / w.sum()
        self.levels = tuple(float(p) for p in self.p)


#: Every Student-t involved with 10 or more dof: 8 Gauss-Hermite nodes.  Against numerical
#: integration (the configurations below with ``c`` 95% to 99.9%, ``n`` 1 to 1,000, with and
#: without cold tasks): within ``1.8e-3 (a + sigma)``, median ``2e-5``.
LIGHT_RULE = _Rule(8, gauss_hermite=True)
#: 5 or more dof: 15 trapezoid nodes in ``logit p`` to ``p = 1 - 3e-10`` (the integrated
#: variable's lower tail matters little, the other's cdf is ~1 there; its upper tail holds the
#: ``1 - c``): within ``2.5e-3 (a + sigma)``, median ``2e-4``.
QUADRATURE_RULE = _Rule(15, -6.0, 22.0)
#: Fewer than 5: within ``4e-4 (a + sigma)`` down to 4 dof; with 3 dof, ``1e-4`` at 99%, 2.5% at
#: 99.9%.  (An error of ``1e-3 (a + sigma)`` in ``u`` is one of about ``3e-5`` in ``P`` at 99%.)
FINE_RULE = _Rule(97, -14.0, 28.0)


def _rule(dof: float) -> _Rule:
    """The quadrature for the smallest dof among the Student-t's a bound involves."""
    return LIGHT_RULE if dof >= 10.0 else QUADRATURE_RULE if dof >= 5.0 else FINE_RULE
#: Rows are solved in blocks of at most this many: the temporaries stay under glibc's 128 KiB
#: mmap threshold (above it each is a fresh mapping whose page faults took 4x the time here).
BLOCK_ROWS = 256
#: :func:`max_task_quantile`'s states of a row not solved: its ``u`` a lower bound above the
#: ceiling, or an upper bound at or below it.
ABOVE, BELOW = 1, 2


#: The cold tasks' spread is taken as at least this share of the warm tasks' (a numerical floor,
#: not a statistic: a fitted spread of 0 would make ``(x - kappa) / sigma_c`` infinite on the
#: tables' grid; a floor widens the cold factor, so the bound can only grow).
_MIN_STRETCH = 1.0 / 64.0


def max_task_quantile(confidence: float, shared_scales, shared_dofs, within_sd, tasks, *, cold=0, cold_offset=0.0,
                      cold_sd=None, within_dof: float = math.inf, ceiling=None):
    r"""The ``c``-quantile ``u`` of ``S + max_i D_i`` over ``n`` tasks, per row (bytes above the
    tasks' common location).

    ``S = a T_1 + b T_2`` is shared by all the tasks of a plan (``shared_scales`` ``(a, b)``,
    ``shared_dofs`` ``(nu_1, nu_2)``: independent standard Student-t's); ``D_i = W_i`` for the
    ``n - k`` warm tasks and ``kappa + sigma_c Z_i`` for the ``k`` cold ones (``cold`` ``k``,
    ``cold_offset`` ``kappa``, ``cold_sd`` ``sigma_c``, by default ``sigma``), ``W_i = sigma Z_i`` iid
    (``within_sd`` ``sigma``; ``Z`` a standard Student-t with ``within_dof``).  With
    ``G(x) = F_Z(x / sigma)^{n-k} F_Z((x - kappa) / sigma_c)^k`` the distribution function of the
    largest ``D``::

        P(S + max_i D_i <= u) = E_S[ G(u - S) ] = E_M[ F_S(u - M) ] = c

    solved for ``u`` by Newton's method on ``logit P`` from the quadrature sum of the two
    ``c``-quantiles (the rule this replaces, ``sqrt(Q_S(c)^2 + Q_M(c)^2)``, usually a little
    below), steps at most one spread long and bisected inside the bracket the evaluations have
    found, until a step is under 1% of the spread (the error left is of its square).  The
    expectation is taken over whichever of ``S`` and ``M`` is the narrower (10-90% range), at
    its quantiles (:func:`_rule`: Gauss-Hermite in the normal score when every Student-t
    involved has 10 or more dof, else the trapezoid rule in ``logit p``): the other's
    distribution function is then smooth on the nodes' scale.  ``S``'s quantiles and ``F_S``
    come from a table of ``cos(theta) T_1 + sin(theta) T_2`` over ``theta = atan(b / a)``
    (columns every ``pi / 32``, ``log F`` linear between them); ``M``'s quantiles are
    ``sigma F_Z^{-1}(p^{1/n})`` without cold tasks, else found by Newton's method on ``log G``
    from the larger factor's.  Rows go in blocks of :data:`BLOCK_ROWS`, one Newton iteration
    per block (:func:`_solve_block`).

    ``n = 1`` without cold tasks: the quantile of ``S + W``; ``sigma = 0``: ``Q_S(c)`` plus the
    cold offset when there is a cold task; ``a = b = 0``: ``G^{-1}(c)``.

    ``ceiling`` (per row, optional): a row whose lower bound ``L`` is above it, or whose upper
    bound ``U`` is at or below it, is not solved: its ``u`` is that bound.  Returns ``(u, state)``
    then, ``state`` 0 where solved, :data:`ABOVE` where ``u = L``, :data:`BELOW` where ``u = U``.
    ``L = Q_S(c) + kappa [k >= 1]`` holds for ``c >= 1/2``: ``S`` and ``W`` are symmetric and
    unimodal (Student-t's and their sums), so for either, ``P(X + Y <= Q_X(c)) = E[(F_X(Q_X - |Y|)
    + F_X(Q_X + |Y|)) / 2] <= c`` (the mass of ``X`` just above ``Q_X`` is no more than just below
    it), and ``max_i D_i >= D_1`` (a cold one when any).  ``U = min_s Q_S(1 - s(1 - c)) +
    max(sigma, kappa + sigma_c) Q_n(1 - (1 - s)(1 - c))`` over ``s`` in 0.1, 0.3, 0.5, 0.7
    (Bonferroni: ``P(S > x) + P(M > y) = 1 - c``; ``Q_n(p) = F_Z^{-1}(p^{1/n})``, at the power of
    two at or above ``n``, bounds ``M``'s quantile: each warm factor of ``G`` is then at least
    ``p^{1/n}``, each cold one too), plus 0.1% for the tables' interpolation.  On gst3d's plans
    ``U`` is 1.2-1.5 times ``u``, and still shows 92% of the candidates a planner predicts to fit.
    """
    c = float(confidence)
    a = np.maximum(np.asarray(shared_scales[0], dtype=np.float64).reshape(-1), 0.0)
    rows = len(a)

    def per_row(value):
        value = np.asarray(value, dtype=np.float64)
        return np.full(rows, float(value.reshape(-1)[0])) if value.size == 1 else value.reshape(rows)

    b = np.maximum(per_row(shared_scales[1]), 0.0)
    sigma, n, kappa = per_row(within_sd), np.maximum(per_row(tasks), 1.0), np.maximum(per_row(cold_offset), 0.0)
    stretch = np.ones(rows) if cold_sd is None else \
        np.maximum(np.where(sigma > 0, per_row(cold_sd) / np.where(sigma > 0, sigma, 1.0), 1.0), _MIN_STRETCH)
    k = np.where((kappa > 0) | (stretch != 1.0), np.minimum(per_row(cold), n), 0.0)
    dof1, dof2 = (float(d) for d in shared_dofs)
    within = student_t_distribution(float(within_dof))
    tables = _tables(dof1, dof2, within)
    rule = _rule(min(dof1 if (a > 0).any() else math.inf, dof2 if (b > 0).any() else math.inf,
                     float(within_dof) if (sigma > 0).any() else math.inf))
    limit = None if ceiling is None else per_row(ceiling)
    u, state = np.empty(rows), np.zeros(rows, dtype=np.int8)
    for start in range(0, rows, BLOCK_ROWS):
        part = slice(start, start + BLOCK_ROWS)
        u[part], state[part] = _solve_block(c, a[part], b[part], tables, sigma[part], n[part] - k[part], k[part],
                                            kappa[part], stretch[part], within, rule,
                                            None if limit is None else limit[part])
    return u if ceiling is None else (u, state)


def _max_levels(sigma, kappa, warm, cold, log_p, within: StandardDistribution, stretch=1.0):
    """The larger of the warm maximum's and the cold maximum's ``p``-quantiles,
    ``sigma F^{-1}(p^(1 / (n - k)))`` and ``kappa + stretch sigma F^{-1}(p^(1 / k))``: a lower bound
    of ``M``'s (``G`` is at most either factor), and ``M``'s own without cold tasks."""
    out = None
    for count, shift, scale in ((warm, 0.0, sigma), (cold, kappa, sigma * stretch)) if (cold > 0).any() \
            else ((warm, 0.0, sigma),):
        log_q = log_p / np.maximum(count, 1.0)
        x = shift + scale * within.quantile_at_logit(log_q - np.log(-np.expm1(log_q)))
        x = np.where(count > 0, x, -np.inf)
        out = x if out is None else np.maximum(out, x)
    return out


def _log_terms(rows, z, base, weight):
    """``L`` and ``dL / dz`` at ``z`` in slot ``base`` of ``rows`` (:class:`_Tables`), with
    ``weight`` of the next slot's difference (``None``: none)."""
    i, frac = _grid_index(z)
    t = np.take(rows, i + base, axis=0)
    log_g = t[..., 0] + t[..., 1] * frac
    slope = t[..., 2] + t[..., 3] * frac
    if weight is not None:
        log_g += (t[..., 4] + t[..., 5] * frac) * weight
        slope += (t[..., 6] + t[..., 7] * frac) * weight
    return log_g, slope


def _newton(evaluate, u, scale, target: float, iterations: int = 40, rtol: float = 1e-2):
    """``u`` with ``logit P(u) = target`` per row (``P`` increasing; ``evaluate(u) -> (P, P')``)
    from ``u``: Newton's steps of at most ``scale``, bisection when one leaves the bracket the
    evaluations have found; stops once every step is below ``rtol scale`` (quadratic
    convergence: the step taken then leaves an error of order its square)."""
    low, high = np.full(u.shape, -np.inf), np.full(u.shape, np.inf)
    tolerance = rtol * scale
    for _ in range(iterations):
        P, slope = evaluate(u)
        np.maximum(P, 1e-300, out=P)
        np.minimum(P, 1.0 - 1e-16, out=P)
        q = 1.0 - P
        f = np.log(P / q)
        f -= target
        below = f < 0
        np.copyto(low, u, where=below)
        np.copyto(high, u, where=~below)
        step = f * P * q
        step /= np.maximum(slope, 1e-300)
        np.maximum(step, -scale, out=step)
        np.minimum(step, scale, out=step)
        new = u - step
        # strictly: a zero step (a root found) lands on the end just set; the other may be infinite
        outside = (new < low) | (new > high)
        if outside.any():
            new[outside] = 0.5 * (low[outside] + high[outside])
        elif (np.abs(step) <= tolerance).all():
            return new
        u = new
    return u


def _solve_block(c, a, b, tables: _Tables, sigma, warm, cold, kappa, stretch, within, rule, ceiling=None):
    """:func:`max_task_quantile` on one block of rows: each row's expectation as
    ``P(u) = sum_k w_k exp(c L(z_k) + k L_Z((z_k - kappa / sigma) / r))``, ``z_k = alpha u - beta_k``,
    ``r = sigma_c / sigma``:
    over ``S`` (``L = log F_Z``, ``c = n - k``, ``alpha = 1 / sigma``, ``beta_k = s_k / sigma``) or
    over ``M`` (``L = log F_S``, linear in ``theta`` between the shared error's two nearest
    columns, ``c = 1``, no cold term, ``alpha = 1 / rho``, ``beta_k = m_k / rho``): one Newton
    iteration for the whole block."""
    rows = len(a)
    rho = np.hypot(a, b)
    if (b > 0).any():
        position = np.arctan2(b, a) * (THETA_STEPS / (math.pi / 2.0))
        j = np.minimum(position.astype(np.intp), THETA_STEPS - 1)
        theta_frac = position - j
        tables.build(j)
    else:
        j, theta_frac = np.zeros(rows, dtype=np.intp), np.zeros(rows)
        tables.build([0])

    def shared_quantiles(at, levels: tuple):
        table = tables.quantiles(levels)
        jj, w = j[at], theta_frac[at, None]
        low = table[jj]
        if (w > 0).any():
            low = low + (table[np.minimum(jj + 1, THETA_STEPS)] - low) * w
        return low * rho[at, None]

    q = shared_quantiles(slice(None), (0.1, 0.9, c))
    has_cold = cold > 0
    u = q[:, 2] + np.where(has_cold, kappa, 0.0)  # sigma = 0; else a lower bound (max_task_quantile)
    still = sigma <= 0  # no spread within: the largest task is the cold offset above the rest
    state = np.zeros(rows, dtype=np.int8)
    if ceiling is not None:
        state[~still & (u > ceiling)] = ABOVE
        shares = (0.1, 0.3, 0.5, 0.7)
        s_part = shared_quantiles(slice(None), tuple(1.0 - s * (1.0 - c) for s in shares))
        widest = np.maximum(sigma, np.where(has_cold, sigma * stretch, 0.0))[:, None]
        m_part = np.where(has_cold, kappa, 0.0)[:, None] + widest * within.max_quantiles_above(
            tuple(1.0 - (1.0 - s) * (1.0 - c) for s in shares), warm + cold)
        upper = s_part + m_part
        upper = upper.min(axis=1) + 1e-3 * (np.abs(s_part) + np.abs(m_part)).max(axis=1)
        below = ~still & (state == 0) & (upper <= ceiling)
        u[below], state[below] = upper[below], BELOW
        still = still | (state != 0)
    if still.all():
        return u, state
    todo = slice(None) if not still.any() else np.flatnonzero(~still)
    if not isinstance(todo, slice):
        q, j, theta_frac, rho = q[todo], j[todo], theta_frac[todo], rho[todo]
        sigma, warm, cold, kappa, has_cold = sigma[todo], warm[todo], cold[todo], kappa[todo], has_cold[todo]
        stretch = stretch[todo]
    sig = sigma
    spread_m = sig * within.max_range(np.maximum(warm, 1.0)) + np.where(has_cold, kappa, 0.0)
    scale = q[:, 1] - q[:, 0] + spread_m
    largest = sig * within.max_quantiles((c,), warm)[:, 0]
    if has_cold.any():
        largest = np.where(warm > 0, largest, -np.inf)
        largest = np.maximum(largest, np.where(has_cold, kappa + sig * stretch * within.max_quantiles((c,), cold)[:, 0],
                                               -np.inf))
    start = np.hypot(np.maximum(q[:, 2], 0.0), np.maximum(largest, 0.0))
    over_m = (q[:, 1] - q[:, 0]) > spread_m  # S the wider: integrate over M
    alpha = np.where(over_m, 1.0 / np.maximum(rho, 1e-300), 1.0 / sig)
    beta = np.empty((len(sig), len(rule.p)))
    over_s = np.flatnonzero(~over_m)
    if len(over_s):
        beta[over_s] = shared_quantiles(over_s, rule.levels) / sig[over_s, None]
    at = np.flatnonzero(over_m)
    if len(at):
        beta[at] = _max_nodes(sig[at, None], kappa[at, None], warm[at, None], cold[at, None], stretch[at, None],
                              rule, within) / np.maximum(rho[at], 1e-300)[:, None]
    coef = np.where(over_m, 1.0, warm)[:, None]
    mix = np.where(over_m, theta_frac, 0.0)[:, None] if (theta_frac[over_m] > 0).any() else None
    base = (np.where(over_m, j, _WITHIN_SLOT) * _TABLE_SIZE)[:, None]
    few = np.where(over_m, 0.0, cold)[:, None] if (cold[~over_m] > 0).any() else None
    shift = np.where(over_m, 0.0, kappa / sig)[:, None]
    narrow = (1.0 / stretch)[:, None]
    rows_, weights = tables.rows, rule.w

    def evaluate(x):
        z = (x * alpha)[:, None] - beta
        log_g, slope = _log_terms(rows_, z, base, mix)
        log_g *= coef
        slope *= coef
        if few is not None:  # the cold tasks' factor F((x - kappa) / sigma_c)^k
            log_c, slope_c = _log_terms(rows_, (z - shift) * narrow, _WITHIN_SLOT * _TABLE_SIZE, None)
            log_g += log_c * few
            slope += slope_c * (few * narrow)
        g = np.exp(log_g)
        slope *= g
        return g @ weights, (slope @ weights) * alpha
    u[todo] = _newton(evaluate, start, scale, math.log(c) - math.log1p(-c))
    return u, state


def _max_nodes(sigma, kappa, warm, cold, stretch, rule: _Rule, within: StandardDistribution):
    """``M``'s quantiles at the rule's levels (``(m, 1)`` columns in, ``(m, K)`` out): without
    cold tasks in closed form, else by Halley's method on ``log G(x) = log p`` from the larger
    factor's (tabulated: :meth:`StandardDistribution.max_quantiles`), steps at most ``sigma``,
    until every step is under ``1e-3 sigma``."""
    if not (cold > 0).any():
        return _max_levels(sigma, kappa, warm, cold, np.log(rule.p)[None, :], within)
    log_p = np.log(rule.p)[None, :]
    x = np.maximum(np.where(warm > 0, sigma * within.max_quantiles(rule.levels, warm[:, 0]), -np.inf),
                   np.where(cold > 0, kappa + sigma * stretch * within.max_quantiles(rule.levels, cold[:, 0]), -np.inf))
    inv, kappa_z, narrow = 1.0 / sigma, kappa / sigma, 1.0 / stretch
    rows = within.rows
    for _ in range(20):
        z = x * inv
        log_g, slope, bend = _curved_terms(rows, z)
        log_c, slope_c, bend_c = _curved_terms(rows, (z - kappa_z) * narrow)
        f = warm * log_g + cold * log_c - log_p
        d1 = np.maximum(warm * slope + cold * narrow * slope_c, 1e-300)
        d2 = warm * bend + cold * narrow * narrow * bend_c
        # Halley's step, at most twice Newton's and one sigma long
        step = 2.0 * f * d1 / np.maximum(2.0 * d1 * d1 - f * d2, d1 * d1) * sigma
        np.maximum(step, -sigma, out=step)
        np.minimum(step, sigma, out=step)
        x = x - step
        if (np.abs(step) <= 1e-3 * sigma).all():
            break
    return x


def _curved_terms(rows, z):
    """``log F``, ``f / F`` and its derivative at ``z`` (a distribution's own ``rows``)."""
    i, frac = _grid_index(z)
    t = np.take(rows, i, axis=0)
    return t[..., 0] + t[..., 1] * frac, t[..., 2] + t[..., 3] * frac, t[..., 4] + t[..., 5] * frac
