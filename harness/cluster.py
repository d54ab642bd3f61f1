"""A Dask cluster started the way a user starts one: ``dask scheduler`` and ``dask worker``
processes (no LocalCluster), optionally with a worker command prefix (``unshare ...``) and
environment.  Used by the tests and by ``scripts/bench_chunks.py``."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


@contextlib.contextmanager
def user_cluster(*, workers: int = 1, threads: int = 1, memory_limit: str = "1GiB", preload=(),
                 worker_prefix=(), env=None, timeout: float = 60.0):
    """Yield the scheduler's address of a real ``dask scheduler`` + ``dask worker`` cluster."""
    folder = Path(tempfile.mkdtemp(prefix="user-cluster-"))
    scheduler_file = folder / "scheduler.json"
    env = {**os.environ, **(env or {})}
    dask = [sys.executable, "-m", "dask"]
    procs = []
    log = open(folder / "cluster.log", "w")
    try:
        procs.append(subprocess.Popen(dask + ["scheduler", "--scheduler-file", str(scheduler_file), "--port", "0",
                                              "--dashboard-address", ":0"],
                                      stdout=log, stderr=subprocess.STDOUT, env=env))
        deadline = time.monotonic() + timeout
        while not scheduler_file.exists():
            if time.monotonic() > deadline or procs[0].poll() is not None:
                raise RuntimeError(f"dask scheduler did not start: {(folder / 'cluster.log').read_text()[-500:]}")
            time.sleep(0.1)
        time.sleep(0.2)  # the file is written before its contents are flushed on some versions
        address = json.loads(scheduler_file.read_text())["address"]
        command = [*worker_prefix, *dask, "worker", address, "--nworkers", str(workers), "--nthreads",
                   str(threads), "--memory-limit", memory_limit, "--no-dashboard", "--local-directory",
                   str(folder)]
        for module in preload:
            command += ["--preload", module]
        procs.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env))
        from distributed import Client

        with Client(address, timeout="20s") as client:
            client.wait_for_workers(workers, timeout=timeout)
        yield address
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in reversed(procs):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        log.close()
