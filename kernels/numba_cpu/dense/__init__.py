"""The dense kernels of the ``numba`` backend: one (B, H, L, D) problem at a time.

- :mod:`.forward`: the tile kernel (GEMMs through BLAS, the online softmax; mod functions
  optional) and its serial and parallel launches;
- :mod:`.tiles`: the tile pieces the forward uses (masks, the two products, a row's
  softmax update);
- :mod:`.mods`: what the kernels take for a ``score_mod`` or ``mask_mod`` (cell classes,
  the backward's mod functions);
- :mod:`.backward`, :mod:`.backward_tiles`: the fused backward kernel and its tiles;
- :mod:`.micro`, :mod:`.micro_mods`: the forward without BLAS, on K/V panels packed once,
  plain and with mod functions.
"""
