"""``attnbench bench``: the numba kernel side by side with its peers, against targets.

- :mod:`~attnbench.bench.run`: the sections, the targets and the outputs.
- :mod:`~attnbench.bench.gemm_floor`: the kernel's tile GEMMs alone (the floor under it).
"""
