"""The Numba toolbox shared by the lowering of :mod:`kernels.mods` and the CPU kernels; no
kernel lives here.

- :mod:`.cache`: Numba's disk cache stamped with every package module a kernel imports;
- :mod:`.math`: the vectorisable exp, the row-max keys, float constants, the fastmath sets;
- :mod:`.launch`: the threading-layer guard and the single-threaded BLAS of parallel launches;
- :mod:`.half`: half-precision loads widened in registers, stores rounded.
"""
