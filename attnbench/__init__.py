"""attnbench: the attention kernels (:mod:`attnbench.kernels`) and the harness that measures
and verifies them.

``from attnbench import kernels`` imports the kernels (the repository's folder ``kernels/``)
wherever attnbench is installed; ``import kernels`` does too where no other package owns that
name (:mod:`attnbench.kernels._name`).  The harness's tree shows its architecture:

- :mod:`attnbench.measure`: how numbers are taken (timer, GPU timing, machine record and
  peaks, FLOPs, the oracle and tolerance, peers, the input generator).
- :mod:`attnbench.sweep`: grids of shapes run over backends (and the agreement table).
- :mod:`attnbench.bench`: the numba kernel side by side with its peers, against targets.
- :mod:`attnbench.studies`: scaling fits, softmax stability, parameter arithmetic.
- :mod:`attnbench.claims`: the claims ledger and its checks.
- :mod:`attnbench.report`: the HTML report, its plots and tables.
- :mod:`attnbench.cli`: the ``attnbench`` command, one module per subcommand (each holds
  its arguments and the handler that runs it); :mod:`attnbench.gpu_check`
  (``scripts/gpu-check.sh``).
"""

from . import _kernels_path

_kernels_path.install()  # a checkout's kernels/ as attnbench.kernels (that module says when)

__version__ = "0.1.0"
