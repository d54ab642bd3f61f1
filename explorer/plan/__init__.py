"""plan: pure functions of numbers.  A worker's footprint (one formula, named terms), one time
model, candidate chunks, the planner and its staged form, what a task costs inside a worker
(excess, timing, the calibration and the task model), and ``recommend_chunks``.

Like rechunker's ``algorithm.py``, the planning core is pure: shapes, bytes and a predictor in,
a ``ChunkPlan`` out; no processes, files or Dask clusters (``recommend_chunks`` reads the saved
files, and measures an idle worker through ``explorer.measure`` when no baseline is given)."""
