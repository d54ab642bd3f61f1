"""The import graph: no cycle (function-level imports included), imports point down the wings
(``scripts/import_cycles.py``, run as CI would), and the light paths stay light; the size rules
(``scripts/code_size.py``): what breaks one is named in ``docs/architecture.md``."""

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_no_import_cycle_and_every_import_points_down_the_wings():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "import_cycles.py"), str(ROOT)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no cycle" in out.stdout


def test_the_check_finds_a_cycle_and_an_import_up_the_wings(tmp_path):
    for package, files in {
        "operators": {"__init__.py": "", "a.py": "def f():\n    from operators import b\n",
                      "b.py": "import importlib\nimportlib.import_module('operators.a')\n"},
        "explorer": {"__init__.py": "", "core/__init__.py": "", "core/units.py": "import explorer.runner.daskrun\n",
                     "runner/__init__.py": "", "runner/daskrun.py": "from explorer.core import units\n"},
        "tests": {"test_old.py": "from explorer import chunking\nimport explorer.runner.gone\n"},
    }.items():
        for name, text in files.items():
            path = tmp_path / package / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "import_cycles.py"), str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "cycle among operators.a, operators.b" in out.stdout
    assert "cycle among explorer.core.units, explorer.runner.daskrun" in out.stdout
    assert "up the wings: explorer.core.units:1 imports explorer.runner.daskrun" in out.stdout
    assert "unresolved: tests.test_old:1 imports explorer.chunking" in out.stdout
    assert "unresolved: tests.test_old:2 imports explorer.runner.gone" in out.stdout


def test_the_profiling_child_and_recommend_chunks_never_import_torch(tmp_path):
    """The fork server's module and a profile, then a plan from the golden fixture (a given
    baseline: no cluster), in a fresh interpreter: neither torch nor its GP stack."""
    code = textwrap.dedent(f"""
        import json, shutil, sys
        import explorer.measure.forkserver  # what the profiling child imports
        from explorer import profile, recommend_chunks
        m = profile("envelope", (16, 16, 16))
        assert m.status == "ok", m.error
        shutil.copytree({str(ROOT / "tests" / "data" / "golden")!r}, {str(tmp_path / "runs")!r})
        plan = recommend_chunks("envelope", (200, 100, 300), "1GiB", runs_dir={str(tmp_path / "runs")!r},
                                baseline_bytes=300 * 2**20)
        print(json.dumps(sorted(m for m in ("torch", "gpytorch", "botorch") if m in sys.modules)))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "[]"


def test_every_module_and_function_over_the_size_rules_is_named_with_its_reason():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "code_size.py")], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def _size_check(root, files: dict[str, str], architecture: str):
    """``code_size.py`` run on a tree of ``files`` (relative path: text) and that architecture.md."""
    for package in ("explorer", "operators", "docs"):
        (root / package).mkdir(exist_ok=True)
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "docs" / "architecture.md").write_text(architecture)
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "code_size.py"), str(root)],
                          capture_output=True, text=True)


def test_the_size_check_finds_a_long_function_an_unnamed_one_and_a_stale_row(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(90))
    out = _size_check(
        tmp_path, {"explorer/big.py": f"def long():\n{body}\n\n\ndef wide(a, b, c, d, e, f, g, h, i):\n    pass\n"},
        "## Known exceptions\n\n| where | size | why |\n|---|---|---|\n"
        "| `explorer/big.py` `long` | 91 lines | a reason |\n| `explorer/gone.py` `old` | 99 lines | gone |\n"
        "| `explorer/big.py` `wide` | 8 parameters | said wrong |\n")
    assert out.returncode == 1
    assert "stale size: explorer/big.py wide: the row says '8 parameters', it is '9 parameters'" in out.stdout
    assert "stale row: explorer/gone.py old" in out.stdout
    assert "big.py long" not in out.stdout  # named, with its size and reason


def test_the_size_check_finds_a_module_row_missing_or_stating_other_lines(tmp_path):
    out = _size_check(
        tmp_path, {"explorer/wing/__init__.py": "", "explorer/wing/told.py": "a = 1\nb = 2\n",
                   "explorer/wing/said.py": "a = 1\n", "explorer/wing/new.py": "a = 1\n"},
        "| module | lines | concept |\n|---|---:|---|\n| `explorer/wing/told.py` | 2 | right |\n"
        "| `explorer/wing/said.py` | 5 | stale |\n| `explorer/wing/gone.py` | 3 | removed |\n")
    assert out.returncode == 1
    assert "stale module row: explorer/wing/said.py: the table says 5 lines, it is 1" in out.stdout
    assert "no module row: explorer/wing/new.py (1 lines)" in out.stdout
    assert "module row names no module: explorer/wing/gone.py" in out.stdout
    assert "told.py" not in out.stdout and "__init__" not in out.stdout
