"""A user's data is sacred: outputs never clobber, a SEG-Y output stays on its survey,
an interrupted run leaves nothing behind.  Real files, real `explore run` processes."""

import glob
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import segyio

import operators
from explorer.runner.outputs import ZARR_MARK, OutputError, check_output, put_in_place, written_by_explorer
from operators.segy import HISTORY_MARK, segy_geometry, write_segy_like
from harness.cli import one_line_failure as one_line

DATA = Path(__file__).parent / "data"
VOLVE = DATA / "segysak_volve10-migvel-depth-sub3d.sgy"
F3_IBM = DATA / "segyio_f3_ibm_float32.sgy"
F3_INT16 = DATA / "segyio_f3_int16.sgy"


def explore(*args, cwd=None, timeout=180):
    return subprocess.run([sys.executable, "-m", "explorer.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    path = tmp_path_factory.mktemp("outputs") / "in.sgy"
    operators.write_segy(path, operators.synthetic_volume((24, 20, 32), seed=0))
    return path


def run_args(source, output, *more):
    return ("run", "envelope", source, "--output", output, "--chunks", "12x20x32", "--no-refine", "--workers", "1",
            "--memory-limit", "1GiB", *more)


# --------------------------------------------------------------------------- never clobber


def test_an_existing_directory_is_refused_and_kept(small, tmp_path):
    target = tmp_path / "p.zarr"
    target.mkdir()
    (target / "important.txt").write_text("x")
    one_line(explore(*run_args(small, target)), "exists: pass --overwrite")
    one_line(explore(*run_args(small, target, "--overwrite")), "was not written by memory-explorer")
    assert (target / "important.txt").read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.zarr"]  # no partial left


def test_a_foreign_segy_is_not_replaced_even_with_overwrite(tmp_path):
    import shutil

    target = tmp_path / "mine.sgy"
    shutil.copy(F3_IBM, target)
    before = target.read_bytes()
    one_line(explore(*run_args(F3_IBM, target, "--overwrite")), "was not written by memory-explorer")
    one_line(explore(*run_args(F3_IBM, F3_IBM, "--overwrite")), "is the input file")
    assert target.read_bytes() == before


def test_overwrite_replaces_only_what_this_tool_wrote(small, tmp_path):
    out = tmp_path / "o.zarr"
    first = explore(*run_args(small, out))
    assert first.returncode == 0, first.stderr
    assert written_by_explorer(out)
    one_line(explore(*run_args(small, out)), "exists: pass --overwrite")
    again = explore(*run_args(small, out, "--overwrite"))
    assert again.returncode == 0, again.stderr
    import zarr

    attrs = zarr.open_array(str(out), mode="r").attrs[ZARR_MARK]
    g = segy_geometry(small)
    assert attrs["operator"] == "envelope" and attrs["input"] == str(small.resolve())
    assert attrs["geometry"]["inlines"] == list(g.inlines) and attrs["geometry"]["crosslines"] == list(g.crosslines)
    assert attrs["geometry"]["sample_interval_us"] == g.sample_interval_us
    assert [p.name for p in tmp_path.iterdir() if p.name != "runs"] == ["o.zarr"]  # nothing partial or replaced


def test_overwrite_never_removes_a_file_of_yours_put_inside_an_output(tmp_path):
    import zarr

    partial = tmp_path / ".o.zarr.partial-1"
    zarr.create_array(store=str(partial), shape=(4, 4, 4), chunks=(2, 4, 4), dtype="f4").attrs[ZARR_MARK] = {}
    out = tmp_path / "o.zarr"
    put_in_place(partial, out)  # as a run puts its output in place: its entries recorded
    assert written_by_explorer(out) and check_output(out, overwrite=True) == "zarr"
    (out / "notes.txt").write_text("mine")
    with pytest.raises(OutputError, match=r"memory-explorer did not write \(notes.txt\)"):
        check_output(out, overwrite=True)
    assert (out / "notes.txt").read_text() == "mine"


def test_a_file_whose_headers_were_copied_from_an_output_is_yours_not_ours(tmp_path):
    """The ownership token is of the file this tool wrote, not of its headers: a user's file
    made from an output's headers (token line included) is not replaced by --overwrite."""
    out = tmp_path / "o.sgy"
    write_segy_like(out, np.ones(segy_geometry(F3_IBM).shape, np.float32), F3_IBM, history="test")
    assert written_by_explorer(out)
    yours = tmp_path / "yours.sgy"
    ours = out.read_bytes()
    traces = np.frombuffer(ours[3600:], dtype=np.uint8)
    yours.write_bytes(ours[:3600] + traces[::-1].tobytes())  # our headers (token too) over traces of yours
    assert not written_by_explorer(yours)
    with pytest.raises(OutputError, match="was not written by memory-explorer"):
        check_output(yours, overwrite=True)
    with open(out, "r+b") as fh:  # an output the user edited since: theirs now
        fh.seek(3600 + 240)
        fh.write(b"\0\0\0\0")
    assert not written_by_explorer(out)


def test_every_textual_line_of_the_input_is_kept_when_none_is_blank(tmp_path):
    full = tmp_path / "full.sgy"
    operators.write_segy(full, operators.synthetic_volume((6, 5, 8), seed=1))
    with open(full, "r+b") as fh:
        fh.write(b"".join(f"C{n + 1:2d} LINE OF THE SURVEY'S OWN HISTORY {n}".ljust(80).encode() for n in range(40)))
    before = text_lines(full)
    assert write_segy_like(tmp_path / "o.sgy", np.zeros((6, 5, 8), np.float32), full, history="x") is False
    assert text_lines(tmp_path / "o.sgy") == before and written_by_explorer(tmp_path / "o.sgy")


def test_check_output_and_put_in_place_rules(tmp_path):
    with pytest.raises(OutputError, match="must end in .zarr, .sgy, .segy or .mdio"):
        check_output(tmp_path / "x.npy")
    with pytest.raises(OutputError, match="does not exist"):
        check_output(tmp_path / "nowhere" / "x.zarr")
    foreign = tmp_path / "f.zarr"
    foreign.mkdir()
    partial = tmp_path / ".f.zarr.partial-1"
    partial.mkdir()
    with pytest.raises(OutputError, match="not written by memory-explorer"):
        put_in_place(partial, foreign, overwrite=True)
    assert foreign.is_dir() and partial.is_dir()  # neither touched


# --------------------------------------------------------------------------- SEG-Y on its survey


def trace_headers(path):
    with segyio.open(path, ignore_geometry=True) as f:
        return [dict(h) for h in f.header]


def text_lines(path):
    with open(path, "rb") as fh:
        raw = fh.read(3200)
    return [raw[k:k + 80] for k in range(0, 3200, 80)]


@pytest.mark.parametrize("source", [VOLVE, F3_IBM, F3_INT16], ids=["volve", "f3-ibm", "f3-int16"])
def test_a_segy_output_keeps_every_header_of_its_input(source, tmp_path):
    out = tmp_path / "out.sgy"
    r = explore("run", "gaussian", source, "--output", out, "--chunks", "9x26x226", "--no-refine", "--workers", "1",
                "--memory-limit", "1GiB")
    assert r.returncode == 0, r.stderr
    assert trace_headers(out) == trace_headers(source)
    with segyio.open(source, ignore_geometry=True) as a, segyio.open(out, ignore_geometry=True) as b:
        binary_in, binary_out = dict(a.bin), dict(b.bin)
        assert binary_out.pop(segyio.BinField.Format) == 5
        binary_in.pop(segyio.BinField.Format)
        assert binary_out == binary_in
        assert list(b.samples) == list(a.samples) and b.tracecount == a.tracecount
    changed = [n for n, (x, y) in enumerate(zip(text_lines(source), text_lines(out))) if x != y]
    assert len(changed) == 1 and written_by_explorer(out) and not written_by_explorer(source)
    g_in, g_out = segy_geometry(source), segy_geometry(out)
    assert (g_out.inlines, g_out.crosslines, g_out.sample_interval_us, g_out.first_sample_ms, g_out.sorting) == \
        (g_in.inlines, g_in.crosslines, g_in.sample_interval_us, g_in.first_sample_ms, g_in.sorting)
    x = np.asarray(operators.read_segy(source)).astype(np.float32)
    expected = operators.get("gaussian").run(x)
    np.testing.assert_allclose(np.asarray(operators.read_segy(out)), expected, rtol=1e-5, atol=1e-5 * np.abs(x).max())


def test_the_volve_crop_keeps_its_survey_numbers(tmp_path):
    """The issue's case: dt 20 ms, inlines from 10087 in steps of 4, real CDP X (not 0)."""
    out = tmp_path / "v.sgy"
    write_segy_like(out, np.zeros(segy_geometry(VOLVE).shape, np.float32), VOLVE, history="test")
    g = segy_geometry(out)
    assert g.sample_interval_us == 20000 and g.inlines[:3] == (10087, 10091, 10095)
    headers = trace_headers(out)
    assert headers[0][segyio.TraceField.CDP_X] == 43641570 and headers[0][segyio.TraceField.SourceGroupScalar] == -100
    assert any(HISTORY_MARK.encode() in line or HISTORY_MARK.encode("cp037") in line for line in text_lines(out))


def test_write_segy_like_refuses_data_off_the_survey(tmp_path):
    with pytest.raises(ValueError, match="not on the survey"):
        write_segy_like(tmp_path / "x.sgy", np.zeros((5, 5, 5), np.float32), VOLVE)
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- interrupted


def _default_sigint():
    """SIGINT as a terminal's process has it: a test run started in the background by a
    non-interactive shell ignores SIGINT, and a child that inherits that never sees a Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (a zombie has stopped)."""
    import psutil

    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, psutil.Error):
            continue
    return False


def _slow_run_writing(tmp_path, edge: int):
    """``explore run`` of 1-s tasks (``harness.plugin_ops``'s test_slow) on an ``edge``^3 volume in
    8x8 columns, in a session of its own, once its first block is in the partial output:
    ``(process, command, environment)``."""
    operators.write_segy(tmp_path / "in.sgy", operators.synthetic_volume((edge,) * 3, seed=0))
    command = ["run", "test_slow", "in.sgy", "--output", "out.zarr", "--chunks", f"8x8x{edge}", "--no-refine",
               "--memory-limit", "1GiB"]
    env = {**os.environ, "EXPLORER_PLUGINS": "harness.plugin_ops", "EXPLORER_TEST_SLOW_SECONDS": "1"}
    p = subprocess.Popen([sys.executable, "-m", "explorer.cli", *command], cwd=tmp_path, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True, env=env,
                         preexec_fn=_default_sigint)
    while not glob.glob(str(tmp_path / ".out.zarr.partial-*" / "c")) and p.poll() is None:
        time.sleep(0.05)
    return p, command, env


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupted_run_leaves_no_partial_output_and_no_worker_traceback(tmp_path, sig):
    """A Ctrl-C reaches the whole process group (the workers too), a SIGTERM the run's
    process: one line, exit 130, no partial array left though tasks were writing into it."""
    # 64 tasks of 1 s on 2 workers: the signal, sent once the first block is written, finds the
    # run 31 s from its end at least (a run is interrupted at its first write, whatever its length).
    p, _, _ = _slow_run_writing(tmp_path, 64)
    assert glob.glob(str(tmp_path / ".out.zarr.partial-*")) and p.poll() is None, "the run never started writing"
    if sig == signal.SIGINT:
        os.killpg(p.pid, sig)  # as a terminal's Ctrl-C does
    else:
        p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert err.strip().splitlines()[-1].startswith("explore: interrupted")
    deadline = time.monotonic() + 300  # a hang guard: the run's workers end within seconds
    while _group_alive(p.pid) and time.monotonic() < deadline:  # none of the run's processes may write any more
        time.sleep(0.05)
    assert not _group_alive(p.pid), "a process of the interrupted run outlived it"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.sgy"], list(tmp_path.iterdir())


def test_ctrl_c_during_the_in_worker_probes_is_one_line(tmp_path):
    """A Ctrl-C reaches the probes' LocalCluster too: its workers leave it to `explore`, which
    ends in one line (before, each of the two workers and nannies printed a traceback)."""
    from explorer.core import paths
    from harness.models import fitted_gst3d_model

    fitted_gst3d_model().save(paths.model_path("gst3d", tmp_path / "runs"))
    p = subprocess.Popen([sys.executable, "-m", "explorer.cli", "calibrate", "gst3d", "--runs-dir",
                          str(tmp_path / "runs")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, preexec_fn=_default_sigint)
    while not glob.glob(str(tmp_path / "runs" / "gst3d" / "worker_baseline*")) and p.poll() is None:
        time.sleep(0.05)  # the probes' cluster is up: its baseline is saved before the first probe
    time.sleep(0.5)
    os.killpg(p.pid, signal.SIGINT)
    _, err = p.communicate(timeout=120)
    # 130, or (seen under load, 1 run in 3, cause not found) the process ending by the SIGINT
    # after its line: either way the user's last line is the one below, and no traceback.
    assert p.returncode in (130, -signal.SIGINT) and "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert err.strip().splitlines()[-1].startswith("explore: interrupted")


@pytest.mark.unit
def test_a_ctrl_c_that_an_import_wrapped_is_still_an_interrupt():
    """Seen in the test above (1 run in 3 of a session): the SIGINT landed while the probes' first
    write imported zarr; Python wrapped the KeyboardInterrupt raised in a ``__set_name__`` in a
    RuntimeError, which the run took for a probe error and went on (exit 1, every probe failing on
    a half-imported zarr). The interrupt is recognised through the chain."""
    from explorer.core.interrupts import caused_by_interrupt

    class Interrupting:
        def __set_name__(self, owner, name):
            raise KeyboardInterrupt

    with pytest.raises(RuntimeError) as wrapped:
        type("Codec", (), {"_codec": Interrupting()})
    assert "__set_name__" in str(wrapped.value) and caused_by_interrupt(wrapped.value)
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise ValueError("while handling it")
    except ValueError as exc:
        assert caused_by_interrupt(exc)
    assert not caused_by_interrupt(RuntimeError("a plain error"))


_SWALLOWED = """
import gc, sys, time
from explorer.core.interrupts import redeliver_swallowed_interrupts
if sys.argv[1] == "hook":
    redeliver_swallowed_interrupts()
fired = []
def callback(phase, info):
    if not fired:
        fired.append(1)
        raise KeyboardInterrupt  # as a Ctrl-C landing in distributed.gc's diagnosis
class Broken:
    def __del__(self):
        raise ValueError("an ordinary unraisable error")
gc.callbacks.append(callback)
try:
    gc.collect()
    Broken()
    time.sleep(2)  # a blocking call, as the probes' wait on their run: the Ctrl-C interrupts it
    print("lost")
except KeyboardInterrupt:
    print("delivered")
"""


@pytest.mark.unit
def test_a_ctrl_c_swallowed_by_a_gc_callback_is_delivered_again():
    """Seen once in the Ctrl-C-during-the-probes test above: the SIGINT landed in the
    garbage-collector callback that the probes' in-process scheduler installs
    (``distributed.gc``), Python printed "Exception ignored" and the probes ran to their end
    (exit 0).  ``redeliver_swallowed_interrupts`` (installed by ``explore``) raises it again;
    other unraisable errors are still reported as Python reports them."""
    def run(mode):
        return subprocess.run([sys.executable, "-c", _SWALLOWED, mode], capture_output=True, text=True,
                              timeout=60, preexec_fn=_default_sigint)

    without, with_hook = run("none"), run("hook")
    assert without.stdout.strip() == "lost" and "KeyboardInterrupt" in without.stderr  # the failure it fixes
    assert with_hook.stdout.strip() == "delivered", with_hook
    assert "KeyboardInterrupt" not in with_hook.stderr, with_hook.stderr
    assert "an ordinary unraisable error" in with_hook.stderr  # still reported as Python does


def test_a_partial_output_left_by_kill_9_is_removed_by_the_next_run_and_said(tmp_path):
    """kill -9 leaves the run's hidden partial output: the next run of that output removes it
    (its process gone, its content ours), says so, and leaves everything else alone."""
    p, command, env = _slow_run_writing(tmp_path, 32)
    os.killpg(p.pid, signal.SIGKILL)
    p.communicate(timeout=60)
    left = glob.glob(str(tmp_path / ".out.zarr.partial-*"))
    assert len(left) == 1, "kill -9 left no partial output to clean"
    (tmp_path / ".out.zarr.partial-yours").mkdir()  # not of this tool's naming: never touched
    env["EXPLORER_TEST_SLOW_SECONDS"] = "0"
    again = subprocess.run([sys.executable, "-m", "explorer.cli", *command], cwd=tmp_path, capture_output=True,
                           text=True, env=env, timeout=300)
    assert again.returncode == 0, again.stderr
    assert f"removed {os.path.basename(left[0])} beside out.zarr" in again.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.zarr.partial-yours", "in.sgy", "out.zarr"]


def test_make_volume_replaces_only_its_own_files(tmp_path):
    script = Path(__file__).parents[1] / "scripts" / "make_volume.py"
    foreign = tmp_path / "yours.sgy"
    foreign.write_text("not ours")
    out = subprocess.run([sys.executable, str(script), "8x8x8", str(foreign)], capture_output=True, text=True)
    assert out.returncode != 0 and "not written by memory-explorer" in out.stderr
    assert foreign.read_text() == "not ours"
    ours = tmp_path / "ours.sgy"
    for _ in range(2):  # the second run replaces the first's file
        out = subprocess.run([sys.executable, str(script), "8x8x8", str(ours)], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
    assert segy_geometry(ours).shape == (8, 8, 8)
