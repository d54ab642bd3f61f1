"""The ``explore`` command as users run it: a real process, its exit code and output."""

import json
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
