"""Fixtures shared by the test modules (a surrogate fitted from real isolated profiles, its
in-worker calibration from real probes) and the tests' tiers.

Tiers (``pyproject.toml``, ``--strict-markers``): every test is ``unit`` (pure logic in one
process: no subprocess, no Dask, no files) or ``integration`` (real subprocesses, Dask
clusters, SQLite stores, files), exactly one.  A test module's tier is :data:`MODULE_TIERS`'s;
a test of the other tier in it carries its own mark (``@pytest.mark.unit``).  A module
missing here, or a test with both marks, stops the collection.
"""

from __future__ import annotations

import pytest

from harness.models import OPERATOR, fitted_gst3d_model

TIERS = ("unit", "integration")

#: Each test module's tier, for its tests that carry none of their own.
MODULE_TIERS = {
    "test_acquisition": "unit",
    "test_api": "integration",
    "test_calibration": "unit",
    "test_chunking": "unit",
    "test_cli": "integration",
    "test_core_files": "integration",
    "test_coverage_power": "unit",
    "test_harness_plugins": "unit",
    "test_daskrun": "integration",
    "test_cluster_profiling": "integration",
    "test_environment": "unit",
    "test_functional": "integration",
    "test_mdio": "integration",
    "test_explore": "integration",
    "test_golden": "integration",
    "test_inputs": "integration",
    "test_import_graph": "integration",
    "test_live": "integration",
    "test_operators": "unit",
    "test_outputs": "integration",
    "test_pipeline": "unit",
    "test_plan_dict": "integration",
    "test_profiling": "integration",
    "test_recommend": "integration",
    "test_regimes": "unit",
    "test_rounds": "unit",
    "test_segy": "integration",
    "test_shared_store": "integration",
    "test_stats": "unit",
    "test_stopping": "unit",
    "test_store": "integration",
    "test_surrogate": "unit",
    "test_synthetic": "unit",
    "test_tiers": "unit",
    "test_task_bound": "unit",
    "test_unet": "unit",
    "test_workersetup": "integration",
}


#: Modules that take minutes (the loops on known truths), collected before the rest.
LONGEST_FIRST = ("test_stopping",)


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by these marks
def pytest_collection_modifyitems(config, items):
    problems = []
    for item in items:
        own = {m.name for m in item.iter_markers() if m.name in TIERS}
        if len(own) > 1:
            problems.append(f"{item.nodeid}: marked both unit and integration")
        elif not own:
            module = item.module.__name__.rpartition(".")[2]
            if module not in MODULE_TIERS:
                problems.append(f"{item.nodeid}: {module} has no tier in tests/conftest.py MODULE_TIERS")
                continue
            item.add_marker(MODULE_TIERS[module])
    if problems:
        raise pytest.UsageError("tests without exactly one tier:\n" + "\n".join(problems))
    # The longest module first: the suite runs in two processes a module at a time (pyproject's
    # addopts), and started last it would run alone at the end.
    items.sort(key=lambda item: item.module.__name__.rpartition(".")[2] not in LONGEST_FIRST)


@pytest.fixture(scope="session")
def gst3d_model():
    return fitted_gst3d_model()


@pytest.fixture(scope="session")
def probed_runs(tmp_path_factory, gst3d_model):
    """A runs directory with gst3d's model and its in-worker calibration from real probes
    (four probes on a real LocalCluster: ``explorer.runner.probes``), made once per session.
    Copy it (``shutil.copytree``) before changing anything in it."""
    from explorer.core import paths
    from explorer.runner.probes import run_probes

    runs = tmp_path_factory.mktemp("probed") / "runs"
    gst3d_model.save(paths.model_path(OPERATOR, runs))
    result = run_probes(OPERATOR, gst3d_model, n=4, runs_dir=runs)
    assert result.calibration is not None and result.calibration.excess is not None, result.warnings
    return runs
