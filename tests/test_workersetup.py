"""The allocator setting every worker that runs our plans gets (``explorer.measure.workersetup``), on real
processes: a LocalCluster's workers, ``dask worker`` processes, and fresh interpreters.

glibc has no getter for the mmap threshold, so its behaviour is tested: after freeing a 24 MiB
block (mmapped at the initial 128 KiB threshold), a dynamic threshold rises to 24 MiB and a 1 MiB
allocation then lands on the heap; a pinned one stays at 128 KiB and the 1 MiB is mmapped
(``mallinfo2().hblkhd``, the bytes in mmapped chunks, grows by it).  The worker clusters are
started with distributed's ``MALLOC_TRIM_THRESHOLD_`` unset: that variable alone turns the
dynamic threshold off (the module's docstring), so a default nanny's worker cannot tell.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import dask
import distributed
import numpy as np
import pytest

import operators
from harness.cluster import start_scheduler, stop_processes
from explorer.runner.daskrun import run
from explorer.measure.workersetup import PLUGIN_NAME, allocator_pinned, mmap_threshold_pinned, prepare_workers
from explorer.measure.local_cluster import local_cluster

#: Environment variables that set glibc's malloc (any of them turns the dynamic threshold off).
MALLOC_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_",
                    "GLIBC_TUNABLES")


def clean_environment(**extra) -> dict:
    """This process's environment without any malloc variable, plus ``extra``."""
    return {**{k: v for k, v in os.environ.items() if k not in MALLOC_VARIABLES}, **extra}


@pytest.fixture
def dynamic_cluster_config(monkeypatch):
    """LocalClusters whose workers start with glibc's dynamic threshold (no malloc variable)."""
    for name in MALLOC_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    with dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}):
        yield


def test_the_probe_tells_a_dynamic_threshold_from_a_pinned_one():
    code = ("from explorer.measure.workersetup import mmap_threshold_pinned as m, pin_mmap_threshold as pin; "
            "a = m(); ok = pin(); print(a, ok, m())")
    default = subprocess.run([sys.executable, "-c", code], env=clean_environment(), capture_output=True,
                             text=True, timeout=60)
    assert default.returncode == 0, default.stderr
    assert default.stdout.split() == ["False", "True", "True"]  # dynamic (raised by the probe), then pinned
    pinned = subprocess.run([sys.executable, "-c", code], env=clean_environment(MALLOC_MMAP_THRESHOLD_="131072"),
                            capture_output=True, text=True, timeout=60)
    assert pinned.returncode == 0, pinned.stderr
    assert pinned.stdout.split()[0] == "True"  # glibc read the variable at the process's start


def test_the_plugin_pins_the_threshold_in_a_local_cluster_worker(dynamic_cluster_config):
    with local_cluster(1) as cluster, distributed.Client(cluster) as client:
        (address,) = client.scheduler_info()["workers"]
        assert client.run(mmap_threshold_pinned) == {address: False}
        assert client.run(allocator_pinned) == {address: None}
        assert prepare_workers(client) == {address: True}
        assert client.run(mmap_threshold_pinned) == {address: True}


def test_prepare_workers_is_idempotent_and_reaches_workers_that_join_later(dynamic_cluster_config):
    with local_cluster(1) as cluster, distributed.Client(cluster) as client:
        first = prepare_workers(client)
        assert prepare_workers(client) == first and list(first.values()) == [True]
        names = client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.worker_plugins))
        assert names.count(PLUGIN_NAME) == 1
        cluster.scale(2)
        client.wait_for_workers(2, timeout=60)
        replies = client.run(mmap_threshold_pinned)
        assert len(replies) == 2 and all(replies.values()), replies


@pytest.mark.unit
def test_prepare_workers_refuses_a_bad_threshold():
    with pytest.raises(ValueError, match="threshold must be a positive number of bytes"):
        prepare_workers(None, threshold=0)


@contextlib.contextmanager
def dask_workers(workers: dict, timeout: float = 60.0):
    """A ``dask scheduler`` and one ``dask worker --no-nanny`` process per ``{name: (extra
    arguments, extra environment)}``, in a clean environment (no malloc variable); yields a
    Client; every process is stopped afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="workersetup-"))
    scheduler, worker_procs = None, []
    log = open(folder / "cluster.log", "w")
    try:
        scheduler, address = start_scheduler(folder, log, clean_environment(), timeout)
        for name, (arguments, env) in workers.items():
            worker_procs.append(subprocess.Popen(
                [sys.executable, "-m", "dask", "worker", address, "--name", name, "--no-nanny", "--nthreads", "1",
                 "--no-dashboard", "--local-directory", str(folder), *arguments],
                stdout=log, stderr=subprocess.STDOUT, env=clean_environment(**env)))
        with distributed.Client(address, timeout="20s") as client:
            client.wait_for_workers(len(workers), timeout=timeout)
            yield client
    finally:
        stop_processes(worker_procs, scheduler)
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


def test_dask_worker_preload_and_environment_pin_the_threshold_as_the_docs_say():
    workers = {"plain": ([], {}), "preload": (["--preload", "explorer.measure.workersetup"], {}),
               "environment": ([], {"MALLOC_MMAP_THRESHOLD_": "131072"})}
    with dask_workers(workers) as client:
        names = {address: info["name"] for address, info in client.scheduler_info()["workers"].items()}
        mmapped = {names[a]: v for a, v in client.run(mmap_threshold_pinned).items()}
        pinned_here = {names[a]: v for a, v in client.run(allocator_pinned).items()}
    assert mmapped == {"plain": False, "preload": True, "environment": True}
    assert pinned_here == {"plain": None, "preload": True, "environment": None}


def test_a_run_on_an_existing_cluster_sets_its_workers_up(dynamic_cluster_config, tmp_path):
    path = tmp_path / "in.sgy"
    operators.write_segy(path, operators.synthetic_volume((24, 20, 16), seed=1))
    with local_cluster(1, memory_limit=2**30) as cluster, distributed.Client(cluster) as client:
        assert list(client.run(mmap_threshold_pinned).values()) == [False]
        r = run("gaussian", path, tmp_path / "out.zarr", scheduler=cluster.scheduler_address, chunks=(12, 20, 16),
                refine=False, trials=False)
        assert r.status == "ok", r.error
        assert not any("mmap threshold" in w for w in r.warnings), r.warnings
        assert list(client.run(mmap_threshold_pinned).values()) == [True]
        assert np.isfinite(r.seconds)
