"""SEG-Y I/O: axis order, chunks, formats, refusal of irregular files, laziness."""

import pickle
from pathlib import Path

import dask
import dask.array as da
import numpy as np
import pytest
import segyio

from operators.segy import (
    SegyGeometryError,
    SegyVolume,
    _slabs,
    mark_written,
    read_segy,
    segy_geometry,
    write_segy,
)

DATA = Path(__file__).parent / "data"
F3 = {
    "int16": DATA / "segyio_f3_int16.sgy",
    "ibm": DATA / "segyio_f3_ibm_float32.sgy",
    "ieee": DATA / "segyio_f3_ieee_float32.sgy",
}
IRREGULAR = {
    "missing traces": (DATA / "xtgeo_ex1_missing_traces_75x71x26_unknownprov.segy", "missing or duplicated"),
    "2D pre-stack": (DATA / "segyio_viking_small_2d_prestack.segy", "offsets"),
}
SHAPE = (7, 5, 50)


def labelled(shape):
    """Every value says where it is: 10000 * inline + 100 * crossline + sample."""
    i, j, k = np.indices(shape)
    return (10000 * i + 100 * j + k).astype(np.float32)


def segyio_cube(path):
    """The file as segyio reads it, shaped (inline, crossline, samples) from its own geometry."""
    with segyio.open(path) as f:
        assert f.sorting == segyio.TraceSortingFormat.INLINE_SORTING
        shape = (len(f.ilines), len(f.xlines), len(f.samples))
        return f.trace.raw[:].reshape(shape), f


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    path = tmp_path_factory.mktemp("segy") / "labelled.sgy"
    write_segy(path, labelled(SHAPE), sample_interval_us=2000, iline_start=101, xline_start=7)
    return path


# --- writing -------------------------------------------------------------------------


def test_segyio_sees_inlines_on_axis_0(written):
    data = labelled(SHAPE)
    with segyio.open(written) as f:
        assert list(f.ilines) == list(range(101, 108))
        assert list(f.xlines) == list(range(7, 12))
        assert len(f.samples) == SHAPE[2]
        assert f.bin[segyio.BinField.Format] == 5
        assert f.bin[segyio.BinField.Interval] == 2000
        assert segyio.tools.dt(f) == 2000
        for i, il in enumerate(f.ilines):
            np.testing.assert_array_equal(f.iline[il], data[i])
        for j, xl in enumerate(f.xlines):
            np.testing.assert_array_equal(f.xline[xl], data[:, j])
        h = f.header[2 * SHAPE[1] + 3]  # inline index 2, crossline index 3
        assert (h[segyio.su.iline], h[segyio.su.xline]) == (103, 10)
        assert (h[segyio.su.cdpx], h[segyio.su.cdpy]) == (3 * 25, 2 * 25)


def segyio_trace_by_trace(path, data, dt, iline_start, xline_start):
    """The file segyio's own writer makes, one trace header and trace at a time: what
    :func:`write_segy` wrote before it filled the traces through a memory map."""
    from operators.segy import BIN_SPACING_M, _spec, _text_header

    nil, nxl, ns = data.shape
    tf = segyio.TraceField
    with segyio.create(path, _spec(data.shape, dt, iline_start, xline_start)) as f:
        f.text[0] = _text_header(data.shape, dt, iline_start, xline_start)
        f.bin.update(hdt=dt, dto=dt)
        for i in range(nil):
            for j in range(nxl):
                t = i * nxl + j
                f.header[t] = {tf.TRACE_SEQUENCE_LINE: j + 1, tf.TRACE_SEQUENCE_FILE: t + 1, tf.CDP: t + 1,
                               tf.INLINE_3D: iline_start + i, tf.CROSSLINE_3D: xline_start + j,
                               tf.SourceGroupScalar: 1, tf.CDP_X: BIN_SPACING_M * j, tf.CDP_Y: BIN_SPACING_M * i,
                               tf.TRACE_SAMPLE_COUNT: ns, tf.TRACE_SAMPLE_INTERVAL: dt}
                f.trace[t] = data[i, j]


@pytest.mark.parametrize("shape, dt, il, xl", [(SHAPE, 2000, 101, 7), ((1, 1, 1), 4000, 1, 1),
                                               ((13, 17, 33), 1000, 5000, 300), ((3, 2, 5), 40000, 1, 1)])
def test_the_file_is_byte_for_byte_segyios_own_trace_by_trace(tmp_path, shape, dt, il, xl):
    data = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    write_segy(tmp_path / "ours.sgy", data, sample_interval_us=dt, iline_start=il, xline_start=xl, slab_bytes=1)
    segyio_trace_by_trace(tmp_path / "segyio.sgy", data, dt, il, xl)
    mark_written(tmp_path / "segyio.sgy")  # this tool's mark in the binary header's unassigned bytes
    assert (tmp_path / "ours.sgy").read_bytes() == (tmp_path / "segyio.sgy").read_bytes()


def test_dask_input_writes_the_same_file_slab_by_slab(written, tmp_path):
    lazy = da.from_array(labelled(SHAPE), chunks=(3, 2, 25))
    path = tmp_path / "from_dask.sgy"
    write_segy(path, lazy, sample_interval_us=2000, iline_start=101, xline_start=7, slab_bytes=1)
    assert path.read_bytes() == Path(written).read_bytes()


@pytest.mark.unit
def test_slabs_follow_chunk_rows_and_the_byte_cap():
    lazy = da.zeros((7, 5, 50), chunks=(3, 5, 50), dtype=np.float32)
    assert list(_slabs(lazy, 7, 2**30)) == [(0, 3), (3, 6), (6, 7)]
    one_inline = 5 * 50 * 4
    assert list(_slabs(lazy, 7, 2 * one_inline)) == [(0, 2), (2, 3), (3, 5), (5, 6), (6, 7)]
    assert list(_slabs(np.zeros((7, 5, 50)), 7, 3 * one_inline)) == [(0, 3), (3, 6), (6, 7)]


@pytest.mark.parametrize("bad", [np.zeros((4, 4)), np.zeros((0, 4, 4)), np.zeros((2, 2, 2, 2))])
def test_write_refuses_non_3d(tmp_path, bad):
    with pytest.raises(ValueError, match="3D"):
        write_segy(tmp_path / "x.sgy", bad)


def test_failed_computation_leaves_no_file(tmp_path):
    def explode(block, block_info=None):
        if block_info[0]["chunk-location"][0] == 1:
            raise RuntimeError("operator failed")
        return block

    lazy = da.zeros(SHAPE, chunks=(3, 5, 50), dtype=np.float32).map_blocks(explode, dtype=np.float32)
    path = tmp_path / "out.sgy"
    with pytest.raises(RuntimeError, match="operator failed"):
        write_segy(path, lazy)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("dt", [0, 70000, 4000.5])
def test_write_refuses_bad_sample_interval(tmp_path, dt):
    with pytest.raises(ValueError, match="sample_interval_us"):
        write_segy(tmp_path / "x.sgy", np.zeros((2, 2, 2)), sample_interval_us=dt)


# --- reading our own files ----------------------------------------------------------


@pytest.mark.parametrize(
    "chunks, expected",
    [
        ((3, 2, 20), ((3, 3, 1), (2, 2, 1), (20, 20, 10))),
        ({0: 1}, ((1,) * 7, (5,), (50,))),
        (-1, ((7,), (5,), (50,))),
        (((2, 5), (1, 4), (50,)), ((2, 5), (1, 4), (50,))),
        ("auto", ((7,), (5,), (50,))),
    ],
)
def test_round_trip_values_axes_and_chunks(written, chunks, expected):
    arr = read_segy(written, chunks=chunks)
    assert arr.shape == SHAPE
    assert arr.dtype == np.float32
    assert arr.chunks == expected
    np.testing.assert_array_equal(arr.compute(), labelled(SHAPE))


def test_auto_chunks_keep_traces_whole_and_split_the_rest(tmp_path):
    path = tmp_path / "wide.sgy"
    write_segy(path, np.zeros((40, 30, 20), dtype=np.float32))
    with dask.config.set({"array.chunk-size": "8KiB"}):
        arr = read_segy(path)
    assert arr.chunks[2] == (20,)
    assert arr.numblocks[0] * arr.numblocks[1] > 1


def test_geometry_of_a_written_file(written):
    g = segy_geometry(written)
    assert g.shape == SHAPE
    assert g.inlines == tuple(range(101, 108))
    assert g.crosslines == tuple(range(7, 12))
    assert g.sample_interval_us == 2000
    assert (g.sample_format, g.dtype, g.sorting) == (5, np.dtype(np.float32), "inline")
    with pytest.raises(AttributeError):
        g.shape = (1, 1, 1)  # frozen


@pytest.mark.parametrize("endian", ["big", "little"])
def test_crossline_sorted_file_keeps_inlines_on_axis_0(tmp_path, endian):
    data = labelled((6, 4, 30))
    spec = segyio.spec()
    spec.ilines, spec.xlines = [10, 11, 12, 13, 14, 15], [20, 22, 24, 26]
    spec.samples, spec.format, spec.endian = np.arange(30) * 4.0, 5, endian
    spec.sorting = segyio.TraceSortingFormat.CROSSLINE_SORTING
    path = tmp_path / "xline_sorted.sgy"
    with segyio.create(path, spec) as f:
        trace = 0
        for j, xl in enumerate(spec.xlines):
            for i, il in enumerate(spec.ilines):
                f.header[trace] = {segyio.su.iline: il, segyio.su.xline: xl}
                f.trace[trace] = data[i, j]
                trace += 1
    g = segy_geometry(path)
    assert (g.sorting, g.endian, g.shape) == ("crossline", endian, (6, 4, 30))
    assert g.inlines == tuple(spec.ilines) and g.crosslines == tuple(spec.xlines)
    np.testing.assert_array_equal(read_segy(path, chunks=(4, 3, 16)).compute(), data)


@pytest.mark.parametrize(
    "key",
    [
        np.s_[1:4, 2:5, 10:20],
        np.s_[::-1, ::2, 49:0:-3],
        np.s_[2],
        np.s_[..., 5],
        np.s_[-1, 3, :],
        np.s_[:, ::-1],
    ],
)
def test_volume_indexing_matches_numpy(written, key):
    volume = SegyVolume(written, segy_geometry(written))
    np.testing.assert_array_equal(volume[key], labelled(SHAPE)[key])


# --- reading real files -------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(F3))
def test_real_f3_crops_match_segyio(kind):
    expected, f = segyio_cube(F3[kind])
    g = segy_geometry(F3[kind])
    assert g.shape == (23, 18, 75)
    assert g.inlines == tuple(int(n) for n in f.ilines)
    assert g.crosslines == tuple(int(n) for n in f.xlines)
    assert g.sample_format == {"int16": 3, "ibm": 1, "ieee": 5}[kind]
    arr = read_segy(F3[kind], chunks=(5, 7, 30))
    assert arr.dtype == (np.int16 if kind == "int16" else np.float32)
    assert arr.shape == expected.shape
    got = arr.compute()
    assert got.dtype == arr.dtype
    np.testing.assert_array_equal(got, expected)


def test_real_ibm_ieee_and_int16_agree():
    ibm, ieee, ints = (read_segy(F3[k]).compute() for k in ("ibm", "ieee", "int16"))
    np.testing.assert_allclose(ibm, ieee, rtol=1e-6, atol=0)
    np.testing.assert_array_equal(ints.astype(np.float32), ieee)  # the crop holds integers


@pytest.mark.parametrize("what", sorted(IRREGULAR))
def test_irregular_files_are_refused_in_one_line(what):
    path, reason = IRREGULAR[what]
    for call in (segy_geometry, read_segy):
        with pytest.raises(SegyGeometryError) as info:
            call(path)
        message = str(info.value)
        assert "\n" not in message
        assert path.name in message
        assert reason in message
        assert isinstance(info.value, ValueError)


def test_a_file_that_is_not_segy_is_refused(tmp_path):
    for content in (b"not a seg-y file", bytes(5000)):
        path = tmp_path / "junk.sgy"
        path.write_bytes(content)
        with pytest.raises(SegyGeometryError) as info:
            read_segy(path)
        assert "\n" not in str(info.value) and "junk.sgy" in str(info.value)


# --- laziness and distribution ------------------------------------------------------


def test_building_reads_no_traces(written, monkeypatch):
    reads = []
    original = SegyVolume._read
    monkeypatch.setattr(SegyVolume, "_read", lambda self, *a: reads.append(a) or original(self, *a))
    arr = read_segy(written, chunks=(3, 2, 25))
    assert reads == []
    graph = dict(arr.__dask_graph__())
    assert len(graph) == arr.npartitions + 1  # one task per chunk, plus the file handle
    arr[:3, :2, :25].compute()
    assert len(reads) == 1
    arr.compute()
    assert len(reads) == 1 + arr.npartitions


def test_graph_holds_no_data():
    arr = read_segy(F3["ieee"], chunks=(12, 9, 75))
    assert len(pickle.dumps(dict(arr.__dask_graph__()))) < 0.05 * arr.nbytes


def test_graph_pickles_and_runs_in_other_processes(written):
    """Plain pickle round trip, then each chunk read in a worker process (as on a cluster)."""
    arr = pickle.loads(pickle.dumps(read_segy(written, chunks=(2, 5, 50))))
    with dask.config.set({"multiprocessing.context": "fork"}):  # spawn would add seconds
        got = arr.compute(scheduler="processes", num_workers=2)
    np.testing.assert_array_equal(got, labelled(SHAPE))


def test_a_window_of_part_of_each_trace_costs_its_reader_the_window_not_the_traces(tmp_path):
    """A task reads its block from the file; what it keeps resident while reading is the block.
    A memory-mapped read put the pages of every whole trace it touched (and the kernel's
    fault-around) in the worker's RSS: a 5 MiB window of long traces raised the high-water
    mark by 33 MiB.  Measured in a fresh process, its high-water mark reset before the read."""
    import subprocess
    import sys

    from operators.segy import write_segy

    path = tmp_path / "long.sgy"
    write_segy(path, np.random.default_rng(0).standard_normal((96, 96, 480)).astype(np.float32))
    script = f"""
import numpy as np
from operators.segy import segy_volume
v = segy_volume({str(path)!r})
def rss(field):
    with open('/proc/self/status') as fh:
        return next(int(l.split()[1]) * 1024 for l in fh if l.startswith(field))
open('/proc/self/clear_refs', 'w').write('5')
before = rss('VmRSS')
x = v[0:96, 0:96, 200:260]
print(x.nbytes, rss('VmHWM') - before)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    block_bytes, growth = map(int, out.stdout.split())
    # the window (2.1 MiB) plus one line of whole traces and the interpreter's own allocations,
    # far below the 96 x 96 x 480 traces (17 MiB) a mapped read touched
    assert growth <= block_bytes + 3 * 2**20, (block_bytes, growth)
