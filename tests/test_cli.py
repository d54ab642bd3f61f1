"""The ``explore`` command as users run it: a real process, its exit code and output."""

import json
import os
import subprocess
import sys

import pytest

from harness.cli import one_line_failure


def explore(*args, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "explorer.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_operators_lists_names_halos_and_whole_axes():
    out = explore("operators", "--json")
    assert out.returncode == 0, out.stderr
    rows = {row["name"]: row for row in json.loads(out.stdout)}
    import operators

    shipped = {n for n in operators.names() if not n.startswith("test_")}  # harness/plugin_ops may be loaded
    assert set(rows) == shipped
    for name, row in rows.items():
        op = operators.get(name)
        assert tuple(row["halo"]) == tuple(op.halo) and tuple(row["whole_axes"]) == tuple(op.whole_axes)
    text = explore("operators")
    assert text.returncode == 0 and "gst3d" in text.stdout and "samples" in text.stdout


def test_profile_json_has_the_measurement_fields():
    out = explore("profile", "envelope", "32x24x64", "--repeat", "2", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    for key in ("operator", "shape", "peak_bytes", "input_bytes", "output_bytes", "process_peak_bytes",
                "seconds", "status", "repeats"):
        assert key in data
    assert data["status"] == "ok" and data["shape"] == [32, 24, 64] and len(data["repeats"]) == 2
    assert data["input_bytes"] == 32 * 24 * 64 * 4


def test_capped_profile_exits_zero_with_exceeded():
    out = explore("profile", "gst3d", "128x128x128", "--memory-cap", "40MiB", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["status"] == "exceeded"


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["profile", "nosuchop", "10x10x10"], "unknown operator 'nosuchop'"),
        (["profile", "gst3d", "10x10"], "has 2 axes"),
        (["profile", "gst3d", "10xtenx10"], "malformed shape"),
        (["profile", "gst3d", "10x0x10"], "non-positive"),
        (["profile", "gst3d", "10x-3x10"], "non-positive"),
        (["profile", "gst3d", "10x10x10", "--memory-cap", "lots"], "malformed size"),
        (["profile", "gst3d", "10x10x10", "--memory-cap", "0"], "not positive"),
        (["profile", "gst3d", "10x10x10", "--repeat", "0"], "positive integer"),
        (["profile", "gst3d", "10x10x10", "--timeout", "-1"], "positive number"),
        (["profile", "gst3d"], "required"),
        (["nosuchop"], "unknown operator 'nosuchop'"),
    ],
)
def test_bad_input_is_one_line_and_non_zero(args, fragment):
    out = explore(*args)
    assert out.returncode != 0
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert fragment in lines[0]


# --------------------------------------------------------------------------- against a user's cluster


@pytest.fixture(scope="module")
def small_segy(tmp_path_factory):
    import operators

    path = tmp_path_factory.mktemp("cli-cluster") / "in.sgy"
    operators.write_segy(path, operators.synthetic_volume((24, 24, 24), seed=0))
    return path


def test_run_against_an_address_with_nothing_listening_is_one_line(small_segy, tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free once closed: nothing listens there
    out = explore("run", "gst3d", str(small_segy), "--output", str(tmp_path / "o.zarr"), "--chunks", "12x12x24",
                  "--scheduler", f"tcp://127.0.0.1:{port}", "--connect-timeout", "2")
    line = one_line_failure(out, f"cannot connect to scheduler tcp://127.0.0.1:{port}")
    assert "is a scheduler running there?" in line
    assert not any(p.name.startswith("o.zarr") for p in tmp_path.iterdir())


def test_run_on_workers_without_the_operators_plugin_is_one_line(small_segy, tmp_path):
    from harness.cluster import user_cluster

    env = {k: v for k, v in os.environ.items() if k != "EXPLORER_PLUGINS"}
    with user_cluster(env={"EXPLORER_PLUGINS": ""}) as address:
        out = explore("run", "test_allocates", str(small_segy), "--output", str(tmp_path / "o.zarr"), "--chunks",
                      "12x12x24", "--scheduler", address, "--no-refine",
                      env={**env, "EXPLORER_PLUGINS": "harness.plugin_ops"})
    line = one_line_failure(out, "cannot load operator 'test_allocates'")
    assert "EXPLORER_PLUGINS" in line and "tcp://" in line


def _can_unshare_mounts() -> bool:
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _can_unshare_mounts(), reason="needs `unshare -m` (root) to hide the input from the worker")
def test_run_with_an_input_the_workers_cannot_read_is_one_line(small_segy, tmp_path):
    """The worker runs in its own mount namespace where the input's directory is an empty
    tmpfs: what a cluster on other machines sees of a local path."""
    from harness.cluster import user_cluster

    hide = f"mount -t tmpfs none {small_segy.parent} && exec \"$@\""
    with user_cluster(worker_prefix=["unshare", "-m", "--propagation", "private", "sh", "-c", hide, "sh"]) as address:
        out = explore("run", "gst3d", str(small_segy), "--output", str(tmp_path / "o.zarr"), "--chunks",
                      "12x12x24", "--scheduler", address, "--no-refine")
    line = one_line_failure(out, f"cannot read {small_segy}")
    assert "shared file system" in line


# --------------------------------------------------------------------------- the mistakes people make


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["chunks", "gst3d", "--shape", "100x100x100", "--memory-limit", "1GiB", "--confidence", "0.5"],
         "must be in (0.5, 1)"),
        (["chunks", "gst3d", "--shape", "100x100x100", "--memory-limit", "1GiB", "--confidence", "1"],
         "must be in (0.5, 1)"),
        (["gst3d", "--confidence", "0.5"], "must be in (0.5, 1)"),
        (["run", "gst3d", "in.sgy", "--output", "o.zarr", "--confidence", "0.3"], "must be in (0.5, 1)"),
        (["chunks", "gst3d", "--shape", "1000000000x1000000000x1000000000", "--memory-limit", "4GiB"],
         "dimension above 16,777,216"),
        (["chunks", "gst3d", "--shape", "100000x100000x100000", "--memory-limit", "4GiB"], "voxels, above"),
        (["chunks", "gst3d", "--shape", "100x100x100", "--memory-limit", ""], "empty size"),
        (["chunks", "gst3d", "--shape", "100x100x100", "--memory-limit", "1e30"], "above 1 EiB"),
        (["run", "gst3d", "in.sgy", "--output", "o.npy"], "must end in .zarr, .sgy, .segy or .mdio"),
    ],
)
def test_user_mistakes_are_one_line_that_names_the_fix(args, fragment, tmp_path):
    if "in.sgy" in args:
        import operators

        operators.write_segy(tmp_path / "in.sgy", operators.synthetic_volume((8, 8, 8), seed=0))
    out = subprocess.run([sys.executable, "-m", "explorer.cli", *args], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    if "in.sgy" in args:
        assert not (tmp_path / "o.zarr").exists()
    one_line_failure(out, fragment)


@pytest.mark.unit
def test_the_library_refuses_the_same_confidence_as_the_cli():
    from explorer.core import validate
    from explorer.plan.recommend import recommend_chunks

    with pytest.raises(ValueError, match=r"confidence must be in \(0.5, 1\)"):
        recommend_chunks("gst3d", (100, 100, 100), "1GiB", confidence=0.5)
    assert validate.confidence(0.99) == 0.99
    for bad in (0.5, 1.0, 0.2, float("nan"), "x", True):
        with pytest.raises(ValueError):
            validate.confidence(bad)


def test_a_missing_plugin_module_names_the_variable():
    env = {**os.environ, "EXPLORER_PLUGINS": "no_such_plugin_module"}
    line = one_line_failure(explore("operators", env=env), "EXPLORER_PLUGINS names 'no_such_plugin_module'")
    assert "cannot be imported" in line


def test_a_truncated_model_and_a_garbage_calibration_name_the_file_and_the_command(gst3d_model, tmp_path):
    from explorer.core import paths

    runs = tmp_path / "runs"
    model_file = paths.model_path("gst3d", runs)
    gst3d_model.save(model_file)
    chunks = ("chunks", "gst3d", "--shape", "200x200x200", "--memory-limit", "2GiB", "--runs-dir", str(runs))
    cal_file = paths.operator_dir("gst3d", runs) / "calibration.json"
    cal_file.write_text("{not json")
    line = one_line_failure(explore(*chunks), str(cal_file))
    assert "explore gst3d" in line
    cal_file.unlink()
    model_file.write_bytes(model_file.read_bytes()[:200])
    line = one_line_failure(explore(*chunks), str(model_file))
    assert "explore gst3d" in line


def test_version():
    out = explore("--version")
    assert out.returncode == 0 and out.stdout.startswith("explore (memory-explorer) ")
    from explorer import __version__

    assert __version__ in out.stdout and __version__ != "0+unknown"


def test_chunks_longer_than_the_volume_say_so(small_segy, tmp_path):
    out = explore("run", "envelope", str(small_segy), "--output", str(tmp_path / "o.zarr"), "--chunks", "100x10x10",
                  "--no-refine", "--workers", "1", "--memory-limit", "1GiB")
    assert out.returncode == 0, out.stderr
    warning = [line for line in out.stderr.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1 and "axes [0] are longer than the volume 24x24x24" in warning[0]
    assert "needs axes [2] whole" in warning[0]  # envelope: the samples axis whole


def test_a_garbage_calibration_is_named_by_a_run_with_explicit_chunks(gst3d_model, small_segy, tmp_path):
    from explorer.core import paths

    runs = tmp_path / "runs"
    gst3d_model.save(paths.model_path("gst3d", runs))
    cal_file = paths.operator_dir("gst3d", runs) / "calibration.json"
    cal_file.write_text("[1, 2")
    out = explore("run", "gst3d", str(small_segy), "--output", str(tmp_path / "o.zarr"), "--chunks", "12x12x24",
                  "--workers", "1", "--memory-limit", "1GiB", "--runs-dir", str(runs))
    assert out.returncode == 0, out.stderr
    warnings = [line for line in out.stderr.splitlines() if line.startswith("warning:")]
    assert any(str(cal_file) in line and "explore gst3d" in line for line in warnings), out.stderr


@pytest.mark.parametrize("args", [
    ["envelope", "--budget", "2", "--storage", "nosuch:///x"],  # a URL, but no such database
    ["report", "envelope", "--storage", "journal:"],
    ["run", "envelope", "in.sgy", "--output", "x.zarr", "--storage", "/not/a/url.db"],
])
def test_a_bad_storage_url_is_one_line_naming_it_and_the_accepted_forms(args, tmp_path):
    out = explore(*args, "--runs-dir", str(tmp_path))
    line = one_line_failure(out, "cannot open storage")
    url = args[args.index("--storage") + 1]
    assert f"'{url}'" in line and "sqlite:///PATH" in line and "journal:PATH" in line


def test_explore_that_saves_no_model_exits_non_zero_and_says_why(tmp_path):
    out = explore("gaussian", "--budget", "1", "--probes", "0", "--runs-dir", str(tmp_path))
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("explore: no model saved: too few successful profiles") and "raise --budget" in last, out.stderr
    assert "Traceback" not in out.stderr


def test_a_plan_from_a_model_that_did_not_converge_says_so(gst3d_model, tmp_path):
    """``explore chunks`` (text and JSON) carries the warning of a model whose loop ended on its
    budget; a model that converged carries none of it."""
    from explorer.core import paths

    for converged in (False, True):
        runs = tmp_path / str(converged)
        ended = gst3d_model.certified(1.0)
        ended.info.update(converged=converged, stopped_because="budget of 30 profiles spent: tight failed (...)")
        ended.save(paths.model_path("gst3d", runs))
        out = explore("chunks", "gst3d", "--shape", "300x300x300", "--memory-limit", "2GiB", "--baseline",
                      "200MiB", "--runs-dir", str(runs), "--json")
        assert out.returncode == 0, out.stderr
        warnings = json.loads(out.stdout)["warnings"]
        said = [w for w in warnings if "did not converge" in w]
        assert bool(said) == (not converged), warnings
        if said:
            assert "budget of 30 profiles spent" in said[0] and "--budget" in said[0]
            assert any("did not converge" in line for line in out.stderr.splitlines())


@pytest.mark.parametrize("command", sorted(__import__("explorer.cli", fromlist=["COMMANDS"]).COMMANDS))
def test_no_operator_may_take_a_subcommand_name(command):
    """The reserved names are the CLI's commands themselves (none can be left out): after the
    CLI reserved them, as it does before loading plugins, registering one raises."""
    import operators
    from explorer.cli import reserve_commands

    reserve_commands()
    assert command in operators.RESERVED_NAMES
    with pytest.raises(ValueError, match="reserved"):

        @operators.register
        class Clash(operators.Operator):
            name = command

            def run(self, block):
                return block

    assert command not in operators.names()


def test_a_plugin_operator_named_like_a_subcommand_is_one_line(tmp_path):
    (tmp_path / "clash_plugin.py").write_text(
        "import operators\n\n@operators.register\nclass Calibrate(operators.Operator):\n    name = 'calibrate'\n\n"
        "    def run(self, block):\n        return block\n")
    env = {**os.environ, "EXPLORER_PLUGINS": "clash_plugin",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "explorer.cli", "operators"], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode != 0
    assert "'calibrate'" in proc.stderr and "reserved" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_a_failed_profile_says_so_on_stderrs_last_line(tmp_path):
    """It used to print its failure on stdout only, stderr ending on the progress line."""
    (tmp_path / "userops.py").write_text(
        "import operators\n\ndef broken(block):\n    raise RuntimeError('needs a velocity model')\n\n"
        "broken_op = operators.from_function(broken, name='broken_op')\n")
    out = subprocess.run([sys.executable, "-m", "explorer.cli", "profile", "userops:broken_op", "12x12x12"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1] == ("explore profile: broken_op at 12x12x12 error: RuntimeError: "
                                                   "needs a velocity model")


def test_a_plugins_operator_is_found_from_python_without_the_cli(tmp_path):
    """`explorer.load_model("my_op")` with EXPLORER_PLUGINS set raised KeyError: only the CLI
    loaded plug-ins.  A lookup that misses now loads them."""
    code = ("import explorer\ntry:\n    explorer.load_model('test_allocates', runs_dir=%r)\n"
            "except explorer.ModelNotFoundError as exc:\n    print('no model yet:', exc)\n") % str(tmp_path)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "EXPLORER_PLUGINS": "harness.plugin_ops"})
    assert out.returncode == 0 and out.stdout.startswith("no model yet:") and "explore test_allocates" in out.stdout, \
        out.stderr


def test_a_plan_says_the_largest_block_its_workers_were_measured_on(probed_runs, tmp_path):
    """``explore chunks`` on an in-worker calibration: the plan's block is at most the largest
    probe's (100^3 for this fixture's probes: its largest isolated profile), and the text and the JSON
    say that cap."""
    import math
    import shutil

    runs = tmp_path / "runs"
    shutil.copytree(probed_runs, runs)
    args = ("chunks", "gst3d", "--shape", "400x400x400", "--memory-limit", "8GiB", "--baseline", "100MiB",
            "--runs-dir", str(runs))
    text = explore(*args)
    assert text.returncode == 0, text.stderr
    assert "largest block   1,000,000 voxels (100^3), the largest measured in a worker" in text.stdout
    plan = json.loads(explore(*args, "--json").stdout)
    assert plan["max_block_voxels"] == 100**3 and math.prod(plan["block"]) <= 100**3
