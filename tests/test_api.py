"""The public surface: four functions, cheap to import, no torch on the hot paths."""

import json
import subprocess
import sys

import pytest


@pytest.mark.unit
def test_public_functions_resolve_to_the_right_objects():
    import explorer
    import explorer.exploration  # a submodule import must not shadow the function

    assert callable(explorer.explore) and explorer.explore.__module__ == "explorer.exploration"
    assert callable(explorer.profile) and callable(explorer.load_model) and callable(explorer.recommend_chunks)
    assert explorer.recommend_chunks.__module__ == "explorer.plan.recommend"
    assert set(explorer.__all__) >= {"explore", "profile", "load_model", "recommend_chunks"}
    import explorer.runner.daskrun  # the run wing's folder is not named run: this must not shadow explorer.run

    assert callable(explorer.run) and explorer.run.__module__ == "explorer.runner.daskrun"
    for name in explorer.__all__:  # every public name resolves, and is what it names
        assert getattr(explorer, name).__name__ == name, name


def test_importing_explorer_and_chunking_never_imports_torch():
    code = ("import sys, json, explorer, explorer.plan.chunk_plan, explorer.model.memory_model, explorer.plan.calibration, "
            "explorer.plan.recommend, explorer.core.environment\n"
            "print(json.dumps(sorted(m for m in ('torch', 'gpytorch', 'botorch', 'distributed', 'optuna')"
            " if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
