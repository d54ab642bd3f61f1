"""Several ``explore`` processes on one store, as users start them: real processes, a real
fresh SQLite file or journal file, real profiles."""

import collections
import json
import subprocess
import sys
from pathlib import Path

import pytest

from explorer.search.store import Store

OPERATOR = "envelope"  # a few ms per profile
BUDGET = 8
REPO = Path(__file__).resolve().parent.parent


def start_explore(runs, storage):
    # a tolerance no model reaches: no process converges early
    args = [sys.executable, "-m", "explorer.cli", OPERATOR, "--budget", str(BUDGET), "--memory-limit", "64MiB",
            "--repeat", "1", "--probes", "0", "--tolerance", "0.000001", "--seed", "0", "--runs-dir", str(runs),
            "--json"] + (["--storage", storage] if storage else [])
    return subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


# Three explore processes contend more than two would, on the default store (each claim races two
# others); the stores' four-way contention is test_store's (its claimers), so two explore
# processes suffice for the journal here.
@pytest.mark.parametrize("kind, n_processes", [("sqlite", 3), ("journal", 2)])
def test_explore_processes_share_a_fresh_store(tmp_path, kind, n_processes):
    storage = f"journal:{tmp_path / 'shared.log'}" if kind == "journal" else None
    procs = [start_explore(tmp_path, storage) for _ in range(n_processes)]
    results = {}
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0 and "Traceback" not in err and "error" not in err, err
        results[proc.pid] = json.loads(out.strip().splitlines()[-1])

    store = Store(tmp_path, storage)
    profiles = store.records(OPERATOR, source="profile")
    shapes = [r.shape for r in profiles]
    assert len(shapes) == len(set(shapes))  # no shape profiled twice
    assert len(profiles) == BUDGET  # claims counted with the profiles: the budget filled, never passed
    assert store.live_claims(OPERATOR, others_only=False) == []
    assert sum(r["new_profiles"] for r in results.values()) == len(profiles)
    for r in results.values():  # each reports the store's count when it finished
        assert r["new_profiles"] <= r["profiles"] <= len(profiles)
        assert r["stopped_because"].startswith("budget of 8 profiles spent")
    # each finished profile is its own claim's trial, written by the process that claimed it
    owners = collections.Counter(int(t.user_attrs["claim_owner"].rpartition(":")[2])
                                 for t in store.study(OPERATOR).get_trials(deepcopy=False)
                                 if t.state.is_finished() and t.user_attrs["status"] == "ok")
    assert owners == collections.Counter({pid: r["new_profiles"] for pid, r in results.items() if r["new_profiles"]})
