"""explorer.core's file helpers: the atomic writer and the bounded mtime cache."""

import os

import pytest

from explorer.core.atomic import atomic_path, atomic_write_text
from explorer.core.file_cache import MtimeCache


def test_atomic_write_replaces_the_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "sub" / "calibration.json"
    atomic_write_text(path, "old")
    atomic_write_text(path, "new")
    assert path.read_text() == "new"
    assert sorted(p.name for p in path.parent.iterdir()) == ["calibration.json"]


def test_a_failure_mid_write_leaves_the_old_file_intact(tmp_path):
    path = tmp_path / "model.npz"
    path.write_text("old contents")
    with pytest.raises(RuntimeError, match="disk full"):
        with atomic_path(path) as tmp:
            assert tmp.parent == path.parent and tmp.suffix == ".npz"
            with open(tmp, "w") as f:
                f.write("half of the new")
            raise RuntimeError("disk full")
    assert path.read_text() == "old contents"
    assert [p.name for p in tmp_path.iterdir()] == ["model.npz"]


def _bump_mtime(path, text):
    before = path.stat().st_mtime_ns
    path.write_text(text)
    os.utime(path, ns=(before + 10**9, before + 10**9))  # a later mtime whatever the clock's resolution


def test_mtime_cache_loads_once_and_again_when_the_file_changes(tmp_path):
    path = tmp_path / "a.json"
    path.write_text("1")
    loads = []

    def load(p):
        loads.append(p.read_text())
        return p.read_text()

    cache = MtimeCache(maxsize=4)
    assert cache.get(path, load) == "1"
    assert cache.get(path, load) == "1"
    assert loads == ["1"]
    _bump_mtime(path, "2")
    assert cache.get(path, load) == "2"
    assert loads == ["1", "2"]
    assert len(cache) == 1  # the rewritten file replaced its entry
    path.unlink()
    with pytest.raises(FileNotFoundError):
        cache.get(path, load)


def test_mtime_cache_evicts_the_least_recently_used_and_does_not_cache_none(tmp_path):
    paths = [tmp_path / f"{i}.json" for i in range(4)]
    for p in paths:
        p.write_text(p.stem)
    loads = []

    def load(p):
        loads.append(p.stem)
        return p.stem

    cache = MtimeCache(maxsize=2)
    cache.get(paths[0], load)
    cache.get(paths[1], load)
    cache.get(paths[0], load)  # 0 used last: 1 goes first
    cache.get(paths[2], load)
    assert len(cache) == 2
    cache.get(paths[0], load)
    cache.get(paths[1], load)
    assert loads == ["0", "1", "2", "1"]
    assert cache.get(paths[3], lambda p: None) is None
    assert cache.get(paths[3], lambda p: None) is None
    assert len(cache) == 2


@pytest.mark.parametrize("name", ["../escape", "a/b", "..", ".", ".hidden", "", "nul\0byte"])
def test_no_operator_name_leads_a_path_outside_the_runs_directory(tmp_path, name):
    from explorer.core import paths

    with pytest.raises(ValueError, match="cannot name a directory inside the runs directory"):
        paths.model_path(name, tmp_path)
    assert paths.model_path("gaussian(sigma=4),gst3d", tmp_path).parent.parent == tmp_path
