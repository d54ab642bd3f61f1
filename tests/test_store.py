"""The store on real SQLite files and a real journal file."""

import os
import signal
import subprocess
import sys
import time


from explorer.profiling import Measurement
from explorer.store import SOURCE_PRODUCTION, Store, study_name


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
from explorer.store import Store
store = Store(sys.argv[1])
for i in range(1, 100000):
    store.add_observation("envelope", (i, 2, 3), float(i), source="profile")
    print(i, flush=True)
"""


def test_sigkill_mid_write_loses_nothing_finished_and_leaves_nothing_half_written(tmp_path):
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    acknowledged = 0
    deadline = time.monotonic() + 60
    while acknowledged < 15 and time.monotonic() < deadline:
        acknowledged = int(writer.stdout.readline())
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait()
    records = Store(tmp_path).records("envelope")
    assert len(records) >= acknowledged  # every acknowledged write is there
    numbers = sorted(r.shape[0] for r in records)
    assert numbers == list(range(1, len(numbers) + 1))  # no gaps
    for r in records:  # and each is whole: params, value and attributes together
        assert r.peak_bytes == float(r.shape[0]) and r.status == "ok" and r.repeats == [r.peak_bytes]
