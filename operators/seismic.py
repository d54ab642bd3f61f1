"""Seismic attribute operators on (inline, crossline, samples) volumes.

Every operator computes in float32 (int16 and float64 inputs are cast first)
and returns a float32 array of the input's shape.  Each ``run`` applies the
same boundary handling to a block as to the whole volume, so the inherited
Dask form (``map_overlap`` with ``boundary="none"``) equals ``run`` on the
whole volume as long as ``halo`` covers the influence radius of the whole
pipeline, which every class below states and derives.

Sampling is in index units: one inline, one crossline and one sample are each
a unit step.  Frequencies are in cycles per sample, dips in index space.

Box (uniform) sums are computed with ``scipy.ndimage.correlate1d`` and unit
weights rather than ``uniform_filter``: the latter keeps a running sum along
each line, whose rounding depends on where the line starts, so a block and
the whole volume would differ in the last bits.  ``correlate1d`` evaluates
every output sample on its own, which makes seams bitwise exact.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from scipy import ndimage

from operators.base import Operator, Shape, alike, register

__all__ = [
    "Envelope",
    "FirstDerivative",
    "GaussianSmoothing",
    "GradientStructureTensorDip",
    "InstantaneousFrequency",
    "InstantaneousPhase",
    "Semblance",
    "analytic_signal",
    "dip_degrees",
    "gaussian_radius",
    "structure_tensor",
    "sym3_dominant_eigenpair",
]

def _float32_volume(block: np.ndarray) -> np.ndarray:
    """``block`` as a 3D float32 array (no copy when it already is one)."""
    x = np.asarray(block, dtype=np.float32)
    if x.ndim != 3:
        raise ValueError(f"expected a 3D (inline, crossline, samples) block, got shape {x.shape}")
    return x


def _positive_triple(text: str, kind, what: str) -> tuple:
    """A spec parameter's value, one number or three joined by 'x', each > 0."""
    from operators.pipeline import SpecError, parse_shape_value

    values = parse_shape_value(text, kind, what)
    if not all(v > 0 for v in values):
        raise SpecError(f"{what}={text}: every value must be > 0")
    return values


def _odd_window(text: str) -> tuple[int, int, int]:
    """Semblance's window: odd sample counts (centred on the output sample)."""
    from operators.pipeline import SpecError

    window = _positive_triple(text, int, "window")
    if not all(w % 2 == 1 for w in window):
        raise SpecError(f"window={text}: each size must be odd (the window is centred on its sample)")
    return window


def gaussian_radius(sigma: float, truncate: float) -> int:
    """Kernel radius of ``scipy.ndimage.gaussian_filter1d``: ``int(truncate * sigma + 0.5)``."""
    return int(truncate * float(sigma) + 0.5)


# --------------------------------------------------------------------------
# Hilbert-transform attributes (trace-wise, samples axis kept whole)
# --------------------------------------------------------------------------


def analytic_signal(block: np.ndarray) -> np.ndarray:
    """Analytic signal ``z = x + i H[x]`` along the samples axis (complex64).

    ``H`` is the discrete Hilbert transform of ``scipy.signal.hilbert``: the
    FFT of each trace with negative frequencies zeroed and positive ones
    doubled, transformed back.  It treats each trace as one period of a
    periodic signal, so values near the trace ends carry wrap-around effects.
    """
    from scipy.signal import hilbert  # here, not at import: scipy.signal takes ~1 s to import

    return hilbert(_float32_volume(block), axis=-1)


@register
class Envelope(Operator):
    """Reflection strength: ``e(t) = |z(t)| = sqrt(x(t)^2 + H[x](t)^2)``."""

    name = "envelope"
    description = "Envelope (reflection strength): |x + i H[x]|, Hilbert transform along samples"
    halo: ClassVar[Shape] = (0, 0, 0)
    whole_axes: ClassVar[tuple[int, ...]] = (2,)
    axis_classes: ClassVar[Shape] = (0, 0, 1)  # measured: tests/test_operators.py

    def run(self, block: np.ndarray) -> np.ndarray:
        z = analytic_signal(block)
        return np.abs(z).astype(np.float32, copy=False)


@register
class InstantaneousPhase(Operator):
    """Instantaneous phase in radians: ``phi(t) = atan2(H[x](t), x(t))``, in (-pi, pi].

    The phase is wrapped (not unwrapped) and is 0 where the analytic signal
    is exactly 0.
    """

    name = "instantaneous_phase"
    description = "Instantaneous phase in radians, (-pi, pi]: angle(x + i H[x]), Hilbert along samples"
    halo: ClassVar[Shape] = (0, 0, 0)
    whole_axes: ClassVar[tuple[int, ...]] = (2,)
    axis_classes: ClassVar[Shape] = (0, 0, 1)  # measured: tests/test_operators.py

    def run(self, block: np.ndarray) -> np.ndarray:
        z = analytic_signal(block)
        return np.angle(z).astype(np.float32, copy=False)


@register
class InstantaneousFrequency(Operator):
    """Instantaneous frequency in cycles per sample: ``f(t) = (1 / 2 pi) d phi_u / dt``.

    ``phi_u`` is the unwrapped instantaneous phase and ``d/dt`` is
    ``np.gradient`` along samples (central difference inside, one-sided at
    the two ends).  The unwrapped phase increments are computed directly as
    ``w(t) = angle(z(t+1) conj(z(t)))`` in (-pi, pi], which is exactly what
    ``np.diff(np.unwrap(np.angle(z)))`` gives, without the cumulative sum:

    * inside: ``f(t) = (w(t-1) + w(t)) / (4 pi)``;
    * ends:   ``f(0) = w(0) / (2 pi)``, ``f(n-1) = w(n-2) / (2 pi)``.

    For a discrete complex exponential ``exp(2 pi i f0 t)`` this is exactly
    ``f0`` (|f0| < 1/2); the alternative form
    ``Im(conj(z) dz/dt) / |z|^2 / (2 pi)`` with central differences gives
    ``sin(2 pi f0) / (2 pi)`` instead and needs a guard for ``|z| = 0``.
    Multiply by the sampling rate (1 / dt) to get Hz.  Negative values are
    legitimate (interference); a trace of one sample gives 0.
    """

    name = "instantaneous_frequency"
    description = (
        "Instantaneous frequency in cycles/sample: np.gradient of the unwrapped phase of "
        "x + i H[x] along samples / (2 pi)"
    )
    halo: ClassVar[Shape] = (0, 0, 0)
    whole_axes: ClassVar[tuple[int, ...]] = (2,)
    axis_classes: ClassVar[Shape] = (0, 0, 1)  # measured: tests/test_operators.py

    def run(self, block: np.ndarray) -> np.ndarray:
        z = analytic_signal(block)
        n = z.shape[-1]
        out = np.zeros(z.shape, dtype=np.float32)
        if n < 2:
            return out
        d = z[..., 1:] * np.conj(z[..., :-1])
        del z
        w = np.angle(d).astype(np.float32, copy=False)  # unwrapped phase increments
        del d
        np.add(w[..., 1:], w[..., :-1], out=out[..., 1:-1])
        out[..., 1:-1] *= np.float32(0.5)
        out[..., 0] = w[..., 0]
        out[..., -1] = w[..., -1]
        out *= np.float32(1.0 / (2.0 * np.pi))
        return out


# --------------------------------------------------------------------------
# Filters
# --------------------------------------------------------------------------


@register
class GaussianSmoothing(Operator):
    """3D Gaussian smoothing ``scipy.ndimage.gaussian_filter(x, sigma, truncate, mode)``.

    The kernel along axis ``i`` is ``exp(-k^2 / (2 sigma_i^2))`` normalised to
    unit sum, for ``|k| <= r_i = int(truncate * sigma_i + 0.5)`` (scipy's
    radius); ``halo = r``.  The filter is separable: one 1D pass per axis, so
    the influence radius along an axis is that axis' kernel radius.
    """

    name = "gaussian"
    sigma: ClassVar[tuple[float, float, float]] = (2.0, 2.0, 2.0)
    truncate: ClassVar[float] = 4.0
    mode: ClassVar[str] = "reflect"
    description = (
        "3D Gaussian smoothing, scipy.ndimage.gaussian_filter with sigma=(2, 2, 2), truncate=4, "
        "reflect edges"
    )
    halo: ClassVar[Shape] = (
        gaussian_radius(sigma[0], truncate),
        gaussian_radius(sigma[1], truncate),
        gaussian_radius(sigma[2], truncate),
    )
    whole_axes: ClassVar[tuple[int, ...]] = ()
    axis_classes: ClassVar[Shape] = (0, 0, 0)  # measured: tests/test_operators.py
    parameters: ClassVar[dict] = {"sigma": lambda text: _positive_triple(text, float, "sigma")}

    def configure(self) -> None:
        self.halo = tuple(gaussian_radius(s, self.truncate) for s in self.sigma)
        self.axis_classes = alike(self.sigma)  # one pass per axis: axes of one sigma are alike
        sigma = ", ".join(f"{s:g}" for s in self.sigma)
        self.description = (f"3D Gaussian smoothing, scipy.ndimage.gaussian_filter with sigma=({sigma}), "
                            f"truncate={self.truncate:g}, reflect edges")

    def run(self, block: np.ndarray) -> np.ndarray:
        x = _float32_volume(block)
        return ndimage.gaussian_filter(
            x, sigma=self.sigma, truncate=self.truncate, mode=self.mode, output=np.float32
        )

    def run_torch(self, block):
        """The torch form (GPU profiling): the same separable filter, ``reflect`` edges
        (scipy's, numpy's ``symmetric``: the edge sample repeated), on ``block``'s device."""
        import torch

        y = block.to(torch.float32)
        for axis, (sigma, radius) in enumerate(zip(self.sigma, self.halo)):
            k = torch.arange(-radius, radius + 1, dtype=torch.float64, device=y.device)
            weights = torch.exp(-0.5 * (k / sigma) ** 2)
            weights = (weights / weights.sum()).to(torch.float32)
            n = y.shape[axis]
            index = torch.arange(-radius, n + radius, device=y.device)
            period = 2 * n  # symmetric reflection: ... 1 0 | 0 1 ... n-1 | n-1 n-2 ...
            index = torch.remainder(index, period)
            index = torch.where(index >= n, period - 1 - index, index)
            padded = torch.index_select(y, axis, index).movedim(axis, -1)
            lines = padded.reshape(-1, 1, padded.shape[-1])
            out = torch.nn.functional.conv1d(lines, weights.flip(0).view(1, 1, -1))
            y = out.reshape(*padded.shape[:-1], n).movedim(-1, axis)
        return y.contiguous()


@register
class FirstDerivative(Operator):
    """First derivative along samples, ``np.gradient(x, axis=2)`` (unit sample spacing).

    ``d(t) = (x(t+1) - x(t-1)) / 2`` inside, ``x(1) - x(0)`` and
    ``x(n-1) - x(n-2)`` at the trace ends; 0 for a one-sample trace.
    """

    name = "first_derivative"
    description = "First derivative along samples: central differences (x[t+1] - x[t-1]) / 2, one-sided at the ends"
    halo: ClassVar[Shape] = (0, 0, 1)
    whole_axes: ClassVar[tuple[int, ...]] = ()
    axis_classes: ClassVar[Shape] = (0, 0, 0)  # measured: tests/test_operators.py

    def run(self, block: np.ndarray) -> np.ndarray:
        x = _float32_volume(block)
        out = np.zeros(x.shape, dtype=np.float32)
        if x.shape[-1] < 2:
            return out
        np.subtract(x[..., 2:], x[..., :-2], out=out[..., 1:-1])
        out[..., 1:-1] *= np.float32(0.5)
        np.subtract(x[..., 1], x[..., 0], out=out[..., 0])
        np.subtract(x[..., -1], x[..., -2], out=out[..., -1])
        return out


@register
class Semblance(Operator):
    """Marfurt-style semblance in a 3 x 3 trace x 9 sample window.

    ``S = sum_t (sum_k x_k(t))^2 / (N sum_t sum_k x_k(t)^2)`` with the ``N = 9``
    traces ``k`` of the 3 x 3 inline/crossline neighbourhood and ``t`` over the
    9 samples centred on the output sample.  ``0 <= S <= 1`` (Cauchy-Schwarz;
    rounding is clipped); ``S = 0`` where the window's energy is 0.  Windows
    crossing the volume's faces use reflected traces/samples (scipy
    ``"reflect"``).  ``halo = (1, 1, 4)``: the window's half-widths.
    """

    name = "semblance"
    description = (
        "Semblance, 3x3 traces x 9 samples: sum_t (sum_traces x)^2 / (N_traces sum_t sum_traces x^2)"
    )
    window: ClassVar[tuple[int, int, int]] = (3, 3, 9)
    mode: ClassVar[str] = "reflect"
    halo: ClassVar[Shape] = (1, 1, 4)
    whole_axes: ClassVar[tuple[int, ...]] = ()
    axis_classes: ClassVar[Shape] = (0, 0, 1)  # measured: tests/test_operators.py
    parameters: ClassVar[dict] = {"window": lambda text: _odd_window(text)}

    def configure(self) -> None:
        self.halo = tuple(w // 2 for w in self.window)
        # the trace axes are alike when their windows are; samples are summed apart
        self.axis_classes = (0, 0, 1) if self.window[0] == self.window[1] else (0, 1, 2)
        w = self.window
        self.description = (f"Semblance, {w[0]}x{w[1]} traces x {w[2]} samples: sum_t (sum_traces x)^2 / "
                            f"(N_traces sum_t sum_traces x^2)")

    def _box_sum(self, a: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        for axis in axes:
            ndimage.correlate1d(a, np.ones(self.window[axis]), axis=axis, mode=self.mode, output=a)
        return a

    def run(self, block: np.ndarray) -> np.ndarray:
        x = _float32_volume(block)
        n_traces = self.window[0] * self.window[1]
        # numerator: sum over samples of the squared stack of the traces
        num = ndimage.correlate1d(x, np.ones(self.window[0]), axis=0, mode=self.mode, output=np.float32)
        self._box_sum(num, (1,))
        np.multiply(num, num, out=num)
        self._box_sum(num, (2,))
        # denominator: N times the window's energy
        den = np.multiply(x, x, dtype=np.float32)
        self._box_sum(den, (0, 1, 2))
        den *= np.float32(n_traces)
        out = np.zeros(x.shape, dtype=np.float32)
        np.divide(num, den, out=out, where=den > 0)
        np.clip(out, 0.0, 1.0, out=out)
        return out


# --------------------------------------------------------------------------
# Gradient structure tensor
# --------------------------------------------------------------------------


def structure_tensor(
    x: np.ndarray, sigma: float = 1.0, truncate: float = 4.0, box: int = 3, mode: str = "reflect"
) -> tuple[np.ndarray, ...]:
    """The six components ``(T00, T11, T22, T01, T02, T12)`` of the smoothed gradient structure tensor.

    ``g_i = d/dx_i (G_sigma * x)``: a Gaussian-derivative filter (order 1)
    along axis ``i`` and Gaussian smoothing (order 0) along the two others,
    each of radius ``r = int(truncate * sigma + 0.5)``.  ``T_ij`` is the
    ``box x box x box`` sum of ``g_i g_j`` (27 times ``uniform_filter``; the
    scale is irrelevant to eigenvectors).  Influence radius per axis:
    ``r + box // 2``.  float32 throughout.
    """
    x = _float32_volume(x)
    grads = []
    for axis in range(3):
        order = [0, 0, 0]
        order[axis] = 1
        grads.append(
            ndimage.gaussian_filter(
                x, sigma=sigma, order=order, truncate=truncate, mode=mode, output=np.float32
            )
        )
    weights = np.ones(box)
    tensor = []
    for i, j in ((0, 0), (1, 1), (2, 2), (0, 1), (0, 2), (1, 2)):
        t = np.multiply(grads[i], grads[j])
        for axis in range(3):
            ndimage.correlate1d(t, weights, axis=axis, mode=mode, output=t)
        tensor.append(t)
    return tuple(tensor)


def _cross(u, w):
    """Component-wise cross product ``u x w`` of two 3-vectors of arrays."""
    return (u[1] * w[2] - u[2] * w[1], u[2] * w[0] - u[0] * w[2], u[0] * w[1] - u[1] * w[0])


def sym3_dominant_eigenpair(a00, a11, a22, a01, a02, a12):
    """Largest eigenvalue and an eigenvector of symmetric 3x3 matrices, element-wise.

    ``A = [[a00, a01, a02], [a01, a11, a12], [a02, a12, a22]]`` given as six
    arrays of one shape (float32 or float64; computed in that precision).
    Returns ``(lam, v0, v1, v2)``: ``lam`` the largest eigenvalue and ``v`` an
    eigenvector for it, not normalised, of norm O(1) after scaling.

    Method (closed form, trigonometric/Cardano):

    1. ``q = tr(A) / 3``; ``B = (A - q I) / s`` with ``s = max |(A - q I)_ij|``
       (a per-matrix scale keeping the squares below float32 overflow and above
       underflow);
    2. ``p = sqrt(tr(B^2) / 6)``, ``r = det(B) / (2 p^3)`` clipped to [-1, 1],
       ``beta = 2 p cos(acos(r) / 3)`` is the largest eigenvalue of ``B``, and
       ``lam = q + s beta``;
    3. the rows of ``M = B - beta I`` span the plane orthogonal to the
       eigenvector, so ``v`` is the cross product of two rows; of the three
       row pairs the one with the largest cross-product norm is the most
       stable.

    Degenerate cases: an isotropic matrix (``A = q I``, including 0) has no
    preferred direction and returns ``v = (0, 0, 1)``; so does a matrix whose
    three cross products vanish exactly.  When the largest eigenvalue is
    double (to rounding) the vector returned lies in its eigenplane, where any
    vector is an eigenvector.
    """
    dtype = np.result_type(a00, a11, a22, a01, a02, a12, np.float32)
    a00, a11, a22, a01, a02, a12 = (np.asarray(a, dtype=dtype) for a in (a00, a11, a22, a01, a02, a12))
    q = (a00 + a11 + a22) / dtype.type(3)
    b00 = a00 - q
    b11 = a11 - q
    b22 = a22 - q
    s = np.abs(b00)
    for b in (b11, b22, a01, a02, a12):
        np.maximum(s, np.abs(b), out=s)
    isotropic = s == 0
    s[isotropic] = 1
    inv_s = dtype.type(1) / s
    b00 *= inv_s
    b11 *= inv_s
    b22 *= inv_s
    b01 = a01 * inv_s
    b02 = a02 * inv_s
    b12 = a12 * inv_s
    del inv_s

    # largest eigenvalue of B: max entry of B is 1, so p >= 1/sqrt(6) unless isotropic
    p = b00 * b00 + b11 * b11 + b22 * b22 + dtype.type(2) * (b01 * b01 + b02 * b02 + b12 * b12)
    p /= dtype.type(6)
    np.sqrt(p, out=p)
    p[isotropic] = 1  # B = 0 there: avoid 0 / 0 below
    det = b00 * (b11 * b22 - b12 * b12) - b01 * (b01 * b22 - b12 * b02) + b02 * (b01 * b12 - b11 * b02)
    r = det / (dtype.type(2) * p * p * p)
    del det
    np.clip(r, -1, 1, out=r)
    beta = np.arccos(r)
    del r
    beta /= dtype.type(3)
    np.cos(beta, out=beta)
    beta *= dtype.type(2) * p
    del p
    beta[isotropic] = 0
    lam = q + s * beta
    del q, s

    # M = B - beta I, eigenvector = most stable cross product of two rows
    b00 -= beta
    b11 -= beta
    b22 -= beta
    del beta
    rows = ((b00, b01, b02), (b01, b11, b12), (b02, b12, b22))
    v0, v1, v2 = _cross(rows[0], rows[1])
    best = v0 * v0 + v1 * v1 + v2 * v2
    for i, j in ((0, 2), (1, 2)):
        w0, w1, w2 = _cross(rows[i], rows[j])
        norm = w0 * w0 + w1 * w1 + w2 * w2
        better = norm > best
        np.copyto(v0, w0, where=better)
        np.copyto(v1, w1, where=better)
        np.copyto(v2, w2, where=better)
        np.copyto(best, norm, where=better)
        del w0, w1, w2, norm, better
    del rows, b00, b11, b22, b01, b02, b12
    undefined = isotropic | (best == 0)
    v0[undefined] = 0
    v1[undefined] = 0
    v2[undefined] = 1
    return lam, v0, v1, v2


def dip_degrees(v0: np.ndarray, v1: np.ndarray, v2: np.ndarray) -> np.ndarray:
    """Angle in degrees, in [0, 90], between the line of ``v`` and the samples (vertical) axis.

    ``atan2(sqrt(v0^2 + v1^2), |v2|)``: sign-free and accurate near 0 and 90.
    """
    horizontal = np.hypot(v0, v1)
    return np.degrees(np.arctan2(horizontal, np.abs(v2)))


@register
class GradientStructureTensorDip(Operator):
    """Dip from the 3D gradient structure tensor, in degrees in [0, 90].

    ``T = B_3 * (g g^T)`` with ``g`` the Gaussian-derivative gradient
    (``sigma = 1``, radius ``r = int(truncate * sigma + 0.5) = 4``) and
    ``B_3`` a 3x3x3 box.  The dip is the angle between the eigenvector of the
    largest eigenvalue of ``T`` (the dominant gradient direction, the normal
    of the local reflector) and the samples axis, in index space: 0 for flat
    reflectors, 90 for vertical ones.  Isotropic tensors (e.g. a constant
    volume) give 0.  ``halo = r + box // 2 = 5`` on every axis: the gradient
    reaches ``r`` samples and the box one more.
    """

    name = "gst3d"
    sigma: ClassVar[float] = 1.0
    truncate: ClassVar[float] = 4.0
    box: ClassVar[int] = 3
    mode: ClassVar[str] = "reflect"
    description = (
        "Dip (degrees, 0-90) of the dominant eigenvector of the 3x3x3-box-smoothed gradient structure "
        "tensor (Gaussian-derivative gradient, sigma=1) from the samples axis"
    )
    halo: ClassVar[Shape] = (gaussian_radius(sigma, truncate) + box // 2,) * 3
    whole_axes: ClassVar[tuple[int, ...]] = ()
    axis_classes: ClassVar[Shape] = (0, 0, 0)  # measured: tests/test_operators.py

    def run(self, block: np.ndarray) -> np.ndarray:
        tensor = structure_tensor(
            block, sigma=self.sigma, truncate=self.truncate, box=self.box, mode=self.mode
        )
        _, v0, v1, v2 = sym3_dominant_eigenpair(*tensor)
        del tensor
        return dip_degrees(v0, v1, v2).astype(np.float32, copy=False)
