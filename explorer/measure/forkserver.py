"""The profiling fork server: a small, clean process that forks one child per profile.

Started by :class:`explorer.measure.profiling.Profiler` as ``python -m explorer.measure.forkserver``
while the parent is small, it preloads NumPy, SciPy and the operators (never
torch, never the explorer's core) and then serves one JSON request per line on
stdin, answering one JSON line on stdout.  For each request it builds the input
volume once (cached for repeats of the same shape; ``{"cmd": "prepare", ...}`` builds
it only, ahead of the runs), then forks a child per repeat.  The child inherits the
volume already resident, caps its data segment, measures ``peak_bytes`` with
:class:`explorer.measure.highwater.PeakMeter` and writes its result to a pipe.  The server enforces the timeout, kills a late child, and
turns a crash into ``error`` with the child's last error line.
"""

from __future__ import annotations

import base64
import faulthandler
import gc
import json
import os
import resource
import select
import signal
import sys
import tempfile
import time
import traceback

import numpy as np
import scipy.ndimage  # noqa: F401  (preloaded: children fork with it)
import scipy.signal  # noqa: F401

import operators
from explorer.measure.highwater import PeakMeter, fix_mmap_threshold, read_status, release_free_heap
from operators.plugins import load_plugins
from operators.portable import install

OK, EXCEEDED, TIMEOUT, ERROR = "ok", "exceeded", "timeout", "error"


def _measure(request: dict, x: np.ndarray, server_rss: int) -> dict:
    """In the forked child: run the operator once on the resident ``x``.

    ``process_peak_bytes = server_rss + peak_bytes``: the child is a
    copy-on-write image of the server (interpreter, libraries, ``x``), whose
    resident state it shares without having faulted in every library page, so
    the server's RSS is the process's resident state before the call.
    """
    op = operators.get(request["operator"])
    cap = request.get("memory_cap_bytes")
    _warm_up(op, x)
    gc.collect()
    gc.disable()
    release_free_heap()
    if cap:
        # RLIMIT_DATA covers heap and private anonymous mmaps (Linux >= 4.7):
        # NumPy raises MemoryError cleanly once the operator's growth hits the cap.
        base = read_status()["VmData"]
        resource.setrlimit(resource.RLIMIT_DATA, (base + int(cap), resource.RLIM_INFINITY))
    status, error, y = OK, None, None
    start = time.perf_counter()
    with PeakMeter() as meter:
        try:
            y = op.run(x)
        except MemoryError:
            status, error = EXCEEDED, "MemoryError at the memory cap"
    seconds = time.perf_counter() - start
    if cap:
        resource.setrlimit(resource.RLIMIT_DATA, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    result = {
        "status": status,
        "peak_bytes": meter.peak_bytes,
        "process_peak_bytes": server_rss + meter.peak_bytes,
        "child_hwm_bytes": meter.process_peak_bytes,
        "rss_before_bytes": meter.rss_before,
        "seconds": seconds,
        "output_bytes": None if y is None else sum(int(a.nbytes) for a in (y if isinstance(y, tuple) else (y,))),
        "error": error,
    }
    if request.get("gpu"):
        result["gpu"] = _measure_gpu(op, x)
    return result


def _warm_up(op, x: np.ndarray) -> None:
    """Run the operator once on a tiny block before measuring.

    A forked child shares the server's library code pages but has not mapped
    them yet; the first call faults them in (a few MiB of RSS that is not the
    operator's working memory) and performs lazy imports.  A Dask worker that
    has run one task is in the same warm state.
    """
    tiny = tuple(min(n, 2 * h + 8) for n, h in zip(x.shape, op.halo))
    op.run(np.ascontiguousarray(x[tuple(slice(0, n) for n in tiny)]))


def _measure_gpu(op, x: np.ndarray) -> dict:
    """GPU peak of the operator's torch form: torch's allocator peak and NVML's device usage."""
    run_torch = getattr(op, "run_torch", None)
    if run_torch is None:
        return {"note": f"operator {op.name} has no torch form; GPU peak not recorded"}
    import pynvml
    import torch

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    device_x = torch.as_tensor(x, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    run_torch(device_x)
    torch.cuda.synchronize()
    return {
        "gpu_peak_bytes": int(torch.cuda.max_memory_allocated() - before),
        "gpu_device_used_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(handle).used),
        "note": None,
    }


def _last_error_line(text: str) -> str:
    """The most telling line of a child's stderr: the last exception or fatal-error line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("Fatal Python error") or ("Error" in line.split(":")[0]) or "Exception" in line.split(":")[0]:
            return line
    return lines[-1] if lines else ""


def _run_child(request: dict, x: np.ndarray) -> dict:
    """Fork one child, wait for its result under the timeout, classify how it ended."""
    read_fd, write_fd = os.pipe()
    stderr_file = tempfile.TemporaryFile()
    sys.stdout.flush()
    # Frozen objects are skipped by the child's collections: no copy-on-write storm over the
    # server's heap (it cost 0.1 s per child before).  They stay frozen: what is alive at a fork
    # is the server's own state, and its collections then walk only what came since (a full
    # one over the imported libraries took 15 ms of every new shape).
    release_free_heap()  # the child must not inherit garbage as resident memory
    gc.freeze()
    server_rss = read_status()["VmRSS"]
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.close(read_fd)
            os.dup2(stderr_file.fileno(), 2)
            faulthandler.enable()
            try:
                result = _measure(request, x, server_rss)
            except Exception as exc:  # the operator's own failure
                traceback.print_exc()
                result = {"status": ERROR, "error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
            payload = json.dumps(result).encode()
            view = memoryview(payload)
            while view:
                view = view[os.write(write_fd, view):]
        finally:
            os._exit(0)

    os.close(write_fd)
    timeout = request.get("timeout_seconds")
    deadline = None if timeout is None else time.monotonic() + float(timeout)
    chunks, timed_out = [], False
    while True:
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            timed_out = True
            os.kill(pid, signal.SIGKILL)
            break
        ready, _, _ = select.select([read_fd], [], [], remaining)
        if ready:
            data = os.read(read_fd, 1 << 16)
            if not data:
                break
            chunks.append(data)
    os.close(read_fd)
    _, wait_status = os.waitpid(pid, 0)
    if timed_out:
        return {"status": TIMEOUT, "error": f"timed out after {timeout} s"}
    if chunks:
        return json.loads(b"".join(chunks))
    stderr_file.seek(0)
    last_line = _last_error_line(stderr_file.read().decode(errors="replace"))
    how = "exited"
    if os.WIFSIGNALED(wait_status):
        how = f"killed by {signal.Signals(os.WTERMSIG(wait_status)).name}"
        if os.WTERMSIG(wait_status) == signal.SIGKILL:
            how += " (the kernel's OOM killer?)"
    else:
        how = f"exited with code {os.WEXITSTATUS(wait_status)}"
    return {"status": ERROR, "error": f"child {how}" + (f": {last_line}" if last_line else "")}


class _VolumeCache:
    """The last input volume, kept in the server so repeats fork from it."""

    def __init__(self):
        self.key, self.volume = None, None

    def get(self, shape, dtype: str, seed: int) -> np.ndarray:
        key = (tuple(shape), dtype, seed)
        if key != self.key:
            self.key, self.volume = None, None
            gc.collect()
            release_free_heap()
            self.volume = operators.synthetic_volume(tuple(shape), seed=seed, dtype=np.dtype(dtype))
            self.key = key
        return self.volume


def serve(stdin, stdout) -> None:
    cache = _VolumeCache()
    x = None
    for line in stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        if request.get("cmd") == "exit":
            break
        try:
            if request.get("operators"):  # operators sent by the caller (operators.portable), before the fork
                install([base64.b64decode(text) for text in request["operators"]])
            x = None  # drop this loop's reference before the cache builds a new volume
            x = cache.get(request["shape"], request.get("dtype", "float32"), int(request.get("seed", 0)))
            if request.get("cmd") == "prepare":  # the input only, built ahead of its runs
                reply = {"status": OK}
            else:
                started = time.perf_counter()
                reply = _run_child(request, x)
                reply["child_wall_seconds"] = time.perf_counter() - started
            reply["input_bytes"] = int(x.nbytes)
            reply["server_pid"] = os.getpid()
        except Exception as exc:  # the server must outlive any one bad request
            reply = {"status": ERROR, "error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
        stdout.write(json.dumps(reply) + "\n")
        stdout.flush()


def main() -> None:
    fix_mmap_threshold()
    load_plugins()
    stdout = sys.stdout
    sys.stdout = sys.stderr  # stray prints must not corrupt the protocol
    stdout.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
    stdout.flush()
    serve(sys.stdin, stdout)


if __name__ == "__main__":
    main()
