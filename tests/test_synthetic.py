"""The synthetic volume looks like seismic: dipping layers, a fault, a 25 Hz wavelet."""

import numpy as np
import pytest

from operators.synthetic import (
    RICKER_HZ,
    SAMPLE_INTERVAL_S,
    ricker,
    synthetic_model,
    synthetic_volume,
)

SHAPE = (64, 64, 128)


@pytest.fixture(scope="module")
def volume():
    return synthetic_volume(SHAPE, seed=0)


def best_lag(a, b, max_lag):
    """The shift (samples) of ``b`` against ``a`` that maximises their cross-correlation."""
    a, b = a - a.mean(), b - b.mean()
    corr = np.correlate(b, a, "full")
    lags = np.arange(-len(a) + 1, len(b))
    keep = np.abs(lags) <= max_lag
    return int(lags[keep][np.argmax(corr[keep])])


def test_shape_dtype_and_scale(volume):
    assert volume.shape == SHAPE
    assert volume.dtype == np.float32
    assert np.isfinite(volume).all()
    assert np.abs(volume).max() == pytest.approx(1.0)
    assert synthetic_volume((3, 4, 5), dtype=np.float64).dtype == np.float64


def test_deterministic_per_seed_and_seeds_differ(volume):
    assert np.array_equal(synthetic_volume(SHAPE, seed=0), volume)
    assert not np.allclose(synthetic_volume(SHAPE, seed=1), volume)


def test_int16_uses_the_range_and_matches_float():
    small = (16, 12, 64)
    ints = synthetic_volume(small, seed=3, dtype=np.int16)
    floats = synthetic_volume(small, seed=3)
    assert ints.dtype == np.int16
    assert np.abs(ints.astype(np.int32)).max() == 32767
    assert np.abs(ints / 32767.0 - floats).max() < 1e-4


@pytest.mark.parametrize("shape", [(0, 4, 4), (4, 4), (4, 4, 4, 4), (4, 4.5, 4), (4, -1, 4), "abc", None])
def test_bad_shape_is_a_one_line_value_error(shape):
    with pytest.raises(ValueError, match="shape must be 3 positive integers") as info:
        synthetic_volume(shape)
    assert "\n" not in str(info.value)


def test_unsupported_dtype_refused():
    with pytest.raises(ValueError, match="dtype"):
        synthetic_volume((4, 4, 4), dtype=np.uint8)


def test_tiny_shapes_work():
    for shape in [(1, 1, 1), (1, 1, 200), (2, 3, 4)]:
        v = synthetic_volume(shape)
        assert v.shape == shape and np.isfinite(v).all()


@pytest.mark.parametrize("axis", [0, 1])
def test_layers_dip(volume, axis):
    """Traces 20 lines apart are shifted against each other by the model's dip."""
    model = synthetic_model(SHAPE, seed=0)
    dip = (model.dip_inline if axis == 0 else model.dip_crossline).mean()
    d = 20
    lags = []
    for a in range(0, SHAPE[axis] - d, 4):
        for b in range(0, SHAPE[1 - axis], 4):
            first = (a, b) if axis == 0 else (b, a)
            second = (a + d, b) if axis == 0 else (b, a + d)
            lags.append(best_lag(volume[first], volume[second], 30))
    lag = np.median(lags)
    assert lag != 0
    assert np.sign(lag) == np.sign(dip)
    assert abs(lag - dip * d) <= 1.5


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fault_offsets_the_layers(seed):
    """Across the fault plane, layers jump by the throw; on one side of it they do not.

    Along profiles normal to the fault at mid-depth: the lag between traces 8 traces
    either side of the fault, minus the lag between two traces 16 apart on the hanging
    wall (which carries the dip alone), is the throw.
    """
    volume = synthetic_volume(SHAPE, seed=seed)
    model = synthetic_model(SHAPE, seed=seed)
    fi, fj, ft = model.fault_point
    normal = np.array([np.cos(model.fault_strike), np.sin(model.fault_strike)])
    along = np.array([-normal[1], normal[0]])
    window = slice(int(ft) - 40, int(ft) + 41)

    def trace(s, u):
        i, j = np.rint(np.array([fi, fj]) + s * normal + u * along).astype(int)
        inside = 0 <= i < SHAPE[0] and 0 <= j < SHAPE[1]
        return volume[i, j, window] if inside else None

    jumps = []
    for u in range(-12, 13, 4):
        near, far = (8, 24) if trace(24, u) is not None else (-8, -24)
        traces = [trace(-8, u), trace(8, u), trace(near, u), trace(far, u)]
        if any(t is None for t in traces):
            continue
        across = best_lag(traces[0], traces[1], 40)
        beside = best_lag(*traces[2:], 40) * (1 if near > 0 else -1)
        jumps.append(across - beside)
    assert len(jumps) >= 3
    assert model.throw >= 3
    assert abs(np.median(jumps) - model.throw) <= 2.5


def test_band_limited_near_the_ricker_peak(volume):
    """The mean frequency of the amplitude spectrum is the wavelet's; little power outside.

    (The spectrum's argmax is a poor statistic here: a few strong layers colour it.)
    """
    spectrum = np.abs(np.fft.rfft(volume, axis=-1)).mean(axis=(0, 1))
    freqs = np.fft.rfftfreq(SHAPE[2], d=SAMPLE_INTERVAL_S)
    wavelet = np.abs(np.fft.rfft(ricker(), n=SHAPE[2]))
    mean_frequency = (freqs * spectrum).sum() / spectrum.sum()
    wavelet_mean_frequency = (freqs * wavelet).sum() / wavelet.sum()
    assert wavelet_mean_frequency == pytest.approx(2 / np.sqrt(np.pi) * RICKER_HZ, rel=0.02)
    assert mean_frequency == pytest.approx(wavelet_mean_frequency, rel=0.2)
    power = spectrum**2
    assert power[freqs > 2.5 * RICKER_HZ].sum() < 0.02 * power.sum()
    assert power[freqs < 0.2 * RICKER_HZ].sum() < 0.02 * power.sum()
