"""Writing a run's output: the computation stored into its partial output (Zarr or SEG-Y),
its attributes, and the Zarr target a task writes its chunk to.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from explorer.runner.outputs import ZARR_MARK, partial_path, put_in_place, variable_name
from explorer.runner.context import ERROR, FAILED, _RunError, _one_line, _regular

if TYPE_CHECKING:
    from explorer.runner.context import RunContext
    from explorer.runner.monitor import _Interrupt


class ZarrTarget:
    """Where tasks store their blocks: a zarr array by path, opened once per process.

    ``da.store(..., return_stored=True, load_stored=False)`` makes every store task
    return its target, and a persisted run keeps each task's result until the end: with
    the zarr ``Array`` itself as the target, every finished chunk kept its own unpickled
    copy of it (50-140 KB each, measured: 37 MiB per worker for 1,000 chunks).  This
    target pickles as its path, so a finished chunk holds a few bytes.
    """

    _open: dict = {}

    def __init__(self, path, shape, dtype):
        self.path, self.shape, self.dtype = str(path), tuple(shape), np.dtype(dtype)

    def __reduce__(self):
        return (ZarrTarget, (self.path, self.shape, self.dtype.str))

    def __setitem__(self, index, value) -> None:
        if not os.path.isdir(self.path):  # the run was given up and its partial output removed
            return
        array = ZarrTarget._open.get(self.path)
        if array is None:
            import zarr

            array = ZarrTarget._open[self.path] = zarr.open_array(self.path, mode="r+")
        array[index] = value


def _store(ctx: RunContext, partial: Path, interrupt: _Interrupt):
    """Compute the operator into a zarr array at ``partial``.  None when complete, or the
    plan to restart with when the re-planner interrupted.  Raises :class:`_RunError`."""
    import dask.array as da
    import zarr
    from distributed import KilledWorker, as_completed, futures_of

    # Every block is one windowed read of the input: no chunk is kept for a neighbour's halo.
    x = ctx.run_input.source()
    if ctx.result.strategy == "staged":
        y = ctx.operator.dask(x, strategy="staged", chunks=ctx.chunk)
    else:
        y = ctx.operator.dask(x, wrap=ctx.observer.wrap if ctx.observer is not None else None, chunks=ctx.chunk)
    arrays = y if isinstance(y, dict) else {None: y}  # a fan-out: one array per branch
    for name, a in arrays.items():
        if not _regular(a.chunks):  # zarr chunks must not be shared by two tasks
            arrays[name] = a.rechunk(tuple(c[0] for c in a.chunks))
    first = next(iter(arrays.values()))
    ctx.result.n_tasks = int(np.prod(first.numblocks))
    attributes = _output_attributes(ctx)
    targets = []
    if ctx.kind == "mdio":
        targets = _mdio_targets(ctx, partial, arrays, attributes)
    elif None in arrays:
        target = zarr.create_array(store=str(partial), shape=first.shape, chunks=tuple(c[0] for c in first.chunks),
                                   dtype=first.dtype)
        target.attrs[ZARR_MARK] = attributes
        targets.append(ZarrTarget(partial, first.shape, first.dtype))
    else:
        group = zarr.create_group(store=str(partial))
        group.attrs[ZARR_MARK] = {**attributes, "branches": list(arrays)}
        for name, a in arrays.items():
            array = group.create_array(name, shape=a.shape, chunks=tuple(c[0] for c in a.chunks), dtype=a.dtype)
            array.attrs[ZARR_MARK] = {**attributes, "branch": name}
            targets.append(ZarrTarget(partial / name, a.shape, a.dtype))
    stored = da.store(list(arrays.values()), targets, lock=False, compute=False, return_stored=True,
                      load_stored=False)

    started = time.perf_counter()
    persisted = ctx.client.persist(stored)
    futures = futures_of(persisted)
    ctx.done, ctx.total = 0, len(futures)
    interrupt.arm(ctx.client, futures)
    if ctx.progress is not None:
        ctx.progress(0, ctx.total)
    try:
        # A finished block is in the output already: its future is released at once, so the
        # scheduler and the workers forget its lineage (a persisted result keeps the
        # TaskState and spec of every task it came from, about 5 KB per graph task on each
        # worker: 37 MiB per worker for 1,000 chunks of gaussian, measured).
        for future in as_completed(futures):
            if future.status == "finished":
                future.release()
                ctx.done += 1
                if ctx.progress is not None:
                    ctx.progress(ctx.done, ctx.total)
                continue
            if interrupt.reason == "replan":
                return interrupt.plan
            if interrupt.reason == "stall":
                raise _RunError(FAILED, interrupt.message)
            exc = future.exception() if future.status == "error" else None
            if isinstance(exc, KilledWorker):
                line = " ".join(str(exc).split())
                raise _RunError(FAILED, f"workers died while running a task ({line[:200]})")
            raise _RunError(ERROR, _one_line(exc) if exc is not None else f"a task was {future.status}")
        return None
    finally:
        interrupt.disarm()
        ctx.result.seconds = (ctx.result.seconds or 0.0) + time.perf_counter() - started
        unfinished = [f for f in futures if f.status != "finished"]
        if unfinished:
            ctx.client.cancel(unfinished)
        del persisted, futures, unfinished


def _mdio_targets(ctx: RunContext, partial: Path, arrays: dict, attributes: dict) -> list:
    """An MDIO output in the making: the input dataset copied without its volume variable (its
    coordinates, headers and trace mask byte for byte), the result as one variable per output
    (named after the operator, or each branch) on the input variable's dims, coordinates and
    fill value.  The targets the tasks store into."""
    import shutil

    import zarr

    source = ctx.run_input
    shutil.copytree(source.path, partial, ignore=lambda folder, names: (
        [source.array_path] if os.path.samefile(folder, source.path) else []))
    group = zarr.open_group(str(partial), mode="r+")
    original = zarr.open_array(source.path, mode="r", path=source.array_path)
    carried = {k: v for k, v in dict(original.attrs).items() if k in ("coordinates", "_FillValue", "long_name")}
    targets, names = [], {}
    for branch, a in arrays.items():
        name = variable_name(branch or ctx.operator.name)
        names[branch] = name
        group.create_array(name, shape=a.shape, chunks=tuple(c[0] for c in a.chunks), dtype=a.dtype,
                           fill_value=np.nan, dimension_names=source.dims, attributes=carried, overwrite=True)
        targets.append(ZarrTarget(partial / name, a.shape, a.dtype))
    meta = dict(group.attrs.get("attributes") or {})
    meta["defaultVariableName"] = names[next(iter(arrays))]
    group.attrs.update({"attributes": meta, ZARR_MARK: {**attributes, "variables": list(names.values())}})
    return targets


def _output_attributes(ctx: RunContext) -> dict:
    """What a Zarr output records of its making, and the input's survey geometry (so that
    ``operators.write_segy_like(path, array, like=attrs["input"])`` puts it back on it), or a
    Zarr input's attributes and coordinates."""
    from explorer import __version__

    made = {"writer": f"memory-explorer {__version__}", "operator": ctx.operator.name,
            "input": os.path.abspath(ctx.run_input.path)}
    g = ctx.geometry
    if g is None:  # a Zarr input: its attributes and coordinates (explorer.runner.inputs)
        return {**made, **ctx.run_input.attributes}
    return {**made, "geometry": {"inlines": list(g.inlines), "crosslines": list(g.crosslines),
                                 "sample_interval_us": g.sample_interval_us, "first_sample_ms": g.first_sample_ms,
                                 "sorting": g.sorting, "input_sample_format": g.sample_format}}


def _write_output(ctx: RunContext, partial: Path) -> None:
    """Put the complete result in place: the Zarr itself (a group of one array per branch for
    a fan-out), or a SEG-Y on the input's survey (one per branch, ``result.outputs``)."""
    if ctx.kind == "segy":
        import zarr

        from operators import write_segy_like

        started = time.perf_counter()
        pieces = ({ctx.output: (partial, ctx.operator.name)} if not ctx.result.outputs else
                  {path: (partial / branch, f"{branch} of {ctx.operator.name}")
                   for branch, path in ctx.result.outputs.items()})
        written = []
        for path, (array_path, what) in pieces.items():
            segy = partial_path(path)
            ctx.partials.append(segy)
            kept_history = write_segy_like(segy, zarr.open_array(str(array_path), mode="r"), like=ctx.input,
                                           history=f"{what} of {os.path.basename(ctx.input)}")
            if not kept_history and not written:
                ctx.result.warnings.append(f"{os.path.basename(ctx.input)}'s textual header has no blank line: "
                                           f"every line of it is kept, and the output has no history line")
            written.append((segy, path))
        for segy, path in written:  # all written before any is put in place
            put_in_place(segy, path, overwrite=ctx.overwrite)
        ctx.result.seconds += time.perf_counter() - started
    else:
        put_in_place(partial, ctx.output, overwrite=ctx.overwrite)
