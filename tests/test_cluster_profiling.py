"""Exploration on a user's cluster: each profile an isolated child of a worker of a real
``dask scheduler`` + ``dask worker`` cluster (``explorer.measure.worker_profiling``)."""

import os
import signal

import numpy as np
import psutil
import scipy.ndimage

import explorer
import operators
from explorer.search.store import Store
from harness.cluster import user_cluster

#: The operator's run (counted per worker) at which it kills the worker that runs it: a profile
#: is two repeats, each a warm-up run and the measured one, so the 5th starts a worker's second profile.
KILL_AT_RUN = 5


def smooth_then_kill_a_worker(block):
    """A 3x3x3 mean whose ``KILL_AT_RUN``-th run in a worker (counted in ``$TEST_CALLS_DIR``)
    SIGKILLs the first worker to get there (the grandparent of the child its profiling server
    forked), as a machine lost mid-profile would be."""
    calls = os.environ["TEST_CALLS_DIR"]
    server, worker, nanny = psutil.Process().parents()[:3]
    n = 1
    while True:
        try:
            os.close(os.open(os.path.join(calls, f"{worker.pid}-{n}"), os.O_CREAT | os.O_EXCL))
            break
        except FileExistsError:
            n += 1
    if n == KILL_AT_RUN:
        try:
            os.close(os.open(os.path.join(calls, "killed"), os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return scipy.ndimage.uniform_filter(block, size=3)  # one worker only
        open(os.path.join(calls, "killed"), "w").write(" ".join(nanny.cmdline()))
        os.kill(worker.pid, signal.SIGKILL)
    return scipy.ndimage.uniform_filter(block, size=3)


def test_explore_profiles_on_the_clusters_workers_and_a_worker_lost_costs_one_profile(tmp_path):
    calls = tmp_path / "calls"
    calls.mkdir()
    env = {"TEST_CALLS_DIR": str(calls)}
    os.environ.update(env)  # the profiling servers the workers start inherit the workers' environment
    op = operators.from_function(smooth_then_kill_a_worker, name="test_killer_mean", halo=(1, 1, 1),
                                 axis_classes=(0, 0, 0))
    runs = tmp_path / "runs"
    with user_cluster(workers=2, memory_limit="1GiB", env=env) as address:
        from distributed import Client

        with Client(address) as client:
            workers = set(client.scheduler_info(n_workers=-1)["workers"])
            result = explorer.explore(op, budget=6, runs_dir=runs, probes=0, client=client)
            # the workers' profiling servers were stopped at the end (they hold memory a run needs)
            children = client.run(lambda: [" ".join(c.cmdline()) for c in psutil.Process().children()])
            # paid once: on its store, in the workers' environment, the saved model is the answer
            again = explorer.explore(op, budget=6, runs_dir=runs, probes=0, client=client)
    assert again.reused and again.new_profiles == 0
    assert (calls / "killed").exists(), "the operator never reached its kill"
    assert not any("forkserver" in c for cs in children.values() for c in cs), children
    assert "dask worker" in (calls / "killed").read_text()  # a worker its nanny (`dask worker`) spawned died

    # Both workers profiled, at once (jobs default to the workers); the JSON says where.
    assert result.to_dict()["profiled_on"] == sorted(workers)
    lost = [s for s in result.steps if s.status.startswith("lost")]
    assert len(lost) == 1 and lost[0].profiled_on in workers, [s.status for s in result.steps]
    # The loop went on with the worker left: the budget was spent and a model saved.
    assert result.model_path and result.profiles == 6
    # The chunks will be sized for the cluster's workers, not this machine.
    assert result.memory_limit_bytes == 2**30
    records = Store(runs).records(op.name)
    assert len(records) == 6 and all(r.status == "ok" for r in records)
    assert {r.context["profiled_on"] for r in records} == workers
    survivor = [s.profiled_on for s in result.steps if not s.status.startswith("lost")]
    assert survivor[-1] != lost[0].profiled_on  # after the loss, only the other worker profiled
    model = explorer.load_model(op, runs_dir=runs)
    assert model.environment["operator_code"].endswith(":" + op.version)
    mean, upper = model.predict_many(np.array([[60, 60, 60]]))
    assert 0 < mean[0] < upper[0]


def test_why_a_worker_cannot_find_an_operator_is_one_line():
    """What `cluster_profilers` raises, per worker, before any profile (checked on every worker)."""
    from explorer.measure.worker_profiling import _operator_error_here

    assert _operator_error_here("envelope") is None
    why = _operator_error_here("no_such_operator_here")
    assert why.startswith("KeyError") and "no_such_operator_here" in why
