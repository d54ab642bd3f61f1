"""Synthetic seismic volumes: dipping layers, one fault, a Ricker wavelet, a little noise.

Axes are (inline, crossline, samples), like every volume in this project.  The model is

    trace(i, j, t) = (r_ij * w)(t) + noise

where ``r_ij`` is a sparse reflectivity series: ``K`` interfaces with random reflection
coefficients, each at a depth ``z_k(i, j)`` that varies linearly with inline and crossline
(a per-volume dip plus a small per-interface dip, so layers converge) and smoothly (a
gentle fold).  A steep planar fault

    s(i, j, t) = (i - i_f) cos(strike) + (j - j_f) sin(strike) + tilt * (t - t_f)

splits the volume: interfaces on the hanging wall (``s > 0``) are shifted down by
``throw`` samples.  ``w`` is a zero-phase Ricker wavelet of ``RICKER_HZ`` at
``SAMPLE_INTERVAL_S`` sampling, and the noise is white, uniform, ``NOISE_FRACTION`` of the
signal's peak.

The volume is built one inline at a time (reflectivity by index arithmetic, then a 1D
convolution written straight into the output), so the temporary memory is one inline, not
a second volume.  The research prototype's synthetic data varied along one axis only;
structure-dependent attributes need real structure, hence dips and a fault.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import ndimage

#: Peak frequency of the Ricker wavelet (Hz).
RICKER_HZ = 25.0
#: Sample interval the wavelet is designed for (s); 4 ms, as in most post-stack data.
SAMPLE_INTERVAL_S = 0.004
#: Amplitude of the white noise relative to the noise-free volume's peak amplitude.
NOISE_FRACTION = 0.02


@dataclass(frozen=True)
class SyntheticModel:
    """The random geology of one ``(shape, seed)``: enough to locate dips and the fault.

    Depths and throws are in samples; dips in samples per inline / per crossline; the
    fault's ``tilt`` is in traces per sample (small: the fault is steep).
    """

    shape: tuple[int, int, int]
    depths: np.ndarray  # (K,) interface depth at inline 0, crossline 0
    coefficients: np.ndarray  # (K,) reflection coefficients
    dip_inline: np.ndarray  # (K,) samples per inline
    dip_crossline: np.ndarray  # (K,) samples per crossline
    fold_amplitude: float  # samples
    fold_wavelength: float  # traces, along the inline axis
    fault_point: tuple[float, float, float]  # (inline, crossline, sample) on the plane
    fault_strike: float  # radians; the plane's horizontal normal is (cos, sin)
    fault_tilt: float  # traces per sample
    throw: float  # samples, hanging wall (s > 0) down

    def fault_side(self, i, j, t):
        """Signed distance-like value ``s``: positive on the hanging wall."""
        fi, fj, ft = self.fault_point
        return (
            (np.asarray(i) - fi) * np.cos(self.fault_strike)
            + (np.asarray(j) - fj) * np.sin(self.fault_strike)
            + self.fault_tilt * (np.asarray(t) - ft)
        )

    def interface_depths(self, i, j):
        """Depths (K, *broadcast(i, j)) of every interface at traces ``(i, j)``, fault included."""
        i = np.asarray(i, dtype=np.float64)
        j = np.asarray(j, dtype=np.float64)
        extra = (np.newaxis,) * np.broadcast(i, j).ndim
        fold = self.fold_amplitude * np.sin(2 * np.pi * i / self.fold_wavelength)
        z = (
            self.depths[(...,) + extra]
            + self.dip_inline[(...,) + extra] * i
            + self.dip_crossline[(...,) + extra] * j
            + fold
        )
        return np.where(self.fault_side(i, j, z) > 0, z + self.throw, z)


def _check_shape(shape) -> tuple[int, int, int]:
    try:
        ok = len(shape) == 3 and all(int(n) == n and int(n) > 0 for n in shape)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"shape must be 3 positive integers (inline, crossline, samples), got {shape!r}")
    return tuple(int(n) for n in shape)


def synthetic_model(shape, seed: int = 0) -> SyntheticModel:
    """Draw the geology of a synthetic volume of ``shape`` from ``default_rng(seed)``."""
    ni, nx, ns = _check_shape(shape)
    rng = np.random.default_rng(seed)
    # Dips: a regional dip of 0.08-0.2 samples per trace on each axis, random sign,
    # plus +-0.03 per interface.  Interfaces start above and below the window so that
    # dipping layers still fill it; about one interface per 8 samples of window.
    regional = rng.uniform(0.08, 0.2, size=2) * rng.choice([-1.0, 1.0], size=2)
    span = abs(regional[0]) * ni + abs(regional[1]) * nx
    top, bottom = -span - 0.1 * ns, 1.1 * ns + span
    count = max(3, int(round((bottom - top) / 8)))
    depths = np.sort(rng.uniform(top, bottom, size=count))
    coefficients = rng.uniform(0.2, 1.0, size=count) * rng.choice([-1.0, 1.0], size=count)
    dip_inline = regional[0] + rng.uniform(-0.03, 0.03, size=count)
    dip_crossline = regional[1] + rng.uniform(-0.03, 0.03, size=count)
    return SyntheticModel(
        shape=(ni, nx, ns),
        depths=depths,
        coefficients=coefficients,
        dip_inline=dip_inline,
        dip_crossline=dip_crossline,
        fold_amplitude=float(rng.uniform(0.0, 0.01) * ns),
        fold_wavelength=float(rng.uniform(1.5, 3.0) * max(ni, 8)),
        fault_point=(
            float(rng.uniform(0.35, 0.65) * (ni - 1)),
            float(rng.uniform(0.35, 0.65) * (nx - 1)),
            float(0.5 * (ns - 1)),
        ),
        fault_strike=float(rng.uniform(0, 2 * np.pi)),
        fault_tilt=float(rng.uniform(0.02, 0.1) * rng.choice([-1.0, 1.0])),
        throw=float(max(3.0, rng.uniform(0.06, 0.12) * ns)),
    )


def ricker(frequency: float = RICKER_HZ, dt: float = SAMPLE_INTERVAL_S) -> np.ndarray:
    """Zero-phase Ricker wavelet, truncated at +-1.5 / frequency (where it is below 1e-9)."""
    half = int(np.ceil(1.5 / (frequency * dt)))
    a = (np.pi * frequency * dt * np.arange(-half, half + 1)) ** 2
    return (1 - 2 * a) * np.exp(-a)


def synthetic_volume(shape, seed: int = 0, dtype=np.float32) -> np.ndarray:
    """A seismic-like volume of ``shape`` (inline, crossline, samples), deterministic per seed.

    Float dtypes are scaled to a peak amplitude of 1; signed integer dtypes (e.g. int16,
    as in many SEG-Y files) to the type's range, rounded.  Temporary memory is one float32
    volume (only for integer output) plus a few inlines.
    """
    ni, nx, ns = _check_shape(shape)
    dtype = np.dtype(dtype)
    if dtype.kind not in "fi":
        raise ValueError(f"dtype must be a float or signed integer type, got {dtype}")
    model = synthetic_model((ni, nx, ns), seed)
    rng = np.random.default_rng([seed, 1])  # noise stream, independent of the model's draws
    wavelet = ricker()

    out = np.empty((ni, nx, ns), dtype=np.float32)
    j = np.arange(nx)
    trace_offset = j * ns  # flat index of sample 0 of each trace in one inline
    for i in range(ni):
        z = model.interface_depths(i, j)  # (K, nx)
        below = np.floor(z)
        frac = z - below
        below = below.astype(np.int64)
        # Spread each spike linearly over its two neighbouring samples (sub-sample depth).
        index = np.concatenate([below, below + 1]).ravel()
        weight = np.concatenate(
            [model.coefficients[:, None] * (1 - frac), model.coefficients[:, None] * frac]
        ).ravel()
        inside = (index >= 0) & (index < ns)
        flat = (index + np.tile(trace_offset, 2 * len(model.depths)))[inside]
        reflectivity = np.bincount(flat, weight[inside], minlength=nx * ns).reshape(nx, ns)
        ndimage.convolve1d(reflectivity, wavelet, axis=-1, mode="constant", output=out[i])

    peak = max(float(out.max()), -float(out.min())) or 1.0
    noise = 2 * NOISE_FRACTION * peak
    for i in range(ni):
        out[i] += noise * (rng.random((nx, ns), dtype=np.float32) - 0.5)
    peak = max(float(out.max()), -float(out.min())) or 1.0

    if dtype.kind == "f":
        out *= np.float32(1.0 / peak)
        return out if dtype == out.dtype else out.astype(dtype)
    scale = np.float32(np.iinfo(dtype).max / peak)
    result = np.empty((ni, nx, ns), dtype=dtype)
    for i in range(ni):
        np.rint(out[i] * scale, out=out[i])
        result[i] = out[i]
    return result
