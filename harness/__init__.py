"""Helpers shared by the tests and the benchmark scripts (installed with the package, so
both import them normally: ``from harness.cluster import user_cluster``).

Not product code: nothing under ``explorer`` or ``operators`` imports this package.

* :mod:`harness.cluster`: a cluster started as a user starts one (``dask scheduler`` +
  ``dask worker`` processes).
* :mod:`harness.models`: a surrogate fitted from real isolated profiles.
* :mod:`harness.cli`: what a failed ``explore`` command must look like (one line, no traceback).
* :mod:`harness.plugin_ops`: operators that misbehave on purpose
  (``EXPLORER_PLUGINS=harness.plugin_ops``).
* :mod:`harness.heavy_preload`: a worker preload holding memory
  (``dask worker --preload harness.heavy_preload``).
* :mod:`harness.machine`, :mod:`harness.rounds`, :mod:`harness.trials`: the benchmarks'
  machine line, round orders and ratio intervals, and trial notes.
* :mod:`harness.shapes`, :mod:`harness.coverage`: the held-out shapes of ``bench_explore.py``
  and ``calibration.py``, and what a count of covered runs says (Clopper-Pearson, the chance
  a bound passes a coverage test).
* :mod:`harness.report`: a benchmark script's Markdown, printed and written to ``--output``.
* :mod:`harness.plugins`: a benchmark's own operators registered through ``EXPLORER_PLUGINS``.
"""
