"""The ``explore`` command as users run it: a real process, its exit code and output."""

import json
import os
import subprocess
import sys

import pytest


def explore(*args, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "explorer.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_operators_lists_names_halos_and_whole_axes():
    out = explore("operators", "--json")
    assert out.returncode == 0, out.stderr
    rows = {row["name"]: row for row in json.loads(out.stdout)}
    import operators

    shipped = {n for n in operators.names() if not n.startswith("test_")}  # tests/plugin_ops may be loaded
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


def one_line_failure(out, fragment):
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], out.stderr
    return lines[0]


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
    from tests.cluster import user_cluster

    env = {k: v for k, v in os.environ.items() if k != "EXPLORER_PLUGINS"}
    with user_cluster(env={"EXPLORER_PLUGINS": ""}) as address:
        out = explore("run", "test_allocates", str(small_segy), "--output", str(tmp_path / "o.zarr"), "--chunks",
                      "12x12x24", "--scheduler", address, "--no-refine",
                      env={**env, "EXPLORER_PLUGINS": "tests.plugin_ops"})
    line = one_line_failure(out, "cannot load operator 'test_allocates'")
    assert "EXPLORER_PLUGINS" in line and "tcp://" in line


def _can_unshare_mounts() -> bool:
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _can_unshare_mounts(), reason="needs `unshare -m` (root) to hide the input from the worker")
def test_run_with_an_input_the_workers_cannot_read_is_one_line(small_segy, tmp_path):
    """The worker runs in its own mount namespace where the input's directory is an empty
    tmpfs: what a cluster on other machines sees of a local path."""
    from tests.cluster import user_cluster

    hide = f"mount -t tmpfs none {small_segy.parent} && exec \"$@\""
    with user_cluster(worker_prefix=["unshare", "-m", "--propagation", "private", "sh", "-c", hide, "sh"]) as address:
        out = explore("run", "gst3d", str(small_segy), "--output", str(tmp_path / "o.zarr"), "--chunks",
                      "12x12x24", "--scheduler", address, "--no-refine")
    line = one_line_failure(out, f"cannot read {small_segy}")
    assert "shared file system" in line


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
