"""Tests of the seismic operators: registry, Dask == NumPy, and the definitions themselves."""

from __future__ import annotations

import math
import warnings

import dask.array as da
import numpy as np
import pytest
from scipy import ndimage
from scipy.signal import hilbert

import operators
from operators import base
from operators.base import Operator, names, register
from operators.pipeline import get
from operators.seismic import dip_degrees, structure_tensor, sym3_dominant_eigenpair

EXPECTED = {
    "envelope",
    "first_derivative",
    "gaussian",
    "gst3d",
    "instantaneous_frequency",
    "instantaneous_phase",
    "semblance",
}
SHAPE = (40, 36, 64)
CHUNKINGS = {
    "regular": (13, 11, 20),
    "small": (7, 9, 16),  # smaller than 2 * halo for gst3d, smaller than the halo for gaussian
    "uneven": ((10, 5, 25), (20, 16), (30, 34)),
}


@pytest.fixture(scope="module")
def volume() -> np.ndarray:
    return operators.synthetic_volume(SHAPE, seed=3)


def _tolerance(reference: np.ndarray) -> dict:
    return {"rtol": 1e-5, "atol": 1e-6 * max(float(np.abs(reference).max()), 1.0)}


def _grid(shape):
    return np.meshgrid(*(np.arange(n, dtype=np.float64) for n in shape), indexing="ij")


def _traces(signal: np.ndarray, n_inlines: int = 3, n_crosslines: int = 2) -> np.ndarray:
    """A volume whose every trace is ``signal``."""
    return np.broadcast_to(signal, (n_inlines, n_crosslines, signal.size)).astype(np.float32)


# --------------------------------------------------------------------------- registry


def test_registry_lists_the_seismic_operators():
    assert EXPECTED <= set(names())
    assert names() == sorted(names())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_get_returns_an_operator_with_valid_metadata(name):
    op = get(name)
    assert isinstance(op, Operator)
    assert op.name == name
    assert op.description and "\n" not in op.description
    assert len(op.halo) == 3 and all(isinstance(h, int) and h >= 0 for h in op.halo)
    assert set(op.whole_axes) <= {0, 1, 2}
    assert op.output_dtype == np.float32
    assert op.output_shape((5, 6, 7)) == (5, 6, 7)


def test_unknown_name_raises_keyerror_listing_known_operators():
    with pytest.raises(KeyError) as info:
        get("no-such-operator")
    message = str(info.value)
    assert "no-such-operator" in message
    for name in EXPECTED:
        assert name in message


def test_reserving_a_registered_name_raises():
    with pytest.raises(ValueError, match="'envelope' clash with a test's command"):
        base.reserve_names(["envelope", "a-free-name"], "a test's command")
    assert "a-free-name" not in base.RESERVED_NAMES


@pytest.mark.parametrize("reserved", ["a_reserved_name", "another_reserved_name"])
def test_register_rejects_reserved_names(reserved):
    base.reserve_names([reserved], "a test")
    before = names()
    with pytest.raises(ValueError, match="reserved"):

        @register
        class Clash(Operator):
            name = reserved

            def run(self, block):
                return block

    assert names() == before


def test_register_rejects_a_second_operator_of_the_same_name():
    before = names()
    with pytest.raises(ValueError, match="twice"):

        @register
        class Duplicate(Operator):
            name = "gaussian"

            def run(self, block):
                return block

    assert names() == before
    assert type(get("gaussian")).__name__ != "Duplicate"


@pytest.mark.parametrize("bad", ["../escape", "a/b", ".hidden", "", "9lives", "with space", "dash-name"])
def test_register_refuses_a_name_that_is_not_one_safe_directory_name(bad):
    before = names()
    with pytest.raises(ValueError, match="letters, digits and underscores"):

        @register
        class Escape(Operator):
            name = bad

            def run(self, block):
                return block

    assert names() == before


def test_registering_a_class_again_or_its_redefinition_is_not_an_error():
    """A notebook cell or a script run again defines the class anew: same module, same name."""
    def define():
        class Rerun(Operator):
            name = "test_rerun_registration"

            def run(self, block):
                return block
        return Rerun

    first = register(define())
    try:
        assert register(first) is first  # the same class again: a no-op
        second = register(define())  # a redefinition replaces it
        assert second is not first and base.registered("test_rerun_registration") is second
    finally:
        base._REGISTRY.pop("test_rerun_registration", None)


def test_the_halo_bound_is_the_longest_axis_a_volume_may_have():
    from explorer.core.units import MAX_DIM

    assert base.MAX_HALO == MAX_DIM


@pytest.mark.parametrize("spec, fault", [("gaussian(sigma=1e308)", "no usable operator"),
                                         ("gaussian(sigma=1e200)", "halo is beyond")])
def test_a_spec_whose_parameters_overflow_is_one_line_spec_error(spec, fault):
    with pytest.raises(operators.SpecError, match=fault) as raised:
        get(spec)
    assert "\n" not in str(raised.value) and len(str(raised.value)) < 200


# --------------------------------------------------------------------------- Dask == NumPy


@pytest.mark.parametrize("chunking", sorted(CHUNKINGS))
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_dask_form_equals_numpy_form(volume, name, chunking):
    op = get(name)
    reference = op.run(volume)
    lazy = op.dask(da.from_array(volume, chunks=CHUNKINGS[chunking]))
    # the test must exercise seams: several blocks on every axis not kept whole
    for axis in range(3):
        if axis not in op.whole_axes:
            assert lazy.numblocks[axis] > 1
    result = lazy.compute(scheduler="synchronous")
    assert result.dtype == np.float32 and result.shape == volume.shape
    np.testing.assert_allclose(result, reference, **_tolerance(reference))


@pytest.mark.parametrize("chunks", [(13, 4, 20), (13, 2, 20), (40, 2, 64)])
def test_an_axis_no_longer_than_the_halo_is_kept_whole(chunks):
    """gst3d (halo 5) on 4 crosslines: Dask's map_overlap alone refuses a depth larger than
    the array; the axis is one block, whole, as every output along it needs all of it."""
    op = get("gst3d")
    x = operators.synthetic_volume((40, 4, 64), seed=3)
    lazy = op.dask(da.from_array(x, chunks=chunks))
    result = lazy.compute(scheduler="synchronous")
    reference = op.run(x)
    np.testing.assert_allclose(result, reference, **_tolerance(reference))


@pytest.mark.parametrize("name", sorted(n for n in EXPECTED if any(get(n).halo)))
def test_a_halo_one_sample_short_breaks_the_seams(volume, name):
    """The Dask comparison above can fail: one sample less of halo on one axis is detected."""
    op = get(name)
    reference = op.run(volume)
    axis = max(range(3), key=lambda a: op.halo[a])
    depth = {a: op.halo[a] for a in range(3)}
    depth[axis] -= 1
    lazy = da.map_overlap(
        op.run, da.from_array(volume, chunks=CHUNKINGS["regular"]), depth=depth,
        boundary="none", dtype=np.float32, trim=True,
    )
    result = lazy.compute(scheduler="synchronous")
    assert not np.allclose(result, reference, **_tolerance(reference))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_int16_and_float64_inputs_are_cast_to_float32(volume, name):
    op = get(name)
    as_int16 = np.round(volume * 1000).astype(np.int16)
    as_float64 = volume.astype(np.float64)
    expected_int = op.run(as_int16.astype(np.float32))
    out_int = op.run(as_int16)
    out_float64 = op.run(as_float64)
    assert out_int.dtype == np.float32 and out_float64.dtype == np.float32
    np.testing.assert_array_equal(out_int, expected_int)
    np.testing.assert_array_equal(out_float64, op.run(volume))
    lazy = op.dask(da.from_array(as_int16, chunks=CHUNKINGS["regular"]))
    np.testing.assert_allclose(lazy.compute(scheduler="synchronous"), expected_int, **_tolerance(expected_int))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_zero_volume_gives_zeros_without_warnings(name):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = get(name).run(np.zeros((12, 11, 20), dtype=np.float32))
    np.testing.assert_array_equal(out, 0)


def test_operators_reject_non_3d_blocks():
    with pytest.raises(ValueError, match="3D"):
        get("envelope").run(np.zeros((4, 16), dtype=np.float32))


# --------------------------------------------------------------------------- Hilbert attributes


def test_envelope_of_a_periodic_cosine_is_its_amplitude_everywhere():
    t = np.arange(64)
    x = _traces(2.5 * np.cos(2 * np.pi * 4 / 64 * t + 0.3))  # four whole cycles: exact analytic signal
    np.testing.assert_allclose(get("envelope").run(x), 2.5, atol=1e-5)


def test_envelope_of_a_cosine_is_one_away_from_the_trace_ends():
    t = np.arange(256)
    x = _traces(np.cos(2 * np.pi * 0.0711 * t + 0.4))  # not a whole number of cycles
    envelope = get("envelope").run(x)
    np.testing.assert_allclose(envelope[..., 64:-64], 1.0, atol=0.02)


def test_envelope_bounds_the_trace_and_phase_reconstructs_it(volume):
    envelope = get("envelope").run(volume)
    phase = get("instantaneous_phase").run(volume)
    assert np.all(envelope >= np.abs(volume) - 1e-5)
    # x = Re(z) = |z| cos(angle z)
    np.testing.assert_allclose(envelope * np.cos(phase), volume, atol=1e-5)


def test_instantaneous_phase_is_the_wrapped_phase_in_radians():
    t = np.arange(64)
    phase0 = 0.7
    x = _traces(np.cos(2 * np.pi * 5 / 64 * t + phase0))
    phase = get("instantaneous_phase").run(x)
    assert phase.min() >= -np.pi - 1e-6 and phase.max() <= np.pi + 1e-6
    expected = 2 * np.pi * 5 / 64 * t + phase0
    wrapped_difference = np.angle(np.exp(1j * (phase - expected)))
    np.testing.assert_allclose(wrapped_difference, 0, atol=1e-4)


def test_instantaneous_frequency_of_a_periodic_cosine_is_its_frequency_in_cycles_per_sample():
    t = np.arange(64)
    x = _traces(np.cos(2 * np.pi * 6 / 64 * t - 1.1))
    np.testing.assert_allclose(get("instantaneous_frequency").run(x), 6 / 64, atol=1e-5)


@pytest.mark.parametrize("frequency", [0.0711, 0.13, 0.31])
def test_instantaneous_frequency_of_a_cosine_away_from_the_ends(frequency):
    t = np.arange(256)
    x = _traces(np.cos(2 * np.pi * frequency * t + 0.4))
    f = get("instantaneous_frequency").run(x)
    np.testing.assert_allclose(f[..., 64:-64], frequency, atol=2e-3)


def test_instantaneous_frequency_is_the_gradient_of_the_unwrapped_phase(volume):
    z = hilbert(volume, axis=-1)
    expected = np.gradient(np.unwrap(np.angle(z).astype(np.float64), axis=-1), axis=-1) / (2 * np.pi)
    np.testing.assert_allclose(get("instantaneous_frequency").run(volume), expected, atol=1e-5)


# --------------------------------------------------------------------------- filters


def test_gaussian_equals_scipy_on_the_whole_volume(volume):
    op = get("gaussian")
    expected = ndimage.gaussian_filter(volume, sigma=op.sigma, truncate=op.truncate)
    np.testing.assert_allclose(op.run(volume), expected, rtol=1e-6, atol=1e-7)
    assert op.sigma == (2.0, 2.0, 2.0) and op.truncate == 4.0


def test_gaussian_preserves_a_constant():
    np.testing.assert_allclose(get("gaussian").run(np.full((20, 18, 30), 3.5)), 3.5, rtol=1e-6)


def _support_radius(response: np.ndarray, centre: int) -> tuple[int, ...]:
    nonzero = np.nonzero(response)
    return tuple(int(np.abs(idx - centre).max()) for idx in nonzero)


def test_gaussian_halo_is_the_kernel_radius_scipy_uses():
    op = get("gaussian")
    assert op.halo == tuple(int(op.truncate * s + 0.5) for s in op.sigma) == (8, 8, 8)
    impulse = np.zeros((31, 31, 31), dtype=np.float32)
    impulse[15, 15, 15] = 1
    assert _support_radius(op.run(impulse), 15) == op.halo


def test_first_derivative_of_a_ramp_is_its_slope():
    _, _, t = _grid((4, 5, 30))
    ramp = (0.75 * t - 2.0).astype(np.float32)
    np.testing.assert_allclose(get("first_derivative").run(ramp), 0.75, rtol=1e-6)


def test_first_derivative_is_numpy_gradient_along_samples(volume):
    expected = np.gradient(volume, axis=2)
    np.testing.assert_allclose(get("first_derivative").run(volume), expected, rtol=1e-6, atol=1e-7)
    two = np.array([1.0, 4.0], dtype=np.float32).reshape(1, 1, 2)
    np.testing.assert_array_equal(get("first_derivative").run(two), [[[3.0, 3.0]]])


def test_semblance_of_identical_traces_is_one(volume):
    x = _traces(volume[5, 5], n_inlines=9, n_crosslines=8)
    np.testing.assert_allclose(get("semblance").run(x), 1.0, atol=1e-5)


def test_semblance_of_white_noise_is_about_one_over_the_trace_count():
    noise = np.random.default_rng(1).standard_normal((30, 30, 60)).astype(np.float32)
    s = get("semblance").run(noise)
    assert 0.0 <= s.min() and s.max() <= 1.0
    assert 0.08 < s[1:-1, 1:-1, 4:-4].mean() < 0.16  # E ~ 1/9 for 9 independent traces
    assert np.percentile(s, 99) < 0.5


def test_semblance_matches_the_window_formula(volume):
    s = get("semblance").run(volume)
    rng = np.random.default_rng(7)
    for _ in range(25):
        i, j, t = (int(rng.integers(h, n - h)) for h, n in zip((1, 1, 4), volume.shape))
        window = volume[i - 1 : i + 2, j - 1 : j + 2, t - 4 : t + 5].astype(np.float64)
        stack = window.sum(axis=(0, 1))
        expected = (stack**2).sum() / (9 * (window**2).sum())
        np.testing.assert_allclose(s[i, j, t], expected, rtol=1e-5)


# --------------------------------------------------------------------------- gst3d


def _plane_wave(shape, dip, azimuth, wavelength):
    """Planar layers whose normal is ``dip`` degrees from the samples axis."""
    i, j, t = _grid(shape)
    d, a = np.radians(dip), np.radians(azimuth)
    normal = (np.sin(d) * np.cos(a), np.sin(d) * np.sin(a), np.cos(d))
    return normal, normal[0] * i + normal[1] * j + normal[2] * t


@pytest.mark.parametrize("dip,azimuth", [(0, 0), (12, 90), (30, 0), (45, 35), (70, 200), (85, 10)])
def test_gst3d_gives_the_dip_of_planar_cosine_layers(dip, azimuth):
    _, s = _plane_wave((28, 28, 32), dip, azimuth, 12)
    x = np.cos(2 * np.pi * s / 12).astype(np.float32)
    h = get("gst3d").halo[0]
    interior = get("gst3d").run(x)[h:-h, h:-h, h:-h]
    np.testing.assert_allclose(interior, dip, atol=0.05)


@pytest.mark.parametrize("dip,azimuth", [(20, 0), (35, 50), (60, 120)])
def test_gst3d_gives_the_dip_of_ricker_layers_with_noise(dip, azimuth):
    rng = np.random.default_rng(dip)
    _, s = _plane_wave((30, 30, 40), dip, azimuth, None)
    depths = rng.uniform(s.min() - 10, s.max() + 10, 40)
    x = np.zeros_like(s)
    for depth in depths:
        a = (np.pi * 0.08 * (s - depth)) ** 2  # Ricker, 0.08 cycles/sample
        x += rng.choice([-1, 1]) * rng.uniform(0.3, 1) * (1 - 2 * a) * np.exp(-a)
    x += 0.02 * np.abs(x).max() * rng.standard_normal(x.shape)
    interior = get("gst3d").run(x.astype(np.float32))[6:-6, 6:-6, 6:-6]
    error = np.abs(interior - dip)
    assert np.median(error) < 0.5
    assert np.percentile(error, 90) < 2.0


def test_gst3d_of_a_constant_volume_is_flat():
    np.testing.assert_array_equal(get("gst3d").run(np.full((14, 14, 14), 7.0)), 0)


def test_gst3d_halo_is_the_structure_tensor_support():
    op = get("gst3d")
    assert op.halo == (5, 5, 5)  # Gaussian derivative radius int(4 * 1 + 0.5) = 4, plus 1 for the 3-box
    impulse = np.zeros((25, 25, 25), dtype=np.float32)
    impulse[12, 12, 12] = 1
    tensor = structure_tensor(impulse, sigma=op.sigma, truncate=op.truncate, box=op.box)
    support = sum(np.abs(t) for t in tensor)
    assert _support_radius(support, 12) == op.halo


# --------------------------------------------------------------------------- closed-form eigen-solver


def _random_symmetric(n, seed, dtype):
    a = np.random.default_rng(seed).standard_normal((n, 3, 3))
    return ((a + a.transpose(0, 2, 1)) / 2).astype(dtype)


def _solve(a):
    return sym3_dominant_eigenpair(a[:, 0, 0], a[:, 1, 1], a[:, 2, 2], a[:, 0, 1], a[:, 0, 2], a[:, 1, 2])


def test_eigen_solver_matches_eigh_in_float64():
    a = _random_symmetric(5000, 0, np.float64)
    w, v = np.linalg.eigh(a)
    lam, v0, v1, v2 = _solve(a)
    np.testing.assert_allclose(lam, w[:, 2], rtol=1e-10, atol=1e-12)
    vec = np.stack([v0, v1, v2], axis=1)
    vec /= np.linalg.norm(vec, axis=1, keepdims=True)
    # A v = lambda v, for every matrix
    residual = np.einsum("nij,nj->ni", a, vec) - lam[:, None] * vec
    assert np.abs(residual).max() < 1e-9
    gap = (w[:, 2] - w[:, 1]) / np.abs(w).max(axis=1)
    ok = gap > 1e-3
    assert ok.mean() > 0.99
    np.testing.assert_allclose(
        dip_degrees(v0, v1, v2)[ok], dip_degrees(v[:, 0, 2], v[:, 1, 2], v[:, 2, 2])[ok], atol=1e-6
    )


def test_eigen_solver_matches_eigh_in_float32():
    a = _random_symmetric(20000, 1, np.float32)
    w, v = np.linalg.eigh(a.astype(np.float64))
    lam, v0, v1, v2 = _solve(a)
    assert lam.dtype == np.float32 and v0.dtype == np.float32
    scale = np.abs(w).max(axis=1)
    assert np.abs(lam - w[:, 2]).max() < 1e-4 * scale.max()
    ok = (w[:, 2] - w[:, 1]) / scale > 0.1  # well conditioned
    assert ok.mean() > 0.95
    error = np.abs(dip_degrees(v0, v1, v2) - dip_degrees(v[:, 0, 2], v[:, 1, 2], v[:, 2, 2]))[ok]
    assert error.max() < 1e-3


def test_eigen_solver_recovers_the_direction_of_a_rank_one_tensor():
    g = np.random.default_rng(2).standard_normal((1000, 3))
    a = np.einsum("ni,nj->nij", g, g)
    lam, v0, v1, v2 = _solve(a)
    np.testing.assert_allclose(lam, (g**2).sum(axis=1), rtol=1e-10)
    np.testing.assert_allclose(dip_degrees(v0, v1, v2), dip_degrees(g[:, 0], g[:, 1], g[:, 2]), atol=1e-6)


@pytest.mark.parametrize("scale", [1e30, 1e-30])
def test_eigen_solver_is_scale_free_in_float32(scale):
    a = _random_symmetric(2000, 3, np.float32)
    _, u0, u1, u2 = _solve(a)
    lam, v0, v1, v2 = _solve((a.astype(np.float64) * scale).astype(np.float32))
    assert np.all(np.isfinite(lam)) and np.all(np.isfinite(v0 + v1 + v2))
    w = np.linalg.eigh(a.astype(np.float64))[0]
    ok = (w[:, 2] - w[:, 1]) / np.abs(w).max(axis=1) > 0.1
    np.testing.assert_allclose(dip_degrees(v0, v1, v2)[ok], dip_degrees(u0, u1, u2)[ok], atol=1e-3)


def test_eigen_solver_degenerate_cases():
    # isotropic (including zero): no preferred direction, flat by convention
    iso = np.stack([np.eye(3) * 2.0, np.zeros((3, 3))])
    lam, v0, v1, v2 = _solve(iso)
    np.testing.assert_array_equal(lam, [2.0, 0.0])
    np.testing.assert_array_equal(np.stack([v0, v1, v2], axis=1), [[0, 0, 1], [0, 0, 1]])
    # double largest eigenvalue: the vector lies in its eigenplane
    rotation = np.linalg.qr(np.random.default_rng(4).standard_normal((3, 3)))[0]
    a = (rotation @ np.diag([2.0, 2.0, 1.0]) @ rotation.T)[None]
    lam, v0, v1, v2 = _solve(a)
    vec = np.array([v0[0], v1[0], v2[0]])
    vec /= np.linalg.norm(vec)
    np.testing.assert_allclose(lam, 2.0, rtol=1e-7)
    np.testing.assert_allclose(a[0] @ vec, 2.0 * vec, atol=1e-6)


def test_gaussian_torch_form_equals_the_numpy_form_on_the_cpu():
    """The torch form that GPU profiling runs, checked where it can be: on the CPU."""
    import torch  # a declared dependency: missing is a failure, not a skip
    op = operators.get("gaussian")
    x = np.random.default_rng(5).standard_normal((21, 18, 40)).astype(np.float32)
    y = op.run_torch(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(y, op.run(x), rtol=1e-5, atol=2e-6)


def _alike_swaps(classes):
    """The transpositions of alike axes that generate every permutation the classes allow."""
    return [(a, b) for a in range(3) for b in range(a + 1, 3)
            if classes[a] == classes[b] and all(classes[c] != classes[a] for c in range(a + 1, b))]


#: Bytes by which one profile of a block may exceed another of the same peak (the allocator's
#: extra quantum, measured at 316 KiB: :func:`test_declared_alike_axes_are_measured_alike`).
ALLOCATOR_QUANTUM_BYTES = 512 * 1024


@pytest.mark.integration
@pytest.mark.parametrize("name", [n for n in names() if get(n).axis_classes != (0, 1, 2)])
def test_declared_alike_axes_are_measured_alike(name):
    """``axis_classes`` is a claim the surrogate builds on (tied mean terms, a kernel on sorted
    dims): swapping two alike axes of a block must leave its isolated peak unchanged (within
    the allocator's granularity), measured by profiling both blocks for real.  Each block's peak
    is the least of three runs, and the two may differ by 1% or by one allocator quantum,
    whichever is more: on 48x64x88 blocks (peaks of about 4 MiB) all three runs of one order
    carried an extra 316 KiB (323,584 bytes) in two fresh-clone runs of the suite
    (instantaneous_phase: 4.19 and 4.52 MiB for the two orders; envelope: 4,198,400 and
    4,521,984 bytes), so the quantum is taken as 512 KiB, and the block is large enough (tens of
    MiB for most operators) that 1% of its peak is the larger term."""
    from explorer.measure.profiling import Profiler

    def least_peak(p, shape):
        return min(run["peak_bytes"] for run in p.profile(name, shape, repeat=3).repeats)

    op = get(name)
    shape = (96, 128, 176)
    with Profiler() as p:
        base_peak = least_peak(p, shape)
        for a, b in _alike_swaps(op.axis_classes):
            swapped = list(shape)
            swapped[a], swapped[b] = shape[b], shape[a]
            peak = least_peak(p, tuple(swapped))
            assert abs(peak - base_peak) <= max(0.01 * base_peak, ALLOCATOR_QUANTUM_BYTES), \
                (name, shape, swapped, base_peak, peak)


def test_a_pipeline_keeps_axes_alike_only_where_every_member_and_halo_does():
    assert get("gaussian,gst3d").axis_classes == (0, 0, 0)
    assert get("gaussian,envelope").axis_classes == (0, 0, 1)  # envelope: traces alike, samples apart
    # first_derivative's peak is alike on all axes, but its halo is on samples only: the next
    # stage runs on a block two samples shorter, so samples are apart for the pipeline
    assert get("first_derivative").axis_classes == (0, 0, 0)
    assert get("first_derivative,gst3d").axis_classes == (0, 0, 1)
    assert get("gaussian(sigma=1x2x2)").axis_classes == (0, 1, 1)


# --------------------------------------------------------------------------- windowed reads


@pytest.mark.parametrize("chunks", [(13, 11, 20), (4, 30, 64), (33, 30, 29)])
@pytest.mark.parametrize("name", ["gst3d", "gaussian", "envelope", "semblance"])
def test_the_windowed_form_equals_map_overlap_and_the_whole_volume(name, chunks):
    """From a source (here a NumPy array; a run's is the SEG-Y file) each task reads its own
    block, runs and trims it: the same result as map_overlap and as ``run`` on the whole
    volume, bit for bit, also with chunks shorter than the halo (4, and a last chunk of 6 < 7)."""
    op = get(name)
    x = operators.synthetic_volume((40, 36, 64), seed=7)
    windowed = op.dask(x, chunks=chunks)
    overlapped = op.dask(da.from_array(x, chunks=chunks))
    assert windowed.chunks == overlapped.chunks
    got = windowed.compute(scheduler="synchronous")
    np.testing.assert_array_equal(got, overlapped.compute(scheduler="synchronous"))
    np.testing.assert_array_equal(got, op.run(x))


def test_a_windowed_task_depends_on_the_source_alone_and_keeps_nothing_for_a_neighbour():
    """One task per block and the source (a NumPy array, kept once as a key): no piece of one
    chunk goes to another's task, so no chunk stays resident for a neighbour (map_overlap's
    graph has many tasks per block)."""
    op = get("gst3d")
    x = operators.synthetic_volume((40, 36, 64), seed=7)
    windowed = op.dask(x, chunks=(10, 12, 64))
    graph = dict(windowed.__dask_graph__())
    n_blocks = math.prod(windowed.numblocks)
    assert n_blocks == 12 and len(graph) == n_blocks + 1
    overlapped = dict(op.dask(da.from_array(x, chunks=(10, 12, 64))).__dask_graph__())
    assert len(overlapped) > 3 * n_blocks


def test_a_windowed_task_returns_its_chunk_contiguous_and_frees_the_block():
    """The trimmed chunk is a copy: a view would keep the block's whole output alive, and the
    store would copy it again (one block more at the task's peak)."""
    import dask

    op = get("gaussian")  # a halo on every axis: every block is trimmed
    x = operators.synthetic_volume((40, 36, 64), seed=7)
    windowed = op.dask(x, chunks=(20, 18, 32))
    graph = dict(windowed.__dask_graph__())
    interior = dask.get(graph, [(windowed.name, 1, 1, 1)])[0]
    assert interior.shape == (20, 18, 32) and interior.flags.c_contiguous
    assert interior.base is None or interior.base.size == interior.size
    np.testing.assert_array_equal(windowed.compute(scheduler="synchronous"), op.run(x))


def test_a_source_without_chunks_is_refused():
    with pytest.raises(ValueError, match="needs its chunks"):
        get("gaussian").dask(np.zeros((8, 8, 8), np.float32))


@pytest.mark.integration
def test_a_file_source_travels_in_each_task_so_no_task_depends_on_another_key(tmp_path):
    """A SEG-Y reader is pickled into every task: the tasks have no dependencies, so the
    scheduler spreads them over the workers (as a key of its own the reader would live on one
    worker, which Dask favours for every task needing it: 4 tasks on 2 workers ran 3 + 1)."""
    from dask.core import get_dependencies

    x = operators.synthetic_volume((40, 36, 64), seed=7)
    path = tmp_path / "x.sgy"
    operators.write_segy(path, x)
    lazy = get("gst3d").dask(operators.segy_volume(path), chunks=(20, 18, 64))
    graph = dict(lazy.__dask_graph__())
    assert len(graph) == math.prod(lazy.numblocks) == 4
    assert all(not get_dependencies(graph, key) for key in graph)
    np.testing.assert_array_equal(lazy.compute(scheduler="synchronous"), get("gst3d").run(x))
