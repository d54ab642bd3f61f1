"""A store and saved models built before the package was split into wings: they still load,
predict the same bytes and plan the same chunks.

``tests/data/golden/`` holds a runs directory made by the code of commit 2ba159f::

    explore envelope --budget 8 --memory-limit 512MiB --probes 3 --runs-dir RUNS   (model, calibration, store)
    explore gaussian --budget 6 --memory-limit 512MiB --probes 0 --runs-dir RUNS   (model, store)

(reports, locks and the machine's worker baseline left out), and ``expected.json`` what
that code predicted and planned from it (``python tests/test_golden.py`` rewrites it; do
so only on purpose).  Plans are given an explicit worker baseline, so no cluster is
measured, and the first data cache of the machine that wrote ``expected.json``
(:data:`FIXTURE_CACHE`) instead of this one's, which ranks tied plans; so nothing depends on
this machine, and a warning that the files were learnt in another environment is the one
difference allowed.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

GOLDEN = Path(__file__).parent / "data" / "golden"
EXPECTED = GOLDEN / "expected.json"

SHAPES = [(8, 8, 8), (24, 24, 24), (32, 64, 100), (60, 60, 60), (100, 40, 250), (128, 128, 128),
          (200, 150, 90), (256, 64, 300), (300, 300, 300), (512, 512, 400)]
#: (operator, shape, memory limit, extra CLI arguments)
PLANS = [
    ("envelope", "400x300x500", "1GiB", []),
    ("envelope", "800x600x1000", "2GiB", ["--threads", "2", "--workers", "3"]),
    ("envelope", "400x300x500", "600MiB", ["--confidence", "0.95"]),
    ("gaussian", "300x300x300", "1GiB", []),
    ("gaussian", "500x400x600", "3GiB", ["--threads", "2", "--workers", "2"]),
    ("gaussian,envelope", "400x300x500", "1GiB", []),
    ("gaussian,envelope", "400x300x500", "1GiB", ["--strategy", "staged"]),
]
BASELINE = "300MiB"
STALE = "another environment"
#: The level-1 data cache of the machine that wrote ``expected.json`` (64-byte lines, 64 sets, 12 ways).
FIXTURE_CACHE = (64, 64, 12)


def _runs(tmp: Path) -> Path:
    runs = tmp / "runs"
    shutil.copytree(GOLDEN, runs, ignore=shutil.ignore_patterns("expected.json"))
    return runs


def predictions(runs: Path) -> dict:
    from explorer import load_model

    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for operator in ("envelope", "gaussian", "gaussian,envelope"):
            model = load_model(operator, runs_dir=runs)
            mean, upper = model.predict_many(np.array(SHAPES), 0.99)
            out[operator] = {"mean": [float(x) for x in mean], "upper99": [float(x) for x in upper]}
    return out


def plans(runs: Path) -> list:
    from unittest import mock

    from explorer.cli import main
    from explorer.core.machine import CacheGeometry
    from explorer.plan import recommend

    out = []
    for operator, shape, limit, extra in PLANS:
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr), \
                mock.patch.object(recommend, "l1_data_cache", lambda: CacheGeometry(*FIXTURE_CACHE)):
            code = main(["chunks", operator, "--shape", shape, "--memory-limit", limit, "--baseline", BASELINE,
                         "--runs-dir", str(runs), "--json", *extra])
        assert code == 0, stderr.getvalue()
        out.append(json.loads(stdout.getvalue()))
    return out


def store_rows(runs: Path) -> dict:
    from explorer.search.store import Store

    store = Store(runs)
    return {operator: sorted([list(r.shape), r.peak_bytes, r.source] for r in store.records(operator))
            for operator in ("envelope", "gaussian")}


def _without_stale(plan: dict) -> dict:
    return {**plan, "warnings": [w for w in plan.get("warnings", []) if STALE not in w]}


def _close(actual, expected, where=""):
    """Equal, floats to 1e-9 relative."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict) and set(actual) == set(expected), where
        for key in expected:
            _close(actual[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), where
        for i, (a, e) in enumerate(zip(actual, expected)):
            _close(a, e, f"{where}[{i}]")
    elif isinstance(expected, float) and not isinstance(actual, bool):
        assert actual == pytest.approx(expected, rel=1e-9, abs=0.0), where
    else:
        assert actual == expected, where


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return _runs(tmp_path_factory.mktemp("golden"))


@pytest.fixture(scope="module")
def expected():
    return json.loads(EXPECTED.read_text())


def test_the_fixture_is_small():
    assert sum(p.stat().st_size for p in GOLDEN.rglob("*") if p.is_file()) < 1 << 20


def test_saved_models_predict_what_they_predicted(runs, expected):
    _close(predictions(runs), expected["predictions"], "predictions")


def test_chunk_plans_are_the_ones_planned(runs, expected):
    """Every key the old code wrote, with its value; keys added since (fields the JSON once
    dropped: ``tests/test_plan_dict.py``; the clock's ``task_bytes_per_voxel``) are not in the
    fixture."""
    for actual, plan in zip(plans(runs), expected["plans"]):
        assert set(plan) <= set(actual), sorted(set(plan) - set(actual))
        actual = {key: actual[key] for key in plan}
        if isinstance(plan.get("task_clock"), dict):
            assert set(plan["task_clock"]) <= set(actual["task_clock"])
            actual["task_clock"] = {key: actual["task_clock"][key] for key in plan["task_clock"]}
        _close(_without_stale(actual), _without_stale(plan), plan["operator"])


def test_the_store_still_loads(runs, expected):
    assert store_rows(runs) == expected["store"]


def test_the_operators_code_is_the_code_the_models_were_learnt_with(runs):
    """Moving explorer's modules must not stale saved models: each operator's code digest (of
    the module that defines it) is the one its saved model carries."""
    from explorer import load_model
    from explorer.core.environment import environment_stamp

    for operator in ("envelope", "gaussian"):
        model = load_model(operator, runs_dir=runs)
        assert model.environment["operator_code"] == environment_stamp(operator)["operator_code"]


if __name__ == "__main__":  # rewrite expected.json from the fixture, with this code
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        runs = _runs(Path(tmp))
        data = {"predictions": predictions(runs), "plans": plans(runs), "store": store_rows(runs)}
    EXPECTED.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {EXPECTED}", file=sys.stderr)
