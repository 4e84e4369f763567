"""The ``numba`` backend: fused masked attention on the CPU, parallel over Numba's threads.

One folder per kind of call, and the pieces every kind shares at the top:

- :mod:`.config`: block sizes and thresholds (what tests patch);
- :mod:`.choose`: which path a forward call takes (micro-kernel or tiles, serial or
  parallel);
- :mod:`.planner`: whether the micro-kernel beats the BLAS tiles on this machine, and its
  register block, timed once and stored;
- :mod:`.dense`: the dense forward and backward kernels (tiles with BLAS, the
  register-blocked micro-kernel, mod functions);
- :mod:`.decode`: few queries against a long, possibly paged, KV cache;
- :mod:`.varlen`: packed batches of sequences of different lengths;
- :mod:`.products`: register-blocked products written as LLVM intrinsics, which the
  micro-kernel and decode use.

The dispatch table (:mod:`kernels._api.dispatch`) names the module of each entry point.
"""
