"""attnbench: the harness that measures and verifies the attention kernels of :mod:`kernels`.

The tree shows the architecture:

- :mod:`attnbench.measure`: how numbers are taken (timer, GPU timing, machine record and
  peaks, FLOPs, the oracle and tolerance, peers, the input generator).
- :mod:`attnbench.sweep`: grids of shapes run over backends (and the agreement table).
- :mod:`attnbench.bench`: the numba kernel side by side with its peers, against targets.
- :mod:`attnbench.studies`: scaling fits, softmax stability, parameter arithmetic.
- :mod:`attnbench.claims`: the claims ledger and its checks.
- :mod:`attnbench.report`: the HTML report, its plots and tables.
- :mod:`attnbench.cli` (the ``attnbench`` command), :mod:`attnbench.job` (``run`` and
  ``sweep``), :mod:`attnbench.gpu_check` (``scripts/gpu-check.sh``).
"""

__version__ = "0.1.0"
