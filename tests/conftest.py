"""Fixtures shared by the test modules: a surrogate fitted from real isolated profiles."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import operators

OPERATOR = "gst3d"


@functools.lru_cache(maxsize=None)
def fitted_gst3d_model():
    """gst3d's surrogate fitted from six real isolated profiles (two runs each, up to 100^3,
    so that its in-worker probes reach the blocks the tests run), once per test session
    (botorch is a dependency: a broken install fails here, it does not skip)."""
    from explorer import surrogate
    from explorer.profiling import profile

    shapes = [(24, 24, 24), (40, 30, 50), (60, 60, 40), (30, 70, 60), (74, 58, 50), (100, 100, 100)]
    peaks, noise = [], []
    for shape in shapes:
        m = profile(OPERATOR, shape, repeat=2)
        assert m.status == "ok", m.error
        runs = [r["peak_bytes"] for r in m.repeats]
        peaks.append(np.mean(runs))
        noise.append(np.var(runs, ddof=1) / len(runs))
    return surrogate.fit(OPERATOR, shapes, peaks, noise, np.zeros(len(shapes), bool),
                         halo=operators.get(OPERATOR).halo, n_repeats=[2] * len(shapes))


@pytest.fixture(scope="session")
def gst3d_model():
    return fitted_gst3d_model()


@pytest.fixture(scope="session")
def probed_runs(tmp_path_factory, gst3d_model):
    """A runs directory with gst3d's model and its in-worker calibration from real probes
    (four probes on a real LocalCluster: ``explorer.probes``), made once per session.
    Copy it (``shutil.copytree``) before changing anything in it."""
    from explorer import paths
    from explorer.probes import run_probes

    runs = tmp_path_factory.mktemp("probed") / "runs"
    gst3d_model.save(paths.model_path(OPERATOR, runs))
    result = run_probes(OPERATOR, gst3d_model, n=4, runs_dir=runs)
    assert result.calibration is not None and result.calibration.excess is not None, result.warnings
    return runs
