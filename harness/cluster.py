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


def start_scheduler(folder: Path, log, env: dict, timeout: float = 60.0):
    """Start ``dask scheduler`` writing its address to ``folder/scheduler.json``; return the
    process and the address once the file holds it (read until it parses: it may be written
    before its contents are flushed)."""
    scheduler_file = folder / "scheduler.json"
    proc = subprocess.Popen([sys.executable, "-m", "dask", "scheduler", "--scheduler-file", str(scheduler_file),
                             "--port", "0", "--dashboard-address", ":0"],
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + timeout
    while True:
        try:
            return proc, json.loads(scheduler_file.read_text())["address"]
        except (OSError, ValueError, KeyError):
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError(f"dask scheduler did not start: {(folder / 'cluster.log').read_text()[-500:]}")
            time.sleep(0.1)


def stop_processes(workers, scheduler) -> None:
    """Stop the workers first, then the scheduler: a worker stopped by SIGTERM while its
    scheduler closes can hang in its plugins' teardown (20 s here)."""
    for group in (list(workers), [scheduler] if scheduler is not None else []):
        for proc in group:
            proc.terminate()
        for proc in group:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextlib.contextmanager
def user_cluster(*, workers: int = 1, threads: int = 1, memory_limit: str = "1GiB", preload=(),
                 worker_prefix=(), env=None, timeout: float = 60.0):
    """Yield the scheduler's address of a real ``dask scheduler`` + ``dask worker`` cluster."""
    folder = Path(tempfile.mkdtemp(prefix="user-cluster-"))
    env = {**os.environ, **(env or {})}
    scheduler, worker_procs = None, []
    log = open(folder / "cluster.log", "w")
    try:
        scheduler, address = start_scheduler(folder, log, env, timeout)
        command = [*worker_prefix, sys.executable, "-m", "dask", "worker", address, "--nworkers", str(workers),
                   "--nthreads", str(threads), "--memory-limit", memory_limit, "--no-dashboard",
                   "--local-directory", str(folder)]
        for module in preload:
            command += ["--preload", module]
        worker_procs.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env))
        from distributed import Client

        with Client(address, timeout="20s") as client:
            client.wait_for_workers(workers, timeout=timeout)
        yield address
    finally:
        stop_processes(worker_procs, scheduler)
        log.close()
