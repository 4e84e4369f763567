"""The ``numba`` backend's packed batches (:func:`kernels.attention_varlen`).

- :mod:`.blocks`: the forward and backward, the dense kernels' block functions run on
  per-sequence views;
- :mod:`.micro`: plain packed calls on the micro-kernel's query blocks, where the planner
  chose the micro-kernel.
"""
