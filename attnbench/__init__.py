"""attnbench: the harness that measures and verifies the attention kernels of :mod:`kernels`.

One module per concern:

- :mod:`attnbench.flops`: FLOPs of one attention forward, counting only visible pairs.
- :mod:`attnbench.timing`: the timing core every backend shares (median, IQR) and peak memory.
- :mod:`attnbench.machine`: the machine record (CPU, threads, BLAS, versions) and GEMM peak.
- :mod:`attnbench.accuracy`: the float64 oracle and the baseline-relative tolerance.
- :mod:`attnbench.agreement`: every backend against the reference on a grid of shapes and masks.
- :mod:`attnbench.cli`: the ``attnbench`` command (``python -m attnbench``).
"""

__version__ = "0.1.0"
