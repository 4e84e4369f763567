"""Sweeps: grids of shapes run over backends and peers.

- :mod:`~attnbench.sweep.grid`: the grids (named and from files) and their points.
- :mod:`~attnbench.sweep.runner`: runs points (timing and check), the sweep table.
- :mod:`~attnbench.sweep.calls`: what a point calls (forward or backward), its inputs.
- :mod:`~attnbench.sweep.variants`: the variant axis as :mod:`kernels.mods` arguments.
- :mod:`~attnbench.sweep.run`: runs a sweep (executors, Ctrl-C, GEMM peak probes).
- :mod:`~attnbench.sweep.remeasure`: noisy points timed again with their neighbours in L.
- :mod:`~attnbench.sweep.agreement`: every backend against the reference (``run``'s
  first step).
- :mod:`~attnbench.sweep.files`: saving and loading results (CSV, Parquet, JSON).
- :mod:`~attnbench.sweep.journal`: finished points appended as they finish (``--resume``).
- :mod:`~attnbench.sweep.cluster`: the Dask executor (``--cluster``).
"""
