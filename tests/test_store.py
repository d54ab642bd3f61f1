"""The store on real SQLite files and a real journal file."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from explorer.measure.profiling import Measurement
from explorer.search.store import SOURCE_PRODUCTION, Store, study_name


def measurement(shape, peak, status="ok", repeats=(1.0, 1.0)):
    return Measurement(
        operator="envelope", shape=shape, peak_bytes=peak, input_bytes=4 * shape[0] * shape[1] * shape[2],
        output_bytes=None if status != "ok" else 4, process_peak_bytes=peak, seconds=0.5, status=status,
        repeats=[{"peak_bytes": r * peak, "seconds": 0.5} for r in repeats] if peak else [],
        error=None if status == "ok" else "why",
    )


def test_records_round_trip_with_every_status(tmp_path):
    store = Store(tmp_path)
    store.add_measurement(measurement((10, 20, 30), 1000.0))
    store.add_measurement(measurement((40, 40, 40), 5000.0, status="exceeded", repeats=(1.0,)))
    store.add_measurement(measurement((50, 50, 50), None, status="timeout"))
    store.add_observation("envelope", (12, 12, 64), 777.0, context={"threads_per_worker": 1})

    again = Store(tmp_path).records("envelope")  # a new connection reads what was written
    by_shape = {r.shape: r for r in again}
    assert by_shape[(10, 20, 30)].status == "ok" and by_shape[(10, 20, 30)].peak_bytes == 1000.0
    assert by_shape[(10, 20, 30)].repeats == [1000.0, 1000.0]
    assert by_shape[(40, 40, 40)].status == "exceeded" and by_shape[(40, 40, 40)].peak_bytes == 5000.0
    assert by_shape[(50, 50, 50)].status == "timeout" and by_shape[(50, 50, 50)].peak_bytes is None
    production = by_shape[(12, 12, 64)]
    assert production.source == SOURCE_PRODUCTION and production.context == {"threads_per_worker": 1}
    assert [r.shape for r in Store(tmp_path).records("envelope", source=SOURCE_PRODUCTION)] == [(12, 12, 64)]
    assert (tmp_path / "studies.sqlite3").exists()


def test_studies_are_per_operator_and_dtype(tmp_path):
    store = Store(tmp_path)
    store.add_measurement(measurement((10, 20, 30), 1000.0))
    assert store.records("gst3d") == []
    assert store.records("envelope", dtype="float64") == []
    assert study_name("envelope", "float32") != study_name("envelope", "float64")
    assert "numpy-" in study_name("envelope")


def test_journal_storage_url(tmp_path):
    url = f"journal:{tmp_path / 'shared' / 'studies.log'}"
    Store(storage=url).add_measurement(measurement((10, 20, 30), 1000.0))
    assert [r.peak_bytes for r in Store(storage=url).records("envelope")] == [1000.0]


WRITER = """
import sys, time
from explorer.search.store import Store
store = Store(sys.argv[1])
for i in range(1, 100000):
    store.add_observation("envelope", (i, 2, 3), float(i), source="profile")
    print(i, flush=True)
"""


def test_sigkill_mid_write_loses_nothing_finished_and_leaves_nothing_half_written(tmp_path):
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    acknowledged = 0
    while acknowledged < 15:  # a writer that died ends this with a ValueError on its empty line
        acknowledged = int(writer.stdout.readline())
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait()
    records = Store(tmp_path).records("envelope")
    assert len(records) >= acknowledged  # every acknowledged write is there
    numbers = sorted(r.shape[0] for r in records)
    assert numbers == list(range(1, len(numbers) + 1))  # no gaps
    for r in records:  # and each is whole: params, value and attributes together
        assert r.peak_bytes == float(r.shape[0]) and r.status == "ok" and r.repeats == [r.peak_bytes]


# --------------------------------------------------------------------------- claims

from explorer.search.store import (BUDGET_SPENT, DUPLICATE_CLAIM, OVER_BUDGET, TAKEN, Entry, StorageError, claim_verdict,
                                   is_live_claim, store_problem)


def test_a_claim_is_no_record_until_finished_and_the_profile_replaces_it(tmp_path):
    store = Store(tmp_path)
    claim = store.claim("envelope", (10, 20, 30), budget=5, seconds=600)
    assert claim.held and claim.owner == f"{store.owner.host}:{os.getpid()}"
    assert store.records("envelope") == [] and store.profiles_and_claims("envelope") == 1
    assert [c.shape for c in store.live_claims("envelope", others_only=False)] == [(10, 20, 30)]
    assert store.live_claims("envelope") == []  # ours: not another process's
    assert store.claim("envelope", (10, 20, 30), budget=5, seconds=600).refused == TAKEN

    store.finish(claim, measurement((10, 20, 30), 1000.0))
    again = Store(tmp_path)
    [record] = again.records("envelope")
    assert record.shape == (10, 20, 30) and record.status == "ok" and record.peak_bytes == 1000.0
    assert record.number == claim.number  # the claim's own trial: one trial per profile
    assert len(again.study("envelope").get_trials()) == 1
    assert again.live_claims("envelope", others_only=False) == [] and again.profiles_and_claims("envelope") == 1


def test_a_released_claim_counts_nowhere_and_the_budget_counts_claims(tmp_path):
    store = Store(tmp_path)
    released = store.claim("envelope", (8, 8, 8), budget=2, seconds=600)
    store.release(released)
    assert not released.held and store.profiles_and_claims("envelope") == 0 and store.records("envelope") == []
    first = store.claim("envelope", (8, 8, 8), budget=2, seconds=600)
    second = store.claim("envelope", (9, 9, 9), budget=2, seconds=600)
    assert first.held and second.held
    assert store.claim("envelope", (10, 10, 10), budget=2, seconds=600).refused == BUDGET_SPENT
    store.finish(first, measurement((8, 8, 8), None, status="timeout"))  # any status counts
    assert store.claim("envelope", (10, 10, 10), budget=2, seconds=600).refused == BUDGET_SPENT
    assert store.claim("envelope", (10, 10, 10), budget=3, seconds=600).held


@pytest.mark.unit
def test_claim_verdict_earlier_entries_win():
    entries = [Entry(0, (1, 1, 1), claim=False), Entry(1, (2, 2, 2), claim=True), Entry(5, (3, 3, 3), claim=True)]
    assert claim_verdict(entries, Entry(3, (4, 4, 4), claim=True), budget=3) is None
    assert claim_verdict(entries, Entry(3, (2, 2, 2), claim=True), budget=9) == DUPLICATE_CLAIM
    assert claim_verdict(entries, Entry(0, (3, 3, 3), claim=True), budget=9) is None  # the later one gives up
    assert claim_verdict(entries, Entry(3, (4, 4, 4), claim=True), budget=2) == OVER_BUDGET
    assert claim_verdict(entries, Entry(9, (4, 4, 4), claim=True), budget=3) == OVER_BUDGET


@pytest.mark.unit
def test_claims_end_at_expiry_or_with_their_process():
    attrs = {"source": "profile", "claim_owner": "here:123", "claim_process_started": 1.0, "claim_expires": 100.0}

    def alive(pid, started):
        return pid == 123 and started == 1.0

    assert is_live_claim(attrs, True, 50.0, "here", alive)
    assert not is_live_claim(attrs, False, 50.0, "here", alive)  # finished
    assert not is_live_claim(attrs, True, 100.0, "here", alive)  # expired
    assert not is_live_claim({**attrs, "claim_process_started": 2.0}, True, 50.0, "here", alive)  # pid reused
    assert is_live_claim({**attrs, "claim_owner": "elsewhere:9"}, True, 50.0, "here", alive)  # cannot tell: expiry
    assert not is_live_claim({"source": "profile"}, True, 50.0, "here", alive)  # no claim attributes


def test_the_claim_of_a_process_that_died_blocks_nothing(tmp_path):
    code = ("import sys; from explorer.search.store import Store; "
            "assert Store(sys.argv[1]).claim('envelope', (5, 6, 7), budget=1, seconds=3600).held")
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, timeout=120)
    store = Store(tmp_path)
    assert store.live_claims("envelope") == [] and store.profiles_and_claims("envelope") == 0
    assert store.claim("envelope", (5, 6, 7), budget=1, seconds=600).held


CLAIMER = """
import json, sys
from explorer.search.store import Store
store = Store(sys.argv[1], sys.argv[2] if sys.argv[2] != "-" else None)
held = [list(s) for s in [(i, 2, 3) for i in range(1, 9)]
        if store.claim("envelope", s, budget=int(sys.argv[3]), seconds=600).held]
print(json.dumps(held), flush=True)
sys.stdin.read()  # hold the claims (alive) until every claimer is done
"""


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_concurrent_claimers_on_a_fresh_store_never_share_a_shape_or_pass_the_budget(tmp_path, kind):
    """Four processes open one fresh store at once and claim the same eight shapes in the same order."""
    storage = f"journal:{tmp_path / 'j.log'}" if kind == "journal" else "-"
    procs = [subprocess.Popen([sys.executable, "-c", CLAIMER, str(tmp_path), storage, "6"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    held = []
    for proc in procs:
        line = proc.stdout.readline()
        assert line, proc.communicate()[1]
        held += [tuple(s) for s in json.loads(line)]
    for proc in procs:
        _, err = proc.communicate("")
        assert proc.returncode == 0 and "Traceback" not in err, err
    assert len(held) == len(set(held)) == 6  # every shape claimed once, the budget filled exactly


def test_bad_storage_urls_are_one_line_naming_the_url_and_the_accepted_forms(tmp_path):
    for url in ("nosuch", "/some/file.db", "nosuchdb://host/x", "journal:", "postgresql://me:secret@localhost:1/x"):
        with pytest.raises(StorageError) as info:
            Store(tmp_path, url)
        message = str(info.value)
        assert len(message.splitlines()) == 1 and "sqlite:///PATH" in message and "journal:PATH" in message
        assert (url if "secret" not in url else "postgresql://me:***@localhost:1/x") in message


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///", "sqlite:///:memory:"])
def test_an_in_memory_store_is_refused_it_would_lose_every_profile_at_exit(tmp_path, url):
    with pytest.raises(StorageError, match="in-memory SQLite store would lose every measurement"):
        Store(tmp_path, url)


def test_a_broken_store_file_is_said_for_what_it_is_not_as_a_url_the_user_never_typed(tmp_path):
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "studies.sqlite3").write_text("not a database")
    with pytest.raises(StorageError) as info:
        Store(corrupt)
    message = str(info.value)
    assert "is not a readable SQLite database" in message and "sqlite:///PATH" not in message
    assert (corrupt / "studies.sqlite3").read_text() == "not a database"  # the user's file untouched
    unwritable = tmp_path / "unwritable"
    (unwritable / "studies.sqlite3").mkdir(parents=True)  # where the store's file should be: a directory
    with pytest.raises(StorageError, match="cannot be written") as info:
        Store(unwritable)
    assert "sqlite:///PATH" not in str(info.value)


@pytest.mark.unit
def test_sqlites_own_words_name_the_stores_problem():
    local = Path("/data/runs/studies.sqlite3")
    url = f"sqlite:///{local}"
    assert "is locked by another process" in str(store_problem(url, local, "(sqlite3.OperationalError) database is locked"))
    assert "cannot be written" in str(store_problem(url, local, "attempt to write a readonly database"))
    assert "not a readable SQLite" in str(store_problem(url, local, "database disk image is malformed"))
    other = str(store_problem(url, local, "some driver error"))
    assert "some driver error" in other and "sqlite:///PATH" in other  # nothing recognised: the URL forms
