"""unet3d: the FaultSeg3D U-Net operator (torch, CPU): its block form, padding, halo,
thread policy, and its profiles through the project's profiler and CLI."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import dask.array as da
import numpy as np
import pytest

import operators
from operators import Operator
from operators.unet import HALO, UNet3D, aligned_chunks, aligned_halo, dependency_reach, padded_shape

#: Stated agreement of the Dask form with ``run`` on the whole volume (probabilities):
#: float32 rounding of the oneDNN kernels blocked per block shape (4.2e-7 measured).
TOLERANCE = 1e-6


@pytest.fixture(scope="module")
def op():
    return operators.get("unet3d")


def _max_difference(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float64) - b).max())


def _with_halo(halo: int) -> Operator:
    return type("UNet3DHalo", (UNet3D,), {"halo": (halo, halo, halo)})()


# --------------------------------------------------------------------------- imports, threads


@pytest.mark.integration
def test_import_operators_does_not_import_torch():
    code = "import operators, sys; assert 'unet3d' in operators.names(); assert 'torch' not in sys.modules"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_torch_runs_one_intra_op_thread_in_any_task_thread(op):
    seen = {}

    def task():
        op.run(np.zeros((8, 8, 8), np.float32))
        import torch

        seen["threads"] = torch.get_num_threads()

    thread = threading.Thread(target=task)
    thread.start()
    thread.join()
    assert seen["threads"] == 1


# --------------------------------------------------------------------------- the block form


def test_output_is_float32_of_the_input_shape_and_a_probability(op):
    x = operators.synthetic_volume((24, 32, 40), seed=1)
    y = op.run(x)
    assert y.dtype == np.float32 and y.shape == x.shape and y.flags.c_contiguous
    assert np.isfinite(y).all() and y.min() >= 0.0 and y.max() <= 1.0
    assert y.std() > 1e-3  # the untrained network still responds to its input


def test_two_runs_and_two_builds_are_identical(op):
    import torch

    from operators import unet_net

    x = operators.synthetic_volume((16, 24, 32), seed=2)
    np.testing.assert_array_equal(op.run(x), op.run(x))
    state = torch.random.get_rng_state()
    a, b = unet_net.build(), unet_net.build()
    assert torch.equal(state, torch.random.get_rng_state())  # the caller's RNG is untouched
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
    assert sum(p.numel() for p in a.parameters()) == 9_422_977


def test_every_convolution_runs_through_onednn_even_on_small_blocks(op):
    """PyTorch's dispatch would send these to slow_conv3d (vol2col: 27 C floats per voxel)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    if not torch.backends.mkldnn.is_available():
        pytest.skip("torch built without oneDNN")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        op.run(np.ones((16, 16, 16), np.float32))
    calls = {event.key: event.count for event in prof.key_averages()}
    assert calls.get("aten::mkldnn_convolution") == 15
    assert not any("slow_conv3d" in key for key in calls)


def test_odd_shapes_are_reflect_padded_to_multiples_of_8_and_trimmed(op):
    x = operators.synthetic_volume((13, 21, 30), seed=4)
    assert padded_shape(x.shape) == (16, 24, 32)
    y = op.run(x)
    assert y.shape == (13, 21, 30) and y.dtype == np.float32
    padded = np.pad(x, [(0, 3), (0, 3), (0, 2)], mode="reflect")
    np.testing.assert_array_equal(y, op.run(padded)[:13, :21, :30])
    zero_padded = np.pad(x, [(0, 3), (0, 3), (0, 2)])
    assert _max_difference(y, op.run(zero_padded)[:13, :21, :30]) > 1e-4  # the pad mode matters


def test_tiny_and_cast_inputs(op):
    y = op.run(np.ones((1, 2, 3), np.float32))
    assert y.shape == (1, 2, 3) and y.dtype == np.float32
    x = operators.synthetic_volume((16, 16, 16), seed=6)
    np.testing.assert_array_equal(op.run(x.astype(np.float64)), op.run(x))
    with pytest.raises(ValueError, match="3D"):
        op.run(np.zeros((8, 8), np.float32))


# --------------------------------------------------------------------------- halo and seams


def test_dependency_reach_matches_single_input_perturbations():
    """The analytic reach per position modulo 8 is what perturbing one input changes."""
    import torch

    from operators import unet_net

    net = unet_net.build().double()
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((1, 1, 136, 8, 8)))
    measured = [[0, 0] for _ in range(8)]
    with torch.inference_mode():
        y0 = net(x)[0, 0]
        for p in range(64, 72):
            x2 = x.clone()
            x2[0, 0, p] += 10.0
            changed = torch.nonzero((net(x2)[0, 0] - y0).abs().amax(dim=(1, 2)) > 0).flatten()
            # outputs q > p reach back to p (q's reach before), outputs q < p reach forward
            for q in changed.tolist():
                r = q % 8
                if q > p:
                    measured[r][0] = max(measured[r][0], q - p)
                else:
                    measured[r][1] = max(measured[r][1], p - q)
    assert [tuple(m) for m in measured] == dependency_reach()
    assert max(max(r) for r in dependency_reach()) == 51
    assert aligned_halo() == HALO == 48 and UNet3D.halo == (48, 48, 48)


@pytest.mark.parametrize(
    "chunks, halo, expected",
    [
        ((64, 64, 72), 48, (64, 64, 72)),  # aligned: unchanged
        ((52, 52, 53), 48, (48, 56, 53)),  # boundaries to the nearest multiple of 8
        ((56, 56, 45), 48, (56, 101)),  # a last chunk shorter than the halo is merged
        ((13, 11, 20), 48, (44,)),  # an axis no longer than the halo: one chunk
        ((60, 60, 60, 23), 48, (64, 56, 83)),
    ],
)
def test_aligned_chunks(chunks, halo, expected):
    out = aligned_chunks(chunks, halo)
    assert out == expected and sum(out) == sum(chunks)
    assert all(b % 8 == 0 for b in np.cumsum(out)[:-1]) and all(c >= min(halo, sum(chunks)) for c in out)


CASES = {
    "axis0": ((200, 16, 16), (64, 16, 16)),
    "axis1 odd length": ((16, 157, 16), (16, 96, 16)),
    "axis2": ((16, 16, 203), (16, 16, 72)),
    "axes 0 and 2": ((104, 16, 112), (48, 16, 56)),
    "misaligned chunks": ((200, 16, 16), (60, 16, 16)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_dask_form_equals_the_whole_volume_within_the_stated_tolerance(op, case):
    shape, chunks = CASES[case]
    x = operators.synthetic_volume(shape, seed=5)
    lazy = op.dask(da.from_array(x, chunks=chunks))
    assert sum(n > 1 for n in lazy.numblocks) >= 1 and max(lazy.numblocks) >= 2  # seams are exercised
    result = lazy.compute(scheduler="synchronous")
    assert result.dtype == np.float32 and result.shape == x.shape
    assert _max_difference(result, op.run(x)) <= TOLERANCE


def test_a_halo_one_step_short_breaks_the_tolerance(op):
    """With a halo of 40 (the next multiple of 8 down) the comparison above fails."""
    x = operators.synthetic_volume((200, 16, 16), seed=5)
    result = _with_halo(40).dask(da.from_array(x, chunks=(64, 16, 16))).compute(scheduler="synchronous")
    assert _max_difference(result, op.run(x)) > 100 * TOLERANCE  # 2.9e-4 measured


def test_unaligned_blocks_change_the_pooling_grid_and_the_output(op):
    """Why ``overlap_depth`` aligns the chunks: a plain ``map_overlap`` on chunk boundaries off
    the multiple of 8 differs from the whole volume far beyond rounding."""
    x = operators.synthetic_volume((200, 16, 16), seed=5)
    plain = da.map_overlap(op.run, da.from_array(x, chunks=(60, 16, 16)), depth={0: op.halo[0], 1: 0, 2: 0},
                           boundary="none", dtype=np.float32).compute(scheduler="synchronous")
    assert _max_difference(plain, op.run(x)) > 1e-3  # 8e-3 measured


# --------------------------------------------------------------------------- profiles


@pytest.mark.integration
def test_profiles_keep_torch_out_of_the_server_and_a_capped_run_ends_exceeded():
    """The child imports torch and builds the network in its warm-up (not in the measured
    peak: a torch import alone is over 100 MiB); the fork server never maps torch; torch's
    allocation failure at the cap is a MemoryError, so the profile is a lower bound."""
    from explorer.measure.profiling import Profiler

    with Profiler(gpu=False) as profiler:
        m = profiler.profile("unet3d", (24, 24, 24))
        assert m.status == "ok" and 0 < m.peak_bytes < 100 * 2**20, m
        capped = profiler.profile("unet3d", (48, 48, 48), memory_cap="8MiB")
        assert capped.status == "exceeded", capped.error
        envelope = profiler.profile("envelope", (24, 24, 24))
        assert envelope.status == "ok"
        with open(f"/proc/{profiler._process.pid}/maps") as maps:
            assert "libtorch" not in maps.read()


@pytest.mark.integration
def test_cli_profile_gives_a_positive_peak():
    out = subprocess.run([sys.executable, "-m", "explorer.cli", "profile", "unet3d", "24x24x24", "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["status"] == "ok" and data["peak_bytes"] > 0 and data["output_bytes"] == 24**3 * 4
    listed = subprocess.run([sys.executable, "-m", "explorer.cli", "operators"], capture_output=True, text=True,
                            timeout=60)
    assert listed.returncode == 0 and "unet3d" in listed.stdout and "48x48x48" in listed.stdout
