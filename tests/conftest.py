"""Fixtures shared by the test modules: a surrogate fitted from real isolated profiles."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import operators

OPERATOR = "gst3d"


#: Six shapes up to 100^3: enough for a surrogate, and in-worker probes reach the tests' blocks.
FIT_SHAPES = [(24, 24, 24), (40, 30, 50), (60, 60, 40), (30, 70, 60), (74, 58, 50), (100, 100, 100)]


def fitted_model(name: str, shapes=FIT_SHAPES):
    """``name``'s surrogate fitted from real isolated profiles of ``shapes`` (two runs each;
    botorch is a dependency: a broken install fails here, it does not skip)."""
    from explorer.model import fit
    from explorer.measure.profiling import profile

    peaks, noise = [], []
    for shape in shapes:
        m = profile(name, shape, repeat=2)
        assert m.status == "ok", m.error
        runs = [r["peak_bytes"] for r in m.repeats]
        peaks.append(np.mean(runs))
        noise.append(np.var(runs, ddof=1) / len(runs))
    return fit.fit(name, shapes, peaks, noise, np.zeros(len(shapes), bool),
                         halo=operators.get(name).halo, n_repeats=[2] * len(shapes))


@functools.lru_cache(maxsize=None)
def fitted_gst3d_model():
    """gst3d's surrogate from :data:`FIT_SHAPES`, once per test session."""
    return fitted_model(OPERATOR)


@pytest.fixture(scope="session")
def gst3d_model():
    return fitted_gst3d_model()


@pytest.fixture(scope="session")
def probed_runs(tmp_path_factory, gst3d_model):
    """A runs directory with gst3d's model and its in-worker calibration from real probes
    (four probes on a real LocalCluster: ``explorer.run.probes``), made once per session.
    Copy it (``shutil.copytree``) before changing anything in it."""
    from explorer.core import paths
    from explorer.run.probes import run_probes

    runs = tmp_path_factory.mktemp("probed") / "runs"
    gst3d_model.save(paths.model_path(OPERATOR, runs))
    result = run_probes(OPERATOR, gst3d_model, n=4, runs_dir=runs)
    assert result.calibration is not None and result.calibration.excess is not None, result.warnings
    return runs
