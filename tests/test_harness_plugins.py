"""``harness.plugins.use_plugin``: a benchmark's operators reach this process and its children once."""

import os
import sys

from harness.plugins import use_plugin


def test_use_plugin_adds_the_module_and_its_directory_once(monkeypatch, tmp_path):
    monkeypatch.setenv("EXPLORER_PLUGINS", "mine")
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.setattr(sys, "path", list(sys.path))
    for _ in range(2):
        use_plugin("theirs", tmp_path)
    assert os.environ["EXPLORER_PLUGINS"] == "mine,theirs"
    assert os.environ["PYTHONPATH"].split(os.pathsep) == [str(tmp_path), "/elsewhere"]
    assert sys.path.count(str(tmp_path)) == 1
