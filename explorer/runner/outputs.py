"""Outputs that never clobber a user's data.

A run writes its result under a hidden partial name beside the output
(``.NAME.partial-XXXXXXXX``, created by this process, so removing it can never remove
anything else) and renames it into place only when complete.  An output that exists
already is refused unless ``overwrite`` is given, and even then only an output this
tool wrote is replaced:

* a Zarr output carries the root attribute :data:`ZARR_MARK` (with the operator, the
  input and its survey geometry, so the result can be written to SEG-Y later);
* a SEG-Y output carries ``operators.segy.HISTORY_MARK`` in a line of its textual header
  (``operators.segy.written_by_explorer``).

Replacing moves the old output aside (``.NAME.replaced-XXXXXXXX``), renames the new one
into place, then removes the old one: at no moment is there neither.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

#: The root attribute of a Zarr array this tool wrote.
ZARR_MARK = "memory_explorer"

ZARR_SUFFIXES = (".zarr",)
SEGY_SUFFIXES = (".sgy", ".segy")


class OutputError(ValueError):
    """An output path that cannot be used (one line: which path, why, what to do)."""


def output_kind(path) -> str:
    """``"zarr"`` or ``"segy"`` from the output's suffix."""
    lower = os.fspath(path).lower().rstrip("/")
    if lower.endswith(ZARR_SUFFIXES):
        return "zarr"
    if lower.endswith(SEGY_SUFFIXES):
        return "segy"
    raise OutputError(f"output {os.fspath(path)!r} must end in .zarr, .sgy or .segy")


def written_by_explorer(path) -> bool:
    """Whether the output at ``path`` is one this tool wrote (module docstring)."""
    path = Path(path)
    if path.is_symlink():
        return False
    if path.is_dir():
        for name in ("zarr.json", ".zattrs"):  # Zarr v3, v2
            try:
                meta = json.loads((path / name).read_text())
            except (OSError, ValueError):
                continue
            attrs = meta.get("attributes", meta) if name == "zarr.json" else meta
            if isinstance(attrs, dict) and ZARR_MARK in attrs:
                return True
        return False
    from operators.segy import written_by_explorer as segy_written

    return path.is_file() and segy_written(path)


def check_output(output, *, overwrite: bool = False, input_path=None) -> str:
    """The output's kind, after refusing what must not be written (raises :class:`OutputError`).

    Refused: a suffix other than .zarr/.sgy/.segy; the input itself; a directory that does
    not exist; an existing output without ``overwrite``; with ``overwrite``, an existing
    output this tool did not write.
    """
    kind = output_kind(output)
    out = Path(output)
    if input_path is not None and out.exists() and Path(input_path).exists() \
            and os.path.samefile(out, input_path):
        raise OutputError(f"--output {os.fspath(output)} is the input file: choose another path")
    parent = out.resolve().parent if not out.is_symlink() else out.parent
    if not parent.is_dir():
        raise OutputError(f"--output {os.fspath(output)}: directory {parent} does not exist")
    if out.exists() or out.is_symlink():
        if not overwrite:
            raise OutputError(f"--output {os.fspath(output)} exists: pass --overwrite to replace it "
                              f"(only an output memory-explorer wrote is ever replaced)")
        if not written_by_explorer(out):
            raise OutputError(f"--output {os.fspath(output)} exists and was not written by memory-explorer: "
                              f"it is not replaced, even with --overwrite; choose another path")
    return kind


def branch_outputs(output, branches) -> dict:
    """Where a fan-out's branches go: ``{branch: path}``.  A Zarr output is one group
    with an array per branch (``out.zarr/<branch>``); a SEG-Y output is one file per
    branch beside it, ``<stem>-<branch><suffix>`` (each on the input's survey)."""
    out = Path(output)
    if output_kind(output) == "zarr":
        return {b: os.fspath(out / b) for b in branches}
    return {b: os.fspath(out.with_name(f"{out.stem}-{b}{out.suffix}")) for b in branches}


def partial_path(output, tag: str = "partial") -> Path:
    """A fresh hidden path beside ``output`` for this process to write into."""
    out = Path(output)
    return out.parent / f".{out.name}.{tag}-{uuid.uuid4().hex[:8]}"


def remove_own(path) -> None:
    """Remove a path this process created (a partial output): a directory tree or a file."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink(missing_ok=True)


def put_in_place(partial, output, *, overwrite: bool = False) -> None:
    """Rename the complete ``partial`` to ``output``, replacing an old output only as
    :func:`check_output` allows (checked again: the path may have changed meanwhile)."""
    out = Path(output)
    if out.exists() or out.is_symlink():
        check_output(out, overwrite=overwrite)
        aside = partial_path(out, "replaced")
        os.replace(out, aside)
        try:
            os.replace(partial, out)
        except BaseException:
            os.replace(aside, out)
            raise
        remove_own(aside)
    else:
        os.replace(partial, out)
