"""The ``cuda`` backend: fused masked attention on an NVIDIA GPU with numba.cuda (or in
Numba's CUDA simulator, ``NUMBA_ENABLE_CUDASIM=1`` before numba is imported).

- :mod:`.launch`: configures and launches the forward kernel: ``run``,
  ``attention_device`` (device arrays in and out), ``prepare_launch``;
- :mod:`.source`: the forward kernel's source and signatures;
- :mod:`.device`: the device functions every CUDA kernel shares;
- :mod:`.mods`: the forward kernel with the mod functions compiled in;
- :mod:`.arrays`: the checks of device arrays;
- :mod:`.backward`: the backward kernels and ``run``.
"""
