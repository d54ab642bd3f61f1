"""Outputs that never clobber a user's data.

A run writes its result under a hidden partial name beside the output
(``.NAME.partial-HOST-PID-XXXXXXXX``, created by this process, so removing it can never remove
anything else) and renames it into place only when complete.  A run killed outright (``kill
-9``) leaves its partial behind: the next run of the same output removes it
(:func:`clean_leftovers`) once its process, on this host, is gone and its content is this
tool's, and says so in its warnings.  An output that exists
already is refused unless ``overwrite`` is given, and even then only an output this
tool wrote is replaced:

* a Zarr output carries the root attribute :data:`ZARR_MARK` (with the operator, the
  input and its survey geometry, so the result can be written to SEG-Y later) with the count
  and digest of the entries it wrote (:func:`record_entries`): ``--overwrite`` replaces it only
  when it holds exactly those (a user's file put inside is never removed);
* a SEG-Y output carries an ownership token in its binary header's unassigned bytes, a
  digest of its own traces (``operators.segy.mark_written``), so a user's file whose headers
  were copied from an output, or an output whose traces changed since, is not this tool's.

Replacing moves the old output aside (``.NAME.replaced-XXXXXXXX``), renames the new one
into place, then removes the old one: at no moment is there neither.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import uuid
from pathlib import Path

#: The root attribute of a Zarr array this tool wrote.
ZARR_MARK = "memory_explorer"

ZARR_SUFFIXES = (".zarr",)
SEGY_SUFFIXES = (".sgy", ".segy")
MDIO_SUFFIXES = (".mdio",)


class OutputError(ValueError):
    """An output path that cannot be used (one line: which path, why, what to do)."""


def output_kind(path) -> str:
    """``"zarr"``, ``"segy"`` or ``"mdio"`` from the output's suffix."""
    lower = os.fspath(path).lower().rstrip("/")
    if lower.endswith(ZARR_SUFFIXES):
        return "zarr"
    if lower.endswith(SEGY_SUFFIXES):
        return "segy"
    if lower.endswith(MDIO_SUFFIXES):
        return "mdio"
    raise OutputError(f"output {os.fspath(path)!r} must end in .zarr, .sgy, .segy or .mdio")


def _zarr_marked(path: Path) -> bool:
    """Whether the Zarr at ``path`` carries :data:`ZARR_MARK` (set when this tool created it)."""
    for name in ("zarr.json", ".zattrs"):  # Zarr v3, v2
        try:
            meta = json.loads((path / name).read_text())
        except (OSError, ValueError):
            continue
        attrs = meta.get("attributes", meta) if name == "zarr.json" else meta
        if isinstance(attrs, dict) and ZARR_MARK in attrs:
            return True
    return False


def _entries(root: Path) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, n), root) for d, dirs, files in os.walk(root) for n in dirs + files)


def _entries_digest(entries: list[str]) -> str:
    import hashlib

    return hashlib.sha256("\n".join(entries).encode()).hexdigest()


def record_entries(root) -> None:
    """Record in the complete Zarr output at ``root`` (before it is put in place) what it holds:
    the count and digest of its entries, in its :data:`ZARR_MARK` attribute (nothing beside
    or inside it that Zarr does not know)."""
    import zarr

    node = zarr.open(str(root), mode="r+")
    entries = _entries(Path(root))
    mark = dict(node.attrs.get(ZARR_MARK) or {})
    mark["entries"] = {"count": len(entries), "sha256": _entries_digest(entries)}
    node.attrs[ZARR_MARK] = mark


def foreign_entries(root) -> list[str]:
    """What the Zarr output ``root`` holds beyond what this tool wrote (:func:`record_entries`):
    none when its entries are those recorded, else the entries Zarr would not have written
    (a file that is not ``zarr.json`` nor a chunk under ``c/``), or all of them."""
    import zarr

    root = Path(root)
    try:
        recorded = dict(zarr.open(str(root), mode="r").attrs.get(ZARR_MARK) or {}).get("entries") or {}
    except Exception:
        recorded = {}
    entries = _entries(root)
    if recorded.get("sha256") == _entries_digest(entries):
        return []

    def zarrs(entry: str) -> bool:
        parts = Path(entry).parts
        return parts[-1] == "zarr.json" or "c" in parts or (root / entry).is_dir()

    return [e for e in entries if not zarrs(e)] or entries


def written_by_explorer(path) -> bool:
    """Whether the output at ``path`` is one this tool wrote (module docstring)."""
    path = Path(path)
    if path.is_symlink():
        return False
    if path.is_dir():
        return _zarr_marked(path)
    from operators.segy import written_by_explorer as segy_written

    return path.is_file() and segy_written(path)


def check_output(output, *, overwrite: bool = False, input_path=None, protected=()) -> str:
    """The output's kind, after refusing what must not be written (raises :class:`OutputError`).

    Refused: a suffix other than .zarr/.sgy/.segy/.mdio; the input itself; an output that
    contains a ``protected`` path (the input, the runs directory with its store: replacing the
    output would remove them) or lies inside the input (a Zarr store); a directory that does not
    exist; an existing output without ``overwrite``; with ``overwrite``, an existing output this
    tool did not write, or one holding entries it did not write.
    """
    kind = output_kind(output)
    out = Path(output)
    if input_path is not None and out.exists() and Path(input_path).exists() \
            and os.path.samefile(out, input_path):
        raise OutputError(f"--output {os.fspath(output)} is the input file: choose another path")
    where = Path(os.path.realpath(out))
    for path in protected:
        other = Path(os.path.realpath(path))
        if where == other or where in other.parents:
            raise OutputError(f"--output {os.fspath(output)} contains {os.fspath(path)}, which a run must not "
                              f"replace: choose a path outside it")
    if input_path is not None and Path(input_path).is_dir() and Path(os.path.realpath(input_path)) in where.parents:
        raise OutputError(f"--output {os.fspath(output)} lies inside the input {os.fspath(input_path)}: choose a "
                          f"path outside it")
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
        foreign = foreign_entries(out) if out.is_dir() else []
        if foreign:
            raise OutputError(f"--output {os.fspath(output)} holds {len(foreign)} entr{'y' if len(foreign) == 1 else 'ies'} "
                              f"memory-explorer did not write ({foreign[0]}{', ...' if len(foreign) > 1 else ''}): "
                              f"it is not replaced; move them out, or choose another path")
    return kind


def variable_name(name: str) -> str:
    """An MDIO dataset variable's name for an operator or branch (``gaussian(sigma=4)`` -> ``gaussian_sigma_4``)."""
    return re.sub(r"\W+", "_", name).strip("_") or "result"


def branch_outputs(output, branches) -> dict:
    """Where a fan-out's branches go: ``{branch: path}``.  A Zarr output is one group
    with an array per branch (``out.zarr/<branch>``); a SEG-Y output is one file per
    branch beside it, ``<stem>-<branch><suffix>`` (each on the input's survey)."""
    out = Path(output)
    if output_kind(output) == "mdio":  # one variable per branch
        return {b: os.fspath(out / variable_name(b)) for b in branches}
    if output_kind(output) == "zarr":
        return {b: os.fspath(out / b) for b in branches}
    return {b: os.fspath(out.with_name(f"{out.stem}-{b}{out.suffix}")) for b in branches}


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", socket.gethostname()) or "host"


def partial_path(output, tag: str = "partial") -> Path:
    """A fresh hidden path beside ``output`` for this process to write into (its host and pid in the name)."""
    out = Path(output)
    return out.parent / f".{out.name}.{tag}-{_host()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def clean_leftovers(output) -> list[str]:
    """Remove what a killed run of ``output`` left beside it; one line each for the warnings.

    A leftover is ``.NAME.partial-HOST-PID-X`` (a partial result) or ``.NAME.replaced-HOST-PID-X``
    (an earlier output moved aside): removed when HOST is this host, PID is no live process and
    the content is this tool's (:func:`written_by_explorer`); an earlier output moved aside is
    put back when the output itself is missing.  Anything else is left as it is."""
    out = Path(output)
    pattern = re.compile(re.escape(f".{out.name}.") + r"(partial|replaced)-(\w+)-(\d+)-[0-9a-f]{8}\Z")
    notes = []
    try:
        names = sorted(os.listdir(out.parent))
    except OSError:
        return notes
    for name in names:
        match = pattern.match(name)
        if not match or match.group(2) != _host() or _alive(int(match.group(3))):
            continue
        path = out.parent / name
        ours = written_by_explorer(path) or (match.group(1) == "partial" and path.is_dir() and not path.is_symlink()
                                             and (_zarr_marked(path) or not any(path.iterdir())))
        if not ours:
            continue
        if match.group(1) == "replaced" and not (out.exists() or out.is_symlink()):
            os.replace(path, out)
            notes.append(f"{out} restored: a run killed while replacing it had moved it aside ({name})")
            continue
        remove_own(path)
        notes.append(f"removed {name} beside {out.name}: a partial output left by a run that was killed "
                     f"(process {match.group(3)})")
    return notes


def remove_own(path) -> None:
    """Remove a path this process created (a partial output): a directory tree or a file."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink(missing_ok=True)


def put_in_place(partial, output, *, overwrite: bool = False) -> None:
    """Rename the complete ``partial`` to ``output``, replacing an old output only as
    :func:`check_output` allows (checked again: the path may have changed meanwhile).  A Zarr
    output records its entries first (:func:`record_entries`)."""
    out = Path(output)
    replacing = out.exists() or out.is_symlink()
    if replacing:
        check_output(out, overwrite=overwrite)
    if Path(partial).is_dir():
        record_entries(partial)
    if replacing:
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
