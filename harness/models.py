"""A surrogate fitted from real isolated profiles: the tests' shared model, and the one
``scripts/bad_inputs.py`` puts beside a garbage calibration."""

from __future__ import annotations

import functools

import numpy as np

import operators

OPERATOR = "gst3d"


#: Six shapes up to 100^3: enough for a surrogate, and in-worker probes reach the tests' blocks.
FIT_SHAPES = ((24, 24, 24), (40, 30, 50), (60, 60, 40), (30, 70, 60), (74, 58, 50), (100, 100, 100))


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
    return fit.fit(name, list(shapes), peaks, noise, np.zeros(len(shapes), bool),
                   halo=operators.get(name).halo, n_repeats=[2] * len(shapes))


@functools.lru_cache(maxsize=None)
def fitted_gst3d_model():
    """gst3d's surrogate from :data:`FIT_SHAPES`, once per process."""
    return fitted_model(OPERATOR)
